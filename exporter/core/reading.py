"""What one evaluation reads of a series' window, and the judgements made of it.

`read_window` turns a series' points (oldest first) into a `WindowReading`: the
counters' increases and rates, the latency against the budget, the saturation state
after this evaluation, the batch the diagnosis judges, the diagnosis and the limits,
the advice and the SLO. Each signal of the catalog (`exporter.core.catalog`) is a pure
function of a reading; the formulas live in `exporter.core.signals` and the modules
beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from batchscope.exporter.core.advice import AdviceInputs
from batchscope.exporter.core.advise import advise
from batchscope.exporter.core.capacity import KvScrape, cost_per_batch
from batchscope.exporter.core.catalog import SERIES
from batchscope.exporter.core.demand import fires_batches
from batchscope.exporter.core.diagnosis import (
    Diagnosis,
    DiagnosisInputs,
    diagnose,
    mean_latency_note,
    progress_stopped,
    rejections_note,
)
from batchscope.exporter.core.histogram import Histogram, histogram_increase, histogram_quantile
from batchscope.exporter.core.limits import LimitInputs, Limits, limits
from batchscope.exporter.core.signals import (
    SaturationState,
    SignalSettings,
    budget_utilization,
    counter_increase,
    padding_waste,
    per_second,
    saturated_seconds,
    saturation_through_gap,
    step_saturation,
)
from batchscope.exporter.core.slo import (
    Attainment,
    Bounded,
    SloHistory,
    SloStatus,
    measure_attainment,
    slo_status,
)
from batchscope.exporter.core.snapshot import (
    COUNTERS,
    SeriesSnapshot,
    effective_cap,
    latency_histogram,
)
from batchscope.exporter.core.static_util import UtilizationEstimate, estimate_from_histogram

# Scrapes whose peak running batch the diagnosis reads.
RECENT_SCRAPES = 3


def _mean(hist: Histogram | None) -> float | None:
    return hist.sum / hist.count if hist is not None and hist.count > 0 else None


def trigger_shares(counts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A batcher's batches fired by each trigger over a window of scrapes (each scrape's
    cumulative counts by trigger), as shares of those fired; `counter_increase` counts
    through restarts. Empty when none fired."""
    fired = {
        trigger: counter_increase([c.get(trigger) for c in counts]) or 0.0
        for trigger in {t for c in counts for t in c}
    }
    total = sum(fired.values())
    return {t: n / total for t, n in fired.items()} if total > 0 else {}


def advice_inputs(
    snapshots: Sequence[SeriesSnapshot],
    span: float,
    cap: float | None,
    settings: SignalSettings,
    *,
    static: UtilizationEstimate | None,
    arrival_per_second: float | None,
    budget_seconds: float | None,
    latency_seconds: float | None,
    latency_statistic: str | None,
    padding_waste: float | None,
    output_tokens: Histogram | None,
    prompt_tokens: Histogram | None,
    step_tokens: Histogram | None = None,
    binding_limit: str | None = None,
) -> AdviceInputs:
    """What the advice reads from one series' window of snapshots, oldest first, beside
    the signals already computed over it (static estimate, arrivals, budget, latency and
    whether it is a quantile or a mean, padding waste, the increases of the output and
    prompt length histograms and of the tokens-per-step histogram)."""
    last = snapshots[-1]
    near_cap = settings.near_cap * cap if cap else None
    return AdviceInputs(
        engine=last.engine,
        window_seconds=span,
        scrapes=len(snapshots),
        running=last.running,
        waiting=last.waiting,
        cap=cap,
        kv_usage=last.kv_usage,
        kv_capacity_tokens=last.kv_capacity_tokens,
        block_size=last.block_size,
        gpu_memory_utilization=last.gpu_memory_utilization,
        kv_cache_memory_bytes=last.kv_cache_memory_bytes,
        kv_scrapes=[
            KvScrape(p.running, p.kv_usage, p.waiting or 0.0)
            for p in snapshots
            if p.running is not None and p.kv_usage is not None
        ],
        near_cap=settings.near_cap,
        waited_at_cap=near_cap is not None
        and any((p.running or 0) >= near_cap and (p.waiting or 0) > 0 for p in snapshots),
        mean_prompt_tokens=_mean(prompt_tokens),
        mean_output_tokens=_mean(output_tokens),
        length_requests=output_tokens.count if output_tokens is not None else 0.0,
        # The cost curve belongs to the model and device, not to this window's traffic.
        cost_by_size=cost_per_batch(dict(last.execution_by_size)),
        max_wait_seconds=last.max_wait_seconds,
        latency_quantile=settings.quantile,
        static=static,
        arrival_per_second=arrival_per_second,
        budget_seconds=budget_seconds,
        latency_seconds=latency_seconds,
        latency_is_mean=latency_statistic == "mean",
        padding_waste=padding_waste,
        tokens_per_step=_mean(step_tokens),
        token_budget=settings.token_budget,
        step_seconds=span / step_tokens.count
        if step_tokens is not None and step_tokens.count > 0
        else None,
        kv_max_concurrency=last.kv_max_concurrency,
        binding_limit=binding_limit,
    )


