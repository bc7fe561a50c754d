"""The derived batching signals of DESIGN.md's table, as pure functions.

Everything here takes plain data and the current time as arguments: no I/O, no clock.
`batchscope.exporter.core.evaluate` ties the formulas together for one series over one window of scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.core.slo import DAY_SECONDS, DEFAULT_PERIOD_DAYS

# The exporter's default hold and scrape interval (its Settings'), which the staleness
# below is worked out from when nothing else is configured.
DEFAULT_HOLD_SECONDS = 60.0
DEFAULT_INTERVAL_SECONDS = 5.0


def staleness(hold_seconds: float, interval_seconds: float) -> float:
    """How long a target may go unread before its held states and alerts end (a saturated
    episode and its fired alert: this and the hold again, `outlasted`): the hold time, or
    two intervals where that is longer (a hold shorter than one scrape cannot count
    gaps)."""
    return max(hold_seconds, 2 * interval_seconds)


@dataclass(frozen=True, slots=True)
class SignalSettings:
    """How signals are computed for one target (from config)."""

    cap: float | None = None
    # A token budget for the running batch (TGI's --max-batch-total-tokens), beside `cap`.
    token_cap: float | None = None
    # The tokens one engine step may carry (vLLM's --max-num-batched-tokens): not exposed
    # by any engine, so the token budget is judged only where this is configured.
    token_budget: float | None = None
    budget_seconds: float | None = None
    quantile: float = 0.99
    histogram: str = "e2e"
    saturation_threshold: float = 0.95
    # Saturation ends only below threshold - margin, so noise around the line cannot flap it.
    release_margin: float = 0.05
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    near_cap: float = 0.9
    kv_high: float = 0.9
    # Stalled: less progress than this per second over a window at least stall_seconds long.
    stall_rate: float = 0.1
    stall_seconds: float = 20.0
    # A target unread for longer than this ends its held states, a saturated one this and
    # the hold (`saturation_through_gap`).
    stale_seconds: float = staleness(DEFAULT_HOLD_SECONDS, DEFAULT_INTERVAL_SECONDS)
    # The share of requests promised within the budget; None: no objective, no burn rates
    # (exporter/core/slo.py). The burn windows are scaled by `slo_window_scale`; the error
    # budget is counted over `slo_period_seconds`.
    slo_objective: float | None = None
    slo_window_scale: float = 1.0
    slo_period_seconds: float = DEFAULT_PERIOD_DAYS * DAY_SECONDS


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
    counts from zero. NaN reads as absent. None with fewer than two scrapes or no value
    at all.

    The arithmetic is PromQL's (`extrapolatedRate` in Prometheus's promql/functions.go),
    in its order: the last value less the first, then the value before each drop added
    on. So a window without a drop costs one subtraction however many scrapes it holds,
    which is what `SeriesTrack.counter_increases` keeps to.
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
    total = points[-1] - points[0]
    for previous, current in zip(points, points[1:], strict=False):
        if current < previous:
            total += previous
    return total


def per_second(increase: float | None, seconds: float) -> float | None:
    """An increase as a per-second rate; None when the span is empty or unknown."""
    if increase is None or seconds <= 0:
        return None
    return increase / seconds


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
    `read_at`: when an evaluation last read the target (None before any): a scrape that
    failed reads nothing, and the state waits for the next one that does.
    `unread_since`: the first evaluation since then that could not read it (None while
    every evaluation reads it): how long the target has gone unread counts from there,
    not from `read_at`, so an exporter that evaluated late (starved of CPU, suspended)
    is not taken for a target that stopped answering. `utilization`: the last evaluation's
    (None when it measured none), which stands where the next window finishes nothing
    with requests in flight (`evaluate.series_signals`).
    """

    saturated: bool = False
    above_since: float | None = None
    read_at: float | None = None
    unread_since: float | None = None
    utilization: float | None = None


