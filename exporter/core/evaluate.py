"""The evaluator: every signal of a target, per series and in total, from its window.

The formulas live in `batchscope.exporter.core.signals`; this module reads each series' points from the
window (`batchscope.exporter.core.window`) and hands each formula what it needs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

from batchscope.exporter.core.advice import Advice, AdviceInputs, advise
from batchscope.exporter.core.capacity import KvScrape, cost_per_batch
from batchscope.exporter.core.diagnosis import (
    Diagnosis,
    DiagnosisInputs,
    diagnose,
    down_diagnosis,
    mean_latency_note,
    no_data_diagnosis,
    progress_stopped,
    rejections_note,
    unreadable_diagnosis,
)
from batchscope.exporter.core.histogram import Histogram, histogram_increase, histogram_quantile
from batchscope.exporter.core.limits import LimitInputs, Limits, limits
from batchscope.exporter.core.signals import (
    SaturationState,
    SignalSettings,
    batch_size_distribution,
    budget_utilization,
    counter_increase,
    execution_increase,
    outlasted,
    padding_waste,
    per_second,
    running_vs_cap,
    saturated_seconds,
    saturation_after_gap,
    saturation_through_gap,
    step_saturation,
    throughput_gain,
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
    LabelKey,
    SeriesSnapshot,
    effective_cap,
    latency_histogram,
)
from batchscope.exporter.core.static_util import UtilizationEstimate, estimate_from_histogram
from batchscope.exporter.core.window import Window

TOTAL: LabelKey = ()

# Scrapes whose peak running batch the diagnosis reads.
RECENT_SCRAPES = 3


# Not frozen: one or two built at every evaluation, and a frozen dataclass's __init__ costs
# several times a plain one's (an object.__setattr__ a field). Nothing changes one once
# built: the renders read it from other threads.
@dataclass(slots=True)
class SeriesSignals:
    """Every signal of one series (or a target total) at one evaluation.

    A signal that cannot be known (no cap, no traffic in the window, a down target)
    stays None.
    """

    labels: dict[str, str] = field(default_factory=dict)
    engine: str = ""
    running: float | None = None
    # The batch the diagnosis and the limits judge: the peak of the running gauge over the
    # last RECENT_SCRAPES scrapes (a batcher: its mean fired batch over the window).
    running_peak: float | None = None
    waiting: float | None = None
    cap: float | None = None
    running_vs_cap: float | None = None
    batch_tokens: float | None = None
    token_cap: float | None = None
    tokens_vs_cap: float | None = None
    mean_batch_size: float | None = None
    preemptions_per_second: float | None = None
    kv_cache_usage: float | None = None
    requests_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    # The span the rates, the latency and the advice were measured over (None: no window).
    window_seconds: float | None = None
    latency_quantile: float = 0.99
    latency_histogram: str = "e2e"
    latency_seconds: float | None = None
    # "quantile" (a histogram's or summary's), or "mean" where the engine exposes only that.
    latency_statistic: str | None = None
    budget_seconds: float | None = None
    budget_utilization: float | None = None
    budget_saturated: bool = False
    budget_saturated_seconds: float = 0.0
    throughput_gain: float | None = None
    padding_waste: float | None = None
    # Share (and rate) of the window's requests within the budget, from the latency
    # histogram's buckets; and with an objective, its burn rates and error budget.
    slo_attainment: Attainment | None = None
    goodput_per_second: Bounded | None = None
    slo: SloStatus | None = None
    # Mean tokens an engine step carried over the window (vLLM's iteration_tokens), against
    # the configured per-step token budget; waiting requests deferred; refused per second.
    tokens_per_step: float | None = None
    token_budget: float | None = None
    token_budget_ratio: float | None = None
    waiting_deferred: float | None = None
    rejections_per_second: float | None = None
    limits: Limits = Limits()
    static_utilization: UtilizationEstimate | None = None
    batch_size_distribution: list[tuple[float, float]] = field(default_factory=list)
    diagnosis: Diagnosis = Diagnosis("idle", "")
    # Signals whose raw series this engine does not publish (absent, not merely unknown).
    not_exposed: tuple[str, ...] = ()
    advice: Advice = Advice()

    def relabelled(self, labels: dict[str, str]) -> SeriesSignals:
        """The same signals under other labels (a target's total that is its one series)."""
        return _relabelled(self, labels)


# Not frozen: one or two built at every evaluation, and a frozen dataclass's __init__ costs
# several times a plain one's (an object.__setattr__ a field). Nothing changes one once
# built: the renders read it from other threads.
@dataclass(slots=True)
class TargetSignals:
    """What the exporter knows about one target at one evaluation.

    `extra_labels`: the target's configured `labels:`, carried by every series it exports.
    `errors_total`: payloads this target sent that could not be read, by reason, since start.
    `window_resets_total`: times its window started again, by reason, since start.
    """

    target: str
    url: str
    t: float
    up: bool
    error: str | None
    series: tuple[SeriesSignals, ...]
    total: SeriesSignals
    scrape_seconds: float | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    errors_total: Mapping[str, int] = field(default_factory=dict)
    window_resets_total: Mapping[str, int] = field(default_factory=dict)

    def with_counts(
        self, errors_total: Mapping[str, int], window_resets_total: Mapping[str, int]
    ) -> TargetSignals:
        """These signals with the target's counts since start."""
        return _with_counts(self, errors_total, window_resets_total)

    @property
    def read(self) -> bool:
        """Whether this evaluation read the target: it answered with a payload that could be
        evaluated. One that did not (down, unreadable) is a gap in the evidence: it ends no
        held state, and of the diagnosis only its own state is known."""
        return self.up and self.error is None

    @property
    def measured(self) -> bool:
        """Whether this evaluation measured the target: read it over a window of two
        scrapes or more. A window of one scrape (the first after the target or the exporter
        went dark for longer than the window) measures no increase, and a saturation
        episode is carried through it as through a gap (`_next_saturation`)."""
        return self.read and bool(self.total.window_seconds)


def _replacing(cls: type, *names: str) -> Callable:
    """`dataclasses.replace(instance, **dict(zip(names, values)))` as a function of
    (instance, *values), for the evaluation path: every field read at once by an
    attrgetter (in C) and passed by position, at a fraction of `replace`'s cost (it walks
    the fields in Python and passes them by keyword); the same instance, field for field
    (tests/exporter/test_signals.py)."""
    every = [f.name for f in fields(cls)]
    read = operator.attrgetter(*every)
    positions = [every.index(name) for name in names]

    def replaced(instance: object, *values: object) -> object:
        arguments = list(read(instance))
        for position, value in zip(positions, values, strict=True):
            arguments[position] = value
        return cls(*arguments)

    return replaced


_relabelled = _replacing(SeriesSignals, "labels")
_with_counts = _replacing(TargetSignals, "errors_total", "window_resets_total")


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


def not_exposed(last: SeriesSnapshot, settings: SignalSettings) -> tuple[str, ...]:
    """The signals whose raw series the engine does not publish at all, by signal name."""
    kind = settings.histogram
    latency = kind in last.latency or kind in last.latency_quantiles or kind in last.latency_means
    missing = {
        "running": last.running is None,
        "waiting": last.waiting is None,
        "mean_batch_size": last.items_total is None or last.batches_total is None,
        "batch_tokens": last.batch_tokens is None,
        "preemptions_per_second": last.preemptions_total is None,
        "kv_cache_usage": last.kv_usage is None,
        "requests_per_second": last.requests_total is None,
        "generation_tokens_per_second": last.generation_tokens_total is None,
        "latency_seconds": not latency,
        "budget_utilization": not latency,
        "slo_attainment": kind not in last.latency,
        "throughput_gain": not last.execution_by_size,
        "static_utilization": last.output_tokens is None,
    }
    return tuple(name for name, absent in missing.items() if absent)


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
    fired_batches = _fires_batches(last, rates)
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


def _fires_batches(last: SeriesSnapshot, rates: _Rates) -> bool:
    """A batcher without a running gauge fills batches and fires them: its progress is
    items and batches executed, where an LLM engine's is tokens and finished requests."""
    return last.running is None and rates.mean_batch is not None


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


def series_signals(
    points: Sequence[tuple[float, SeriesSnapshot]],
    settings: SignalSettings,
    saturation: SaturationState,
    now: float,
    increase_of: IncreaseOf | None = None,
    slo_history: SloHistory | None = None,
    counters: Mapping[str, float | None] | None = None,
) -> tuple[SeriesSignals, SaturationState]:
    """All signals of one series over the window `points` (time, snapshot), oldest first.

    Returns the signals and the next saturation state. The latest point gives the
    gauges; counters and histograms give increases over the whole window.
    `increase_of`: each histogram's increase over the points by name (`histograms_of`),
    where the caller keeps them (`SeriesTrack.histogram_increase`); worked out here
    otherwise. `slo_history`: the series' (`Window.slo_history`), for the burn rates.
    `counters`: each counter's increase over the points (`counter_increases`), where the
    caller keeps them (`SeriesTrack.counter_increases`); worked out here otherwise.
    """
    t_first, first = points[0]
    t_last, last = points[-1]
    span = t_last - t_first
    snapshots = [p for _, p in points]
    cap = effective_cap(last, settings.cap)
    # An in-house batcher's own published setting (its cap or budget) wins;
    # configuration fills in what the engine does not say.
    budget = last.budget_seconds if last.budget_seconds is not None else settings.budget_seconds

    def increase(name: str) -> Histogram | None:
        if increase_of is not None:
            return increase_of(name)
        return histogram_increase([getattr(p, name) for p in snapshots])

    increases = counters if counters is not None else counter_increases(snapshots)
    rates = _Rates.of(increases, span)
    latency_hist = latency_increase(snapshots, settings, increase_of)
    latency, statistic = window_latency(snapshots, settings, latency_hist)
    utilization = budget_utilization(latency, budget)
    if (
        utilization is None
        and budget is not None
        and in_flight_unfinished(snapshots, latency_hist, settings.histogram, rates.tokens)
        and not progress_stopped(rates.tokens, rates.requests, span, settings)
    ):
        # No latency, but not for want of traffic: an engine that generates yet finishes
        # nothing for a window has not ended its overload. The utilisation last measured
        # stands (the rules path's too: grafana/rules.py, UNFINISHED), with no latency.
        utilization = saturation.utilization
    saturation = _next_saturation(len(points), utilization, saturation, now, settings)
    if len(points) < 2 and utilization is None:
        # A window of one scrape (the exporter evaluated late) measures no increase: the
        # state it carries stands with the utilisation last measured, as through a stall
        # (an engine's own summary, read from one scrape, is a measurement).
        utilization = saturation.utilization

    output_tokens = increase("output_tokens")
    static = (
        estimate_from_histogram(output_tokens, int(cap))
        if output_tokens is not None and output_tokens.count > 0 and cap
        else None
    )
    padding = padding_waste(increases["padding_tokens_total"], increases["batch_tokens_total"])
    step_tokens = increase("step_tokens")
    tokens_per_step = _mean(step_tokens)

    above_seconds = saturated_seconds(saturation, now)
    peak = judged_batch(snapshots, rates)
    diagnosis, breakdown = _diagnosis(
        snapshots,
        rates,
        peak,
        cap,
        tokens_per_step,
        _Saturation(saturation, above_seconds),
        _Latency(latency, statistic, budget, utilization),
        settings,
    )
    fired_batches = _fires_batches(last, rates)
    advice = advise(
        advice_inputs(
            snapshots,
            span,
            cap,
            settings,
            static=static,
            arrival_per_second=per_second(rates.items, span) if fired_batches else None,
            budget_seconds=budget,
            latency_seconds=latency,
            latency_statistic=statistic,
            padding_waste=padding,
            output_tokens=output_tokens,
            prompt_tokens=increase("prompt_tokens"),
            step_tokens=step_tokens,
            binding_limit=breakdown.binding,
        )
    )
    running_samples = [p.running for p in snapshots if p.running is not None]
    attained, goodput, slo = slo_signals(latency_hist, budget, span, last, settings, slo_history)
    signals = SeriesSignals(
        labels=last.labels,
        engine=last.engine,
        running=last.running,
        running_peak=peak,
        waiting=last.waiting,
        cap=cap,
        running_vs_cap=running_vs_cap(_batch(last, rates), cap),
        batch_tokens=last.batch_tokens,
        token_cap=settings.token_cap,
        tokens_vs_cap=running_vs_cap(last.batch_tokens, settings.token_cap),
        mean_batch_size=rates.mean_batch,
        preemptions_per_second=rates.preemptions,
        kv_cache_usage=last.kv_usage,
        requests_per_second=rates.requests,
        generation_tokens_per_second=rates.tokens,
        window_seconds=span,
        latency_quantile=settings.quantile,
        latency_histogram=settings.histogram,
        latency_seconds=latency,
        latency_statistic=statistic,
        budget_seconds=budget,
        budget_utilization=utilization,
        budget_saturated=saturation.saturated,
        budget_saturated_seconds=above_seconds,
        throughput_gain=throughput_gain(
            execution_increase(first.execution_by_size, last.execution_by_size),
            dict(last.execution_by_size),
        ),
        padding_waste=padding,
        slo_attainment=attained,
        goodput_per_second=goodput,
        slo=slo,
        tokens_per_step=tokens_per_step,
        token_budget=settings.token_budget,
        token_budget_ratio=breakdown.ratio("token_budget"),
        waiting_deferred=last.waiting_deferred,
        rejections_per_second=rates.rejections,
        limits=breakdown,
        static_utilization=static,
        batch_size_distribution=batch_size_distribution(
            running_samples if last.batch_size is None else [], increase("batch_size")
        ),
        diagnosis=diagnosis,
        not_exposed=not_exposed(last, settings),
        advice=advice,
    )
    return signals, saturation


def signals_without_series(diagnosis: Diagnosis, settings: SignalSettings) -> SeriesSignals:
    """The total of a target with no series to evaluate: only the diagnosis says anything."""
    return SeriesSignals(
        cap=settings.cap,
        token_cap=settings.token_cap,
        token_budget=settings.token_budget,
        latency_quantile=settings.quantile,
        latency_histogram=settings.histogram,
        budget_seconds=settings.budget_seconds,
        diagnosis=diagnosis,
    )


def down_signals(error: str | None, settings: SignalSettings) -> SeriesSignals:
    """The signals of a target that did not answer: only the diagnosis says anything."""
    return signals_without_series(down_diagnosis(error), settings)


def held_saturation(
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
    settings: SignalSettings,
    readable: bool = False,
) -> dict[LabelKey, SaturationState]:
    """The saturation states an evaluation at `now` starts from: through a scrape that
    read nothing, each kept as it was until the target has gone unread for longer than the
    staleness, a saturated one for longer than the staleness and the hold
    (`saturation_through_gap`); at a `readable` one, each that no such outage ended
    (`saturation_after_gap`)."""
    carry = saturation_after_gap if readable else saturation_through_gap
    held = {}
    for key, state in saturation.items():
        kept = carry(state, now, settings.stale_seconds, settings.hold_seconds)
        if kept is not None:
            held[key] = kept
    return held


def held_slo(window: Window, held: SaturationState | None, now: float) -> SloStatus | None:
    """The total's SLO status through a scrape that read nothing: its history's, which
    that scrape left as the last read did; None without an objective, and once the target
    has gone unread past the staleness (`held`: the total's saturation state from
    `held_saturation`, whose clocks say how long; a saturated episode alone outlasts the
    staleness, by the hold), as the alert book ends an SLO burn's alert."""
    settings = window.settings
    history = window.total_slo_history()
    if held is None or history is None or settings.slo_objective is None:
        return None
    if outlasted(held.unread_since, held.read_at, held.saturated, now, settings.stale_seconds):
        return None
    return slo_status(
        history, settings.slo_objective, settings.slo_window_scale, settings.slo_period_seconds
    )


def _with_episode(
    total: SeriesSignals, state: SaturationState | None, slo: SloStatus | None, now: float
) -> SeriesSignals:
    """A total that read nothing, carrying the saturation episode still open (if any) and
    the SLO status held through it (`held_slo`), so neither episode splits."""
    if slo is not None:
        total = replace(total, slo=slo)
    if state is None or state.above_since is None:
        return total
    return replace(
        total,
        budget_saturated=state.saturated,
        budget_saturated_seconds=saturated_seconds(state, now),
    )


@dataclass(frozen=True, slots=True)
class TargetIdentity:
    """Which target signals belong to: its name, its URL and its configured `labels:`."""

    name: str
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def signals(
        self,
        t: float,
        up: bool,
        error: str | None,
        series: tuple[SeriesSignals, ...],
        total: SeriesSignals,
        scrape_seconds: float | None,
    ) -> TargetSignals:
        return TargetSignals(
            self.name, self.url, t, up, error, series, total, scrape_seconds, dict(self.labels)
        )


def unreadable_signals(
    target: TargetIdentity,
    t: float,
    error: str,
    settings: SignalSettings,
    scrape_seconds: float | None,
    episode: SaturationState | None = None,
    slo: SloStatus | None = None,
) -> TargetSignals:
    """A target that answered (up, as Prometheus would say) whose payload could not be
    evaluated: the error is its state and its diagnosis, and it has no series. `episode`:
    the total's saturation state held through it (`held_saturation`); `slo`: its SLO
    status held through it (`held_slo`)."""
    unreadable = signals_without_series(unreadable_diagnosis(error), settings)
    total = _with_episode(unreadable, episode, slo, t)
    return target.signals(t, True, error, (), total, scrape_seconds)


def evaluate_window(
    target: TargetIdentity,
    window: Window,
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
) -> tuple[TargetSignals, dict[LabelKey, SaturationState]]:
    """Signals for one target from its window; returns them and the next saturation states.

    The newest snapshot decides up/down; up without a series means the engine's families
    are registered with no samples yet. A down scrape (failed, timed out, unreadable)
    reads nothing: the saturation states are held through it, and the total shows the
    episode still open; a target unread for longer than the staleness (a saturated
    episode: the staleness and the hold), counted from the first scrape that read nothing,
    ends its states (`held_saturation`): two readable
    scrapes in a row continue them, however late the second. Series absent from the newest snapshot
    (a model
    that was unloaded) are dropped; the total is computed like any series, over the
    merged series of each scrape, so its own saturation state is kept under key ().
    A target whose every scrape held the same one series, with a total that is that
    series but its labels, in the same saturation state, has the series' signals as its
    total: computing them again would give the same.
    """
    settings = window.settings
    latest = window.latest()
    if latest is None:
        raise ValueError(f"target {target.name}: evaluating an empty window")
    saturation = held_saturation(saturation, now, settings, readable=latest.up)
    if not latest.up:
        held = saturation.get(TOTAL)
        down = _with_episode(
            down_signals(latest.error, settings), held, held_slo(window, held, now), now
        )
        return target.signals(
            latest.t, False, latest.error, (), down, latest.scrape_seconds
        ), saturation
    if not latest.series:
        total = signals_without_series(no_data_diagnosis(), settings)
        return target.signals(latest.t, True, None, (), total, latest.scrape_seconds), {}
    next_states: dict[LabelKey, SaturationState] = {}
    series = []
    for key in sorted({s.key for s in latest.series}):
        track = window.series[key]
        signals, next_states[key] = series_signals(
            track.points,
            settings,
            saturation.get(key, SaturationState()),
            now,
            track.histogram_increase,
            window.slo_history(key),
            track.counter_increases(),
        )
        series.append(signals)
    sole = window.sole_series_key()
    total_state = saturation.get(TOTAL, SaturationState())
    if sole is not None and total_state == saturation.get(sole, SaturationState()):
        total, next_states[TOTAL] = series[0].relabelled({}), next_states[sole]
    else:
        total_track = window.total()
        total, next_states[TOTAL] = series_signals(
            total_track.points,
            settings,
            total_state,
            now,
            total_track.histogram_increase,
            window.total_slo_history(),
            total_track.counter_increases(),
        )
    return (
        target.signals(latest.t, True, None, tuple(series), total, latest.scrape_seconds),
        next_states,
    )