# A histogram's increase over a window by its `histograms_of` name: what a window keeps
# (`SeriesTrack.histogram_increase`).
IncreaseOf = Callable[[str], Histogram | None]


def latency_increase(
    snapshots: Sequence[SeriesSnapshot],
    settings: SignalSettings,
    increase_of: IncreaseOf | None = None,
) -> Histogram | None:
    """The increase of the configured latency histogram over the window; `increase_of`:
    as `series_signals` takes it."""
    kind = settings.histogram
    if increase_of is not None:
        return increase_of(latency_histogram(kind))
    return histogram_increase([p.latency.get(kind) for p in snapshots])


# When vLLM observes a latency kind: TTFT as a request's first token is generated (a
# request still waiting owes it); e2e, queue, inference and TPOT (per request) once a
# request finishes (vLLM V1 observes the queue time then too), so every token generated
# belongs to a request that owes them until it finishes; ITL at each token after a
# request's first, so a window of first tokens alone owes none.
OBSERVED_AT_FIRST_TOKEN = ("ttft",)
OBSERVED_AT_FINISH = ("e2e", "queue", "inference", "tpot")


def in_flight_unfinished(
    snapshots: Sequence[SeriesSnapshot],
    hist: Histogram | None,
    kind: str,
    generated_per_second: float | None = None,
) -> bool:
    """Requests that the latency of `kind` has not yet observed were in flight through
    the window, and the histogram's increase `hist` counts none finished.

    In flight: for the kinds OBSERVED_AT_FIRST_TOKEN, waiting at every scrape. Else
    running or waiting at every scrape; or, for the kinds OBSERVED_AT_FINISH, tokens
    generated over the window (`generated_per_second` > 0): a token belongs to a request
    that had not finished when it was generated, and none finished since. The counter is
    the evidence that holds: vLLM's running and waiting gauges read 0 at some scrapes of
    an overloaded engine while its token counter advances (the headline test's CI run 23
    read 0 and 0 between readings of 3 running and 29 waiting). Its cost: requests
    aborted mid-generation never finish, so after every client cancelled the episode
    ends once their last tokens leave the window, one window later than the gauges say.
    """
    if hist is None or hist.count != 0:
        return False
    if kind in OBSERVED_AT_FIRST_TOKEN:
        return all((p.waiting or 0) > 0 for p in snapshots)
    if kind in OBSERVED_AT_FINISH and (generated_per_second or 0) > 0:
        return True
    return all((p.running or 0) + (p.waiting or 0) > 0 for p in snapshots)


def window_latency(
    snapshots: Sequence[SeriesSnapshot], settings: SignalSettings, hist: Histogram | None
) -> tuple[float | None, str | None]:
    """The latency of the configured kind over the window, and which statistic it is.

    The configured quantile from the histogram's increase `hist` (`latency_increase`);
    else from the engine's own summary (its sliding window); else the mean per request
    from the increase of cumulative (requests, seconds) counters. (None, None) without
    traffic or data.
    """
    kind = settings.histogram
    if hist is not None and hist.count > 0:
        return histogram_quantile(settings.quantile, hist), "quantile"
    summary = snapshots[-1].latency_quantiles.get(kind, {})
    if settings.quantile in summary:
        return summary[settings.quantile], "quantile"
    means = [p.latency_means.get(kind) for p in snapshots]
    requests = counter_increase([m[0] if m else None for m in means])
    seconds = counter_increase([m[1] if m else None for m in means])
    if requests and seconds is not None:
        return seconds / requests, "mean"
    return None, None