def step_saturation(
    state: SaturationState,
    utilization: float | None,
    now: float,
    *,
    threshold: float,
    hold_seconds: float,
    release_margin: float,
) -> SaturationState:
    """Advance the saturation state by one evaluation of a readable scrape at `now`.

    Onset: utilisation >= threshold continuously for >= hold_seconds. Release: only
    when utilisation drops below threshold - release_margin (hysteresis), or when no
    latency is known (no traffic finished in the window: nothing is saturated; where
    requests were in flight throughout and the engine still generated, the evaluator
    passes the utilisation last measured instead: `evaluate.series_signals`).
    A scrape that failed is no evaluation: see `saturation_through_gap`.
    """
    if utilization is None:
        return SaturationState(read_at=now)
    if state.saturated:
        if utilization < threshold - release_margin:
            return SaturationState(read_at=now, utilization=utilization)
        return SaturationState(True, state.above_since, now, utilization=utilization)
    if utilization >= threshold:
        since = state.above_since if state.above_since is not None else now
        return SaturationState(now - since >= hold_seconds, since, now, utilization=utilization)
    return SaturationState(read_at=now, utilization=utilization)


def saturation_through_gap(
    state: SaturationState, now: float, stale_seconds: float, keep_seconds: float
) -> SaturationState | None:
    """The state at `now` when the target could not be read (a failed, timed-out or
    unreadable scrape, or a window of one scrape, which measures nothing): unchanged, since
    nothing read ended the episode nor prolonged it (but for `unread_since`, set at the
    first such evaluation), until it outlasts the staleness, a saturated one the staleness
    and `keep_seconds` (`outlasted`); then None: that long without evidence, the episode is
    over (as Prometheus' lookback ends a series).
    """
    if state.read_at is None:
        return None
    since = now if state.unread_since is None else state.unread_since
    if outlasted(since, state.read_at, state.saturated, now, stale_seconds, keep_seconds):
        return None
    return state if state.unread_since is not None else replace(state, unread_since=since)


def saturation_after_gap(
    state: SaturationState, now: float, stale_seconds: float, keep_seconds: float
) -> SaturationState | None:
    """The state a scrape at `now` that measured the target continues from: None when the
    evidence before it outlasted the staleness, a saturated one's the staleness and
    `keep_seconds` (`outlasted`: a long outage starts a new episode); after a scrape that
    measured it too, a saturated episode goes on however late this one comes (the
    exporter was late, not its target)."""
    if outlasted(
        state.unread_since, state.read_at, state.saturated, now, stale_seconds, keep_seconds
    ):
        return None
    return state


def outlasted(
    unread_since: float | None,
    read_at: float | None,
    held: bool,
    now: float,
    stale: float,
    keep: float = 0.0,
) -> bool:
    """Too old to carry (a saturation state, or an alert of the alert book): unread for
    longer than `stale` since the first evaluation that could not read the target
    (`unread_since`, None: this one), or, once `held` (saturated, fired), for longer than
    `stale` + `keep`; or, not yet held, its last read older than `stale`: time nobody
    observed does not complete a hold.

    `keep` is the hold for a saturation episode, as the vLLM rules' alert reads its last
    sample within the staleness and keeps firing for the hold (`keep_firing_for`): a
    model server's /metrics times out on end when it is overloaded (67 s on a real vLLM in
    CI), which is no evidence that the overload ended."""
    limit = stale + keep if held else stale
    if now - (now if unread_since is None else unread_since) > limit:
        return True
    return not held and read_at is not None and now - read_at > stale


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


def padding_waste(padding_tokens: float | None, batch_tokens: float | None) -> float | None:
    """Share of the token positions batches carried that were padding: padding over
    real tokens plus padding, from their increases over the window. None without
    tokens batched in the window."""
    if padding_tokens is None or not batch_tokens or batch_tokens <= 0:
        return None
    return padding_tokens / batch_tokens


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
