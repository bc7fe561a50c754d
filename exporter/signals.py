"""The derived batching signals of DESIGN.md's table, as pure functions.

Everything here takes plain data and the current time as arguments: no I/O, no clock.
`series_signals` ties the formulas together for one series over one window of scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from exporter.histogram import Histogram, histogram_add, histogram_quantile, histogram_sub
from exporter.snapshot import SeriesSnapshot
from exporter.static_util import estimate_from_histogram

# States of the diagnosis, most specific first; docs/metrics.md explains each.
DIAGNOSIS_STATES = (
    "down",
    "idle",
    "budget_saturated",
    "memory_bound",
    "preempting",
    "healthy",
    "batch_limited",
    "queueing",
    "underloaded",
)


# Scrapes whose peak running batch the diagnosis reads.
RECENT_SCRAPES = 3


@dataclass(frozen=True, slots=True)
class SignalSettings:
    """How signals are computed for one target (from config)."""

    cap: float | None = None
    budget_seconds: float | None = None
    quantile: float = 0.99
    histogram: str = "e2e"
    saturation_threshold: float = 0.95
    # Saturation ends only below threshold - margin, so noise around the line cannot flap it.
    release_margin: float = 0.05
    hold_seconds: float = 60.0
    near_cap: float = 0.9
    kv_high: float = 0.9


# ---------------------------------------------------------------- counters and rates


def running_vs_cap(running: float | None, cap: float | None) -> float | None:
    """The running batch as a share of its cap; None when either is unknown."""
    if running is None or cap is None or cap <= 0:
        return None
    return running / cap


def counter_increase(values: Sequence[float | None]) -> float | None:
    """How much a counter grew over consecutive scrapes, counting through restarts.

    A drop means the server restarted and the counter began again from zero, as in
    PromQL's increase(): the increase is never negative. A counter absent at the first
    scrape and present later was created since (a labelled child on first use): it
    counts from zero. None with fewer than two scrapes or no value at all.
    """
    if len(values) < 2:
        return None
    points = [v for v in values if v is not None and not math.isnan(v)]
    if not points:
        return None
    if values[0] is None:
        points.insert(0, 0.0)
    if len(points) < 2:
        return None
    total = 0.0
    for previous, current in zip(points, points[1:], strict=False):
        total += current - previous if current >= previous else current
    return total


def per_second(increase: float | None, seconds: float) -> float | None:
    """An increase as a per-second rate; None when the span is empty or unknown."""
    if increase is None or seconds <= 0:
        return None
    return increase / seconds


def histogram_increase(hists: Sequence[Histogram | None]) -> Histogram | None:
    """The observations made over consecutive scrapes of one histogram, through restarts.

    A restart shows as a lower count (or a new bucket layout); the part after it counts
    from zero, and so does a histogram absent at the first scrape (created since).
    None with fewer than two scrapes, or when layouts cannot be added up.
    """
    if len(hists) < 2:
        return None
    points = [h for h in hists if h is not None]
    if not points:
        return None
    total: Histogram | None = None
    base: Histogram | None = hists[0]
    previous = points[0]
    for current in points[1:]:
        if current.bounds != previous.bounds or current.count < previous.count:
            total = histogram_add(total, histogram_sub(previous, base))
            base = None
        previous = current
    return histogram_add(total, histogram_sub(previous, base))


# ---------------------------------------------------------------- latency budget


def budget_utilization(latency_seconds: float | None, budget_seconds: float | None) -> float | None:
    """Observed latency quantile over the latency budget; None when either is unknown."""
    if latency_seconds is None or budget_seconds is None or budget_seconds <= 0:
        return None
    return latency_seconds / budget_seconds


@dataclass(frozen=True, slots=True)
class SaturationState:
    """Where the sustained-saturation state machine stands.

    `above_since`: when utilisation reached the threshold in the current episode
    (None when it is below). `saturated`: the episode has lasted the hold time.
    """

    saturated: bool = False
    above_since: float | None = None


def step_saturation(
    state: SaturationState,
    utilization: float | None,
    now: float,
    *,
    threshold: float,
    hold_seconds: float,
    release_margin: float,
) -> SaturationState:
    """Advance the saturation state by one evaluation at time `now`.

    Onset: utilisation >= threshold continuously for >= hold_seconds. Release: only
    when utilisation drops below threshold - release_margin (hysteresis), or when no
    latency is known (no traffic finished in the window: nothing is saturated).
    """
    if utilization is None:
        return SaturationState()
    if state.saturated:
        if utilization < threshold - release_margin:
            return SaturationState()
        return state
    if utilization >= threshold:
        since = state.above_since if state.above_since is not None else now
        return SaturationState(saturated=now - since >= hold_seconds, above_since=since)
    return SaturationState()


def saturated_seconds(state: SaturationState, now: float) -> float:
    """Seconds the current episode at or above the threshold has lasted; 0 outside one."""
    return 0.0 if state.above_since is None else now - state.above_since


# ---------------------------------------------------------------- batching


def batch_size_distribution(
    running_samples: Sequence[float], batch_hist: Histogram | None
) -> list[tuple[float, float]]:
    """Share of batches by size, as (size or bucket upper bound, fraction) pairs.

    In-house batchers: their batch-size histogram over the window. vLLM-like engines:
    the sampled running-request counts (each scrape is one sample of the batch).
    """
    if batch_hist is not None and batch_hist.count > 0:
        counts = batch_hist.bucket_counts()
        return [
            (bound, n / batch_hist.count)
            for bound, n in zip(batch_hist.bounds, counts, strict=True)
            if n > 0
        ]
    if not running_samples:
        return []
    by_size: dict[float, int] = {}
    for value in running_samples:
        by_size[value] = by_size.get(value, 0) + 1
    return [(size, n / len(running_samples)) for size, n in sorted(by_size.items())]


def throughput_gain(
    window_by_size: dict[int, tuple[float, float]],
    cumulative_by_size: dict[int, tuple[float, float]],
) -> float | None:
    """Items per second of execution at the observed batch sizes over the rate at size 1.

    `window_by_size`: batches and execution seconds per batch size within the window;
    `cumulative_by_size`: the same since start, for the batch-size-1 cost (a busy server
    rarely runs batches of one inside a window). None without data for both.
    """
    items = sum(size * n for size, (n, _) in window_by_size.items())
    seconds = sum(s for _, s in window_by_size.values())
    single_n, single_seconds = cumulative_by_size.get(1, (0.0, 0.0))
    if items <= 0 or seconds <= 0 or single_n <= 0 or single_seconds <= 0:
        return None
    return (items / seconds) / (single_n / single_seconds)


def execution_increase(
    first: dict[int, tuple[float, float]], last: dict[int, tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    """Per-batch-size executions and seconds between two scrapes (a reset counts from zero)."""
    out = {}
    for size, (n, s) in last.items():
        n0, s0 = first.get(size, (0.0, 0.0))
        dn, ds = (n - n0, s - s0) if n >= n0 else (n, s)
        if dn > 0:
            out[size] = (dn, ds)
    return out


# ---------------------------------------------------------------- diagnosis


@dataclass(frozen=True, slots=True)
class Diagnosis:
    state: str
    reason: str


def _fmt(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.2f}"


def diagnose(
    *,
    up: bool,
    error: str | None,
    running: float | None,
    waiting: float | None,
    cap: float | None,
    kv_usage: float | None,
    preemptions_per_second: float | None,
    budget_saturated: bool,
    budget_utilization: float | None,
    near_cap: float = 0.9,
    kv_high: float = 0.9,
    engine: str = "",
) -> Diagnosis:
    """One state, with a plain-language reason an operator can act on (seed 003's advice)."""
    if not up:
        return Diagnosis(
            "down", f"the target does not answer its /metrics: {error or 'unknown error'}"
        )
    busy = (running or 0) + (waiting or 0)
    if busy == 0:
        return Diagnosis("idle", "no request is running or waiting")
    if budget_saturated:
        pct = f"{budget_utilization:.0%}" if budget_utilization is not None else "at least 95%"
        return Diagnosis(
            "budget_saturated",
            f"latency has stayed at {pct} of the budget: the budget is too tight for this "
            "traffic, or the server needs more capacity",
        )
    waits = (waiting or 0) > 0
    ratio = running_vs_cap(running, cap)
    preempting = (preemptions_per_second or 0) > 0
    kv_full = kv_usage is not None and kv_usage >= kv_high
    if waits and ratio is not None and ratio < near_cap and (kv_full or preempting):
        evidence = []
        if kv_full:
            evidence.append(f"KV cache {kv_usage:.0%} full")
        if preempting:
            evidence.append(f"{preemptions_per_second:.2f} preemptions/s")
        return Diagnosis(
            "memory_bound",
            f"running {_fmt(running or 0)} of cap {_fmt(cap)} while {_fmt(waiting)} wait, "
            f"{' and '.join(evidence)}: KV cache memory limits the batch, a higher cap "
            "will not help",
        )
    if preempting:
        return Diagnosis(
            "preempting",
            f"{preemptions_per_second:.2f} preemptions/s: the KV cache is short of memory "
            "and running requests are being pushed back to the queue",
        )
    if ratio is not None and ratio >= near_cap:
        return Diagnosis(
            "healthy",
            f"running {_fmt(running)} of cap {_fmt(cap)}"
            + (f" with {_fmt(waiting)} waiting" if waits else "")
            + ": continuous batching is doing its job; the next limit is elsewhere",
        )
    if waits and ratio is not None and engine == "inhouse":
        return Diagnosis(
            "batch_limited",
            f"batches average {_fmt(running or 0)} of max {_fmt(cap)} while {_fmt(waiting)} "
            "wait: the batcher fires before batches fill (its max wait or latency budget is "
            "short for this traffic) or execution cannot keep up",
        )
    if waits and ratio is not None:
        return Diagnosis(
            "batch_limited",
            f"running {_fmt(running or 0)} of cap {_fmt(cap)} while {_fmt(waiting)} wait, "
            "with no sign of KV pressure: something else limits the batch (e.g. the "
            "per-step token budget)",
        )
    if waits:
        return Diagnosis(
            "queueing",
            f"{_fmt(waiting)} requests wait; configure the cap to tell a full batch from a "
            "limited one",
        )
    return Diagnosis(
        "underloaded",
        "nothing waits: batches are small because there is little traffic to batch",
    )


# ---------------------------------------------------------------- one series over a window


@dataclass(frozen=True, slots=True)
class StaticUtilization:
    estimate: float
    lower: float
    upper: float
    continuous_batching_gain: float


@dataclass(frozen=True, slots=True)
class SeriesSignals:
    """Every signal of one series (or a target total) at one evaluation."""

    labels: dict[str, str]
    engine: str
    running: float | None
    waiting: float | None
    cap: float | None
    running_vs_cap: float | None
    mean_batch_size: float | None
    preemptions_per_second: float | None
    kv_cache_usage: float | None
    requests_per_second: float | None
    generation_tokens_per_second: float | None
    latency_quantile: float
    latency_histogram: str
    latency_seconds: float | None
    budget_seconds: float | None
    budget_utilization: float | None
    budget_saturated: bool
    budget_saturated_seconds: float
    throughput_gain: float | None
    static_utilization: StaticUtilization | None
    batch_size_distribution: list[tuple[float, float]] = field(default_factory=list)
    diagnosis: Diagnosis = Diagnosis("idle", "")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["batch_size_distribution"] = [
            {"size": s if math.isfinite(s) else "+Inf", "fraction": f}
            for s, f in self.batch_size_distribution
        ]
        return out


def series_signals(
    points: Sequence[tuple[float, SeriesSnapshot]],
    settings: SignalSettings,
    saturation: SaturationState,
    now: float,
) -> tuple[SeriesSignals, SaturationState]:
    """All signals of one series over the window `points` (time, snapshot), oldest first.

    Returns the signals and the next saturation state. The latest point gives the
    gauges; counters and histograms give increases over the whole window.
    """
    t_first, first = points[0]
    t_last, last = points[-1]
    span = t_last - t_first
    cap = last.cap if last.cap is not None else settings.cap
    # An engine's own published setting (an in-house batcher's cap or budget) wins;
    # configuration fills in what the engine does not say.
    budget = last.budget_seconds if last.budget_seconds is not None else settings.budget_seconds

    items = counter_increase([p.items_total for _, p in points])
    batches = counter_increase([p.batches_total for _, p in points])
    mean_batch = items / batches if items is not None and batches else None
    batch = last.running if last.running is not None else mean_batch

    latency_hist = histogram_increase([p.latency.get(settings.histogram) for _, p in points])
    latency = (
        histogram_quantile(settings.quantile, latency_hist)
        if latency_hist is not None and latency_hist.count > 0
        else None
    )
    utilization = budget_utilization(latency, budget)
    saturation = step_saturation(
        saturation,
        utilization,
        now,
        threshold=settings.saturation_threshold,
        hold_seconds=settings.hold_seconds,
        release_margin=settings.release_margin,
    )
    preemption_rate = per_second(counter_increase([p.preemptions_total for _, p in points]), span)

    static = None
    output_tokens = histogram_increase([p.output_tokens for _, p in points])
    if output_tokens is not None and output_tokens.count > 0 and cap:
        est = estimate_from_histogram(output_tokens, int(cap))
        if est is not None:
            static = StaticUtilization(
                est.estimate, est.lower, est.upper, est.continuous_batching_gain
            )

    gain = throughput_gain(
        execution_increase(first.execution_by_size, last.execution_by_size),
        dict(last.execution_by_size),
    )
    batch_hist = histogram_increase([p.batch_size for _, p in points])
    running_samples = [p.running for _, p in points if p.running is not None]
    kv = last.kv_usage
    # A scrape can catch the batch between a finish and the next admission (7 of 8):
    # the diagnosis reads the recent peak, the exported ratio stays the instant's.
    recent = [p.running for _, p in points[-RECENT_SCRAPES:] if p.running is not None]
    diagnosis = diagnose(
        up=True,
        error=None,
        running=max(recent) if recent else batch,
        waiting=last.waiting,
        cap=cap,
        kv_usage=kv,
        preemptions_per_second=preemption_rate,
        budget_saturated=saturation.saturated,
        budget_utilization=utilization,
        near_cap=settings.near_cap,
        kv_high=settings.kv_high,
        engine=last.engine,
    )
    signals = SeriesSignals(
        labels=last.labels,
        engine=last.engine,
        running=last.running,
        waiting=last.waiting,
        cap=cap,
        running_vs_cap=running_vs_cap(batch, cap),
        mean_batch_size=mean_batch,
        preemptions_per_second=preemption_rate,
        kv_cache_usage=kv,
        requests_per_second=per_second(
            counter_increase([p.requests_total for _, p in points]), span
        ),
        generation_tokens_per_second=per_second(
            counter_increase([p.generation_tokens_total for _, p in points]), span
        ),
        latency_quantile=settings.quantile,
        latency_histogram=settings.histogram,
        latency_seconds=latency,
        budget_seconds=budget,
        budget_utilization=utilization,
        budget_saturated=saturation.saturated,
        budget_saturated_seconds=saturated_seconds(saturation, now),
        throughput_gain=gain,
        static_utilization=static,
        batch_size_distribution=batch_size_distribution(
            running_samples if last.batch_size is None else [], batch_hist
        ),
        diagnosis=diagnosis,
    )
    return signals, saturation


def down_signals(
    labels: dict[str, str], error: str | None, settings: SignalSettings
) -> SeriesSignals:
    """The signals of a target that did not answer: only the diagnosis says anything."""
    return SeriesSignals(
        labels=labels,
        engine="",
        running=None,
        waiting=None,
        cap=settings.cap,
        running_vs_cap=None,
        mean_batch_size=None,
        preemptions_per_second=None,
        kv_cache_usage=None,
        requests_per_second=None,
        generation_tokens_per_second=None,
        latency_quantile=settings.quantile,
        latency_histogram=settings.histogram,
        latency_seconds=None,
        budget_seconds=settings.budget_seconds,
        budget_utilization=None,
        budget_saturated=False,
        budget_saturated_seconds=0.0,
        throughput_gain=None,
        static_utilization=None,
        diagnosis=diagnose(
            up=False,
            error=error,
            running=None,
            waiting=None,
            cap=None,
            kv_usage=None,
            preemptions_per_second=None,
            budget_saturated=False,
            budget_utilization=None,
        ),
    )


# ---------------------------------------------------------------- target total


def _sum_optional(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def total_series(series: Sequence[SeriesSnapshot], default_cap: float | None) -> SeriesSnapshot:
    """All series of one scrape as one: counts and histograms add up, KV usage is the
    fullest engine's, the cap is the sum of the series' caps (None if any is unknown)."""
    caps = [s.cap if s.cap is not None else default_cap for s in series]
    latency: dict[str, Histogram] = {}
    for kind in {k for s in series for k in s.latency}:
        merged: Histogram | None = None
        for s in series:
            if kind in s.latency:
                merged = histogram_add(merged, s.latency[kind])
                if merged is None:
                    break
        if merged is not None:
            latency[kind] = merged
    output_tokens: Histogram | None = None
    for s in series:
        if s.output_tokens is not None:
            output_tokens = histogram_add(output_tokens, s.output_tokens)
    by_size: dict[int, tuple[float, float]] = {}
    for s in series:
        for size, (n, secs) in s.execution_by_size.items():
            n0, s0 = by_size.get(size, (0.0, 0.0))
            by_size[size] = (n0 + n, s0 + secs)
    kv = [s.kv_usage for s in series if s.kv_usage is not None]
    budgets = {s.budget_seconds for s in series if s.budget_seconds is not None}
    return SeriesSnapshot(
        key=(),
        engine="+".join(sorted({s.engine for s in series})),
        running=_sum_optional([s.running for s in series]),
        waiting=_sum_optional([s.waiting for s in series]),
        preemptions_total=_sum_optional([s.preemptions_total for s in series]),
        kv_usage=max(kv) if kv else None,
        cap=None if any(c is None for c in caps) or not caps else sum(caps),
        budget_seconds=budgets.pop() if len(budgets) == 1 else None,
        requests_total=_sum_optional([s.requests_total for s in series]),
        generation_tokens_total=_sum_optional([s.generation_tokens_total for s in series]),
        items_total=_sum_optional([s.items_total for s in series]),
        batches_total=_sum_optional([s.batches_total for s in series]),
        latency=latency,
        output_tokens=output_tokens,
        execution_by_size=by_size,
    )