# Not frozen: built at every evaluation and read once, and a frozen dataclass's __init__
# costs several times a plain one's (an object.__setattr__ a field).
@dataclass(slots=True)
class _Rates:
    """A series' counters over its window: increases, and rates per second of the span."""

    span: float
    items: float | None
    batches: float | None
    mean_batch: float | None
    preemptions: float | None
    requests: float | None
    tokens: float | None
    rejections: float | None

    @classmethod
    def of(cls, increases: Mapping[str, float | None], span: float) -> _Rates:
        """From each counter's increase over the window (`counter_increases`)."""
        items, batches = increases["items_total"], increases["batches_total"]
        return cls(
            span=span,
            items=items,
            batches=batches,
            mean_batch=items / batches if items is not None and batches else None,
            preemptions=per_second(increases["preemptions_total"], span),
            requests=per_second(increases["requests_total"], span),
            tokens=per_second(increases["generation_tokens_total"], span),
            rejections=per_second(increases["rejections_total"], span),
        )


def counter_increases(snapshots: Sequence[SeriesSnapshot]) -> dict[str, float | None]:
    """`counter_increase` of each counter (`COUNTERS`) over the snapshots, by name."""
    return {name: counter_increase([getattr(p, name) for p in snapshots]) for name in COUNTERS}


def _next_saturation(
    scrapes: int,
    utilization: float | None,
    saturation: SaturationState,
    now: float,
    settings: SignalSettings,
) -> SaturationState:
    """The saturation state after this evaluation of a window of `scrapes` scrapes."""
    if scrapes < 2:
        # One scrape measures no increase: no evidence either way (the first scrape, or the
        # first after the exporter stalled for longer than the window). The saturation
        # state is carried as through a scrape that read nothing.
        kept = saturation_through_gap(
            saturation, now, settings.stale_seconds, settings.hold_seconds
        )
        return kept or SaturationState()
    return step_saturation(
        saturation,
        utilization,
        now,
        threshold=settings.saturation_threshold,
        hold_seconds=settings.hold_seconds,
        release_margin=settings.release_margin,
    )


# Not frozen: built at every evaluation and read once, and a frozen dataclass's __init__
# costs several times a plain one's (an object.__setattr__ a field).
@dataclass(slots=True)
class _Latency:
    """A series' latency over its window against its budget: the reading, its statistic
    ("quantile", or "mean" where the engine exposes only that), the budget, their ratio."""

    seconds: float | None
    statistic: str | None
    budget_seconds: float | None
    utilization: float | None


class _Saturation(NamedTuple):
    """The saturation state after an evaluation, and the seconds its episode has lasted."""

    state: SaturationState
    seconds: float


def _diagnosis(
    snapshots: Sequence[SeriesSnapshot],
    rates: _Rates,
    peak: float | None,
    cap: float | None,
    tokens_per_step: float | None,
    saturation: _Saturation,
    latency: _Latency,
    settings: SignalSettings,
) -> tuple[Diagnosis, Limits]:
    """The series' diagnosis and its limits breakdown, both judging the same batch, `peak`
    (`judged_batch`); the exported ratio stays the instant's. A mean latency is said in
    the reason."""
    last = snapshots[-1]
    fired_batches = fires_batches(last, rates)
    breakdown = limits(
        LimitInputs(
            running=peak,
            waiting=last.waiting,
            cap=cap,
            kv_usage=last.kv_usage,
            preemptions_per_second=rates.preemptions,
            tokens_per_step=tokens_per_step,
            token_budget=settings.token_budget,
            batch_tokens=last.batch_tokens,
            token_cap=settings.token_cap,
            waiting_deferred=last.waiting_deferred,
            fired_batches=fired_batches,
            trigger_shares=trigger_shares([p.batches_by_trigger for p in snapshots]),
            near_cap=settings.near_cap,
            kv_high=settings.kv_high,
        )
    )
    span = rates.span
    diagnosis = diagnose(
        DiagnosisInputs(
            running=peak,
            waiting=last.waiting,
            cap=cap,
            kv_usage=last.kv_usage,
            preemptions_per_second=rates.preemptions,
            budget_saturated=saturation.state.saturated,
            budget_utilization=latency.utilization,
            generated_per_second=rates.tokens
            if rates.tokens is not None
            else per_second(rates.items, span),
            finished_per_second=rates.requests
            if rates.requests is not None
            else per_second(rates.batches, span),
            window_seconds=span,
            fired_batches=fired_batches,
            batch_tokens=last.batch_tokens,
            token_cap=settings.token_cap,
            tokens_per_step=tokens_per_step,
            waiting_deferred=last.waiting_deferred,
            latency_seconds=latency.seconds,
            budget_seconds=latency.budget_seconds,
            above_threshold_seconds=saturation.seconds,
            limits=breakdown,
        ),
        settings,
    )
    if latency.statistic == "mean" and latency.seconds is not None:
        diagnosis = mean_latency_note(diagnosis, latency.seconds)
    return rejections_note(diagnosis, rates.rejections), breakdown


def judged_batch(snapshots: Sequence[SeriesSnapshot], rates: _Rates) -> float | None:
    """The batch the diagnosis judges: the peak of the last RECENT_SCRAPES scrapes, since a
    scrape can catch the batch between a finish and the next admission (7 of 8); a
    batcher without a running gauge: its mean fired batch over the window."""
    recent = [p.running for p in snapshots[-RECENT_SCRAPES:] if p.running is not None]
    return max(recent) if recent else _batch(snapshots[-1], rates)


def _batch(last: SeriesSnapshot, rates: _Rates) -> float | None:
    """The batch now: the running gauge, else a batcher's mean batch over the window."""
    return last.running if last.running is not None else rates.mean_batch


def slo_signals(
    latency: Histogram | None,
    budget: float | None,
    span: float,
    last: SeriesSnapshot,
    settings: SignalSettings,
    history: SloHistory | None,
) -> tuple[Attainment | None, Bounded | None, SloStatus | None]:
    """The window's attainment (from the latency histogram's increase) and goodput, and
    with an objective the burn rates and error budget from the series' SLO history."""
    attained = measure_attainment(latency, budget, last.engine, settings.histogram)
    goodput = (
        attained.share.times(attained.requests / span)
        if attained is not None and span > 0
        else None
    )
    objective = settings.slo_objective
    status = (
        slo_status(history, objective, settings.slo_window_scale, settings.slo_period_seconds)
        if history is not None and objective is not None
        else None
    )
    return attained, goodput, status


def not_exposed(last: SeriesSnapshot, settings: SignalSettings) -> tuple[str, ...]:
    """The signals whose raw series the engine does not publish at all, by signal name
    (each catalog signal's `published`)."""
    return tuple(
        s.name for s in SERIES if s.published is not None and not s.published(last, settings)
    )


class WindowReading:
    """What one evaluation reads of one series' window (or a target total's): the
    catalog's signals are each a pure function of it (`exporter.core.catalog`).

    `saturation` is the saturation state after this evaluation; `increase(name)` the
    increase of a histogram (by `histograms_of` name) over the window.
    """

    __slots__ = (
        "settings",
        "snapshots",
        "first",
        "last",
        "span",
        "cap",
        "budget",
        "increases",
        "rates",
        "increase",
        "latency_hist",
        "latency",
        "statistic",
        "utilization",
        "saturation",
        "above_seconds",
        "output_tokens",
        "static",
        "padding",
        "step_tokens",
        "tokens_per_step",
        "peak",
        "batch",
        "diagnosis",
        "limits",
        "advice",
        "attained",
        "goodput",
        "slo",
        "running_samples",
        "not_exposed",
    )


def read_window(
    points: Sequence[tuple[float, SeriesSnapshot]],
    settings: SignalSettings,
    saturation: SaturationState,
    now: float,
    increase_of: IncreaseOf | None = None,
    slo_history: SloHistory | None = None,
    counters: Mapping[str, float | None] | None = None,
) -> WindowReading:
    """One series' window `points` (time, snapshot), oldest first, read: the latest point
    gives the gauges; counters and histograms give increases over the whole window.
    `saturation`: the state before this evaluation. `increase_of`: each histogram's
    increase over the points by name, where the caller keeps them
    (`SeriesTrack.histogram_increase`); `counters`: each counter's increase
    (`SeriesTrack.counter_increases`); worked out here otherwise. `slo_history`: the
    series' (`Window.slo_history`), for the burn rates."""
    w = WindowReading()
    w.settings = settings
    w.snapshots = snapshots = [p for _, p in points]
    w.first, w.last = snapshots[0], snapshots[-1]
    w.span = points[-1][0] - points[0][0]
    w.cap = effective_cap(w.last, settings.cap)
    # An in-house batcher's own published setting (its cap or budget) wins;
    # configuration fills in what the engine does not say.
    w.budget = (
        w.last.budget_seconds if w.last.budget_seconds is not None else settings.budget_seconds
    )

    def increase(name: str) -> Histogram | None:
        if increase_of is not None:
            return increase_of(name)
        kind = name.removeprefix(latency_histogram(""))
        if kind != name:
            return histogram_increase([p.latency.get(kind) for p in snapshots])
        return histogram_increase([getattr(p, name) for p in snapshots])

    w.increase = increase
    w.increases = counters if counters is not None else counter_increases(snapshots)
    w.rates = _Rates.of(w.increases, w.span)
    _read_latency(w, saturation, now, increase_of)
    _read_batching(w)
    _judge(w)
    w.attained, w.goodput, w.slo = slo_signals(
        w.latency_hist, w.budget, w.span, w.last, settings, slo_history
    )
    w.not_exposed = not_exposed(w.last, settings)
    return w


def _read_latency(
    w: WindowReading, saturation: SaturationState, now: float, increase_of: IncreaseOf | None
) -> None:
    """The window's latency against the budget, and the saturation state after it."""
    settings = w.settings
    w.latency_hist = latency_increase(w.snapshots, settings, increase_of)
    w.latency, w.statistic = window_latency(w.snapshots, settings, w.latency_hist)
    utilization = budget_utilization(w.latency, w.budget)
    if (
        utilization is None
        and w.budget is not None
        and in_flight_unfinished(w.snapshots, w.latency_hist, settings.histogram, w.rates.tokens)
        and not progress_stopped(w.rates.tokens, w.rates.requests, w.span, settings)
    ):
        # No latency, but not for want of traffic: an engine that generates yet finishes
        # nothing for a window has not ended its overload. The utilisation last measured
        # stands (the rules path's too: grafana/rules.py, UNFINISHED), with no latency.
        utilization = saturation.utilization
    w.saturation = _next_saturation(len(w.snapshots), utilization, saturation, now, settings)
    if len(w.snapshots) < 2 and utilization is None:
        # A window of one scrape (the exporter evaluated late) measures no increase: the
        # state it carries stands with the utilisation last measured, as through a stall
        # (an engine's own summary, read from one scrape, is a measurement).
        utilization = w.saturation.utilization
    w.utilization = utilization
    w.above_seconds = saturated_seconds(w.saturation, now)


def _read_batching(w: WindowReading) -> None:
    """The batch now and judged, the static estimate, padding and tokens per step."""
    w.output_tokens = w.increase("output_tokens")
    w.static = (
        estimate_from_histogram(w.output_tokens, int(w.cap))
        if w.output_tokens is not None and w.output_tokens.count > 0 and w.cap
        else None
    )
    w.padding = padding_waste(
        w.increases["padding_tokens_total"], w.increases["batch_tokens_total"]
    )
    w.step_tokens = w.increase("step_tokens")
    w.tokens_per_step = _mean(w.step_tokens)
    w.peak = judged_batch(w.snapshots, w.rates)
    w.batch = _batch(w.last, w.rates)
    w.running_samples = (
        [p.running for p in w.snapshots if p.running is not None]
        if w.last.batch_size is None
        else []
    )


def _judge(w: WindowReading) -> None:
    """The diagnosis and limits of the judged batch, and the advice for the window."""
    w.diagnosis, w.limits = _diagnosis(
        w.snapshots,
        w.rates,
        w.peak,
        w.cap,
        w.tokens_per_step,
        _Saturation(w.saturation, w.above_seconds),
        _Latency(w.latency, w.statistic, w.budget, w.utilization),
        w.settings,
    )
    fired_batches = fires_batches(w.last, w.rates)
    w.advice = advise(
        advice_inputs(
            w.snapshots,
            w.span,
            w.cap,
            w.settings,
            static=w.static,
            arrival_per_second=per_second(w.rates.items, w.span) if fired_batches else None,
            budget_seconds=w.budget,
            latency_seconds=w.latency,
            latency_statistic=w.statistic,
            padding_waste=w.padding,
            output_tokens=w.output_tokens,
            prompt_tokens=w.increase("prompt_tokens"),
            step_tokens=w.step_tokens,
            binding_limit=w.limits.binding,
        )
    )
