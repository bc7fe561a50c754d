"""The derived batching signals of DESIGN.md's table, as pure functions.

Everything here takes plain data and the current time as arguments: no I/O, no clock.
`exporter.core.evaluate` ties the formulas together for one series over one window of scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from exporter.core.histogram import Histogram
from exporter.core.limits import at_bound, deferred_bind, kv_short, ratio_of

# States of the diagnosis, most specific first; docs/metrics.md explains each.
DIAGNOSIS_STATES = (
    "down",
    "unreadable",
    "no_data",
    "idle",
    "budget_saturated",
    "stalled",
    "memory_bound",
    "token_budget_bound",
    "preempting",
    "healthy",
    "batch_limited",
    "queueing",
    "underloaded",
)


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
    hold_seconds: float = 60.0
    near_cap: float = 0.9
    kv_high: float = 0.9
    # Stalled: less progress than this per second over a window at least stall_seconds long.
    stall_rate: float = 0.1
    stall_seconds: float = 20.0
    # A target unread for longer than this ends its held states (`saturation_through_gap`):
    # the hold time, or two scrape intervals where that is longer.
    stale_seconds: float = 60.0


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
    is not taken for a target that stopped answering.
    """

    saturated: bool = False
    above_since: float | None = None
    read_at: float | None = None
    unread_since: float | None = None


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
    latency is known (no traffic finished in the window: nothing is saturated).
    A scrape that failed is no evaluation: see `saturation_through_gap`.
    """
    if utilization is None:
        return SaturationState(read_at=now)
    if state.saturated:
        if utilization < threshold - release_margin:
            return SaturationState(read_at=now)
        return SaturationState(True, state.above_since, now)
    if utilization >= threshold:
        since = state.above_since if state.above_since is not None else now
        return SaturationState(now - since >= hold_seconds, since, now)
    return SaturationState(read_at=now)


def saturation_through_gap(
    state: SaturationState, now: float, stale_seconds: float
) -> SaturationState | None:
    """The state at `now` when the target could not be read (a failed, timed-out or
    unreadable scrape, or a window of one scrape, which measures nothing): unchanged, since
    nothing read ended the episode nor prolonged it (but for `unread_since`, set at the
    first such evaluation), until it outlasts the staleness (`outlasted`); then None:
    that long without evidence, the episode is over (as Prometheus' lookback ends a series).
    """
    if state.read_at is None:
        return None
    since = now if state.unread_since is None else state.unread_since
    if outlasted(since, state.read_at, state.saturated, now, stale_seconds):
        return None
    return state if state.unread_since is not None else replace(state, unread_since=since)


def saturation_after_gap(
    state: SaturationState, now: float, stale_seconds: float
) -> SaturationState | None:
    """The state a scrape at `now` that measured the target continues from: None when the
    evidence before it outlasted the staleness (`outlasted`: a long outage starts a new
    episode); after a scrape that measured it too, a saturated episode goes on however
    late this one comes (the exporter was late, not its target)."""
    if outlasted(state.unread_since, state.read_at, state.saturated, now, stale_seconds):
        return None
    return state


def outlasted(
    unread_since: float | None, read_at: float | None, held: bool, now: float, stale: float
) -> bool:
    """Too old to carry (a saturation state, or an alert of the alert book): unread for
    longer than `stale` since the first evaluation that could not read the target
    (`unread_since`, None: this one); or, not yet `held` (saturated, fired), its last read
    older than `stale`: time nobody observed does not complete a hold."""
    if now - (now if unread_since is None else unread_since) > stale:
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


# ---------------------------------------------------------------- diagnosis


@dataclass(frozen=True, slots=True)
class Diagnosis:
    state: str
    reason: str


def unreadable_diagnosis(error: str) -> Diagnosis:
    """A target that answered but whose payload could not be evaluated."""
    return Diagnosis(
        "unreadable",
        f"the target answers its /metrics but its payload cannot be evaluated: {error}. "
        "Its signals are held back until the payload reads again; other targets are "
        "unaffected. Check the server's metric values and labels",
    )


def no_data_diagnosis() -> Diagnosis:
    """A target whose metric families are registered but carry no sample yet."""
    return Diagnosis(
        "no_data",
        "the target answers its /metrics with its engine's metric families registered but "
        "no samples yet: it has served no request since it started, or its metrics are "
        "not enabled (vLLM: logging of stats must be on). Send a request, or check the "
        "server's metrics settings",
    )


def _count_text(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.2f}"


def _batch(
    running: float | None, cap: float | None, tokens: float | None, token_cap: float | None
) -> str:
    """The running batch against whichever caps are known: requests, and tokens."""
    text = f"running {_count_text(running or 0)}" + (
        f" of cap {_count_text(cap)}" if cap is not None else ""
    )
    if tokens is not None and token_cap is not None:
        text += f" holding {_count_text(tokens)} of {_count_text(token_cap)} batch tokens"
    return text


def _looked_at(
    kv_usage: float | None,
    tokens_per_step: float | None,
    token_budget: float | None,
    waiting_deferred: float | None,
) -> str:
    """What `batch_limited` read before it said that no metric explains the batch."""
    seen = ["the request cap"]
    seen.append(
        f"the KV cache ({kv_usage:.0%} used, no preemptions)"
        if kv_usage is not None
        else "preemptions (the KV cache usage is not exposed)"
    )
    if tokens_per_step is not None and token_budget is not None:
        seen.append(f"the token budget ({tokens_per_step:.0f} of {token_budget:.0f} per step)")
    elif tokens_per_step is not None:
        seen.append(
            f"tokens per step ({tokens_per_step:.0f}), but not against a token budget: set "
            "`max_num_batched_tokens` (vLLM's --max-num-batched-tokens) to judge it"
        )
    else:
        seen.append("no tokens per step (the engine does not expose them)")
    if waiting_deferred is not None:
        seen.append(f"deferred requests ({_count_text(waiting_deferred)})")
    return ", ".join(seen)


def rejections_note(diagnosis: Diagnosis, rejected_per_second: float | None) -> Diagnosis:
    """The diagnosis, adding the requests refused at admission whenever there are any:
    lost work that no latency histogram shows, whatever the state."""
    if not rejected_per_second:
        return diagnosis
    return Diagnosis(
        diagnosis.state,
        f"{diagnosis.reason}; {rejected_per_second:.2f} requests/s were refused at admission "
        "by a queue limit (vLLM: --max-num-queued-reqs, --max-num-queued-tokens; a batcher: "
        "its queue or budget): lost work that no latency histogram shows",
    )


def mean_latency_note(diagnosis: Diagnosis, mean_seconds: float) -> Diagnosis:
    """The diagnosis, saying that the latency it was judged on is a mean, not a quantile."""
    if diagnosis.state in ("down", "idle"):
        return diagnosis
    return Diagnosis(
        diagnosis.state,
        f"{diagnosis.reason} (latency: only a mean is exposed, {mean_seconds:.3f} s per request "
        "over the window; the tail is longer, so budget utilisation is a lower bound)",
    )


def progress_stopped(
    generated_per_second: float | None,
    finished_per_second: float | None,
    window_seconds: float,
    settings: SignalSettings,
) -> bool:
    """Generation has (nearly) stopped: every known progress rate is under `stall_rate`
    over a window of at least `stall_seconds`. False when no rate is known or the window
    is too short to tell a stall from a long prefill."""
    known = [r for r in (generated_per_second, finished_per_second) if r is not None]
    if not known or window_seconds < settings.stall_seconds:
        return False
    return all(r < settings.stall_rate for r in known)


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
    generated_per_second: float | None = None,
    finished_per_second: float | None = None,
    window_seconds: float = 0.0,
    fired_batches: bool = False,
    batch_tokens: float | None = None,
    token_cap: float | None = None,
    tokens_per_step: float | None = None,
    waiting_deferred: float | None = None,
    settings: SignalSettings = SignalSettings(),
) -> Diagnosis:
    """One state, with a plain-language reason an operator can act on (seed 003's advice).

    `generated_per_second`: tokens generated (a batcher: items executed) per second over
    the window; `finished_per_second`: requests finished (or batches executed) per second.
    `fired_batches`: `running` is the mean size of batches a batcher filled and fired,
    not a continuously refilled batch. `batch_tokens` of `token_cap`: the batch against
    a token budget; whichever cap is nearer full is the one the reason names.
    `tokens_per_step`: the mean tokens an engine step carried over the window, judged
    against `settings.token_budget`; `waiting_deferred`: waiting requests the engine
    deferred rather than lacked room for. The limits these name are judged with
    `exporter.core.limits`' predicates, so the state and the binding limit agree.
    """
    if not up:
        return Diagnosis(
            "down", f"the target does not answer its /metrics: {error or 'unknown error'}"
        )
    busy = (running or 0) + (waiting or 0)
    if busy == 0:
        return Diagnosis("idle", "no request is running or waiting")
    if budget_saturated:
        level = (
            f"at {budget_utilization:.0%}"
            if budget_utilization is not None
            else f"at or above {settings.saturation_threshold:.0%}"
        )
        return Diagnosis(
            "budget_saturated",
            f"latency has stayed {level} of the budget: the budget is too tight for this "
            "traffic, or the server needs more capacity",
        )
    waits = (waiting or 0) > 0
    ratio = running_vs_cap(running, cap)
    token_ratio = running_vs_cap(batch_tokens, token_cap)
    known = [r for r in (ratio, token_ratio) if r is not None]
    fullest = max(known) if known else None
    below_cap = fullest is not None and fullest < settings.near_cap
    batch = _batch(running, cap, batch_tokens, token_cap)
    preempting = (preemptions_per_second or 0) > 0
    kv_full = kv_usage is not None and kv_usage >= settings.kv_high
    budget_ratio = ratio_of(tokens_per_step, settings.token_budget)
    if (
        waits
        and (fullest is None or below_cap)
        and not kv_full
        and not preempting
        and progress_stopped(generated_per_second, finished_per_second, window_seconds, settings)
    ):
        kv = f", KV cache {kv_usage:.0%} used" if kv_usage is not None else ""
        deferred = (
            f" {_count_text(waiting_deferred)} of them are deferred (held back by a "
            "transient constraint: a LoRA budget, a KV transfer, a blocked request), not "
            "short of room: the deferred requests hold the scheduler."
            if deferred_bind(waiting, waiting_deferred)
            else ""
        )
        return Diagnosis(
            "stalled",
            f"{_count_text(waiting)} requests wait, {batch}{kv}, no "
            f"preemptions, yet almost nothing was generated or finished in the last "
            f"{window_seconds:.0f} s: the scheduler admits nothing while the server still "
            f"answers /metrics.{deferred} Check the engine's logs for a hung worker or a "
            "scheduler error; restarting the server clears it",
        )
    if waits and below_cap and kv_short(kv_usage, preemptions_per_second, settings.kv_high):
        evidence = []
        if kv_full:
            evidence.append(f"KV cache {kv_usage:.0%} full")
        if preempting:
            evidence.append(f"{preemptions_per_second:.2f} preemptions/s")
        return Diagnosis(
            "memory_bound",
            f"{batch} while {_count_text(waiting)} wait, "
            f"{' and '.join(evidence)}: KV cache memory limits the batch, a higher cap "
            "will not help",
        )
    if (
        waits
        and (fullest is None or below_cap)
        and not kv_short(kv_usage, preemptions_per_second, settings.kv_high)
        and at_bound(budget_ratio, settings.near_cap)
    ):
        kv = f", and the KV cache has room ({kv_usage:.0%} used)" if kv_usage is not None else ""
        return Diagnosis(
            "token_budget_bound",
            f"{batch} while {_count_text(waiting)} wait, engine steps carry "
            f"{tokens_per_step:.0f} tokens of the {_count_text(settings.token_budget)}-token "
            f"budget ({budget_ratio:.0%}){kv}: the per-step token budget limits the batch. "
            "A higher --max-num-seqs will not help; a larger --max-num-batched-tokens will, "
            "at the cost of inter-token latency for the running decodes, or serve "
            "prefill-heavy traffic (long prompts) separately",
        )
    if preempting:
        return Diagnosis(
            "preempting",
            f"{preemptions_per_second:.2f} preemptions/s: the KV cache is short of memory "
            "and running requests are being pushed back to the queue",
        )
    if ratio is not None and ratio >= settings.near_cap:
        also = (
            f"; steps also run at the token budget ({tokens_per_step:.0f} of "
            f"{_count_text(settings.token_budget)} tokens), so a higher cap alone will not help"
            if waits and at_bound(budget_ratio, settings.near_cap)
            else ""
        )
        return Diagnosis(
            "healthy",
            batch
            + (f" with {_count_text(waiting)} waiting" if waits else "")
            + ": continuous batching is doing its job; the next limit is elsewhere"
            + also,
        )
    if token_ratio is not None and token_ratio >= settings.near_cap:
        return Diagnosis(
            "healthy",
            batch
            + (f" with {_count_text(waiting)} waiting" if waits else "")
            + ": the batch is at its token budget (a token cap, not a request cap): "
            "continuous batching is doing its job, and longer requests make smaller batches",
        )
    if waits and ratio is not None and fired_batches:
        return Diagnosis(
            "batch_limited",
            f"batches average {_count_text(running or 0)} of max {_count_text(cap)} while "
            f"{_count_text(waiting)} "
            "wait: the batcher fires before batches fill (its max wait or latency budget is "
            "short for this traffic) or execution cannot keep up",
        )
    if waits and fullest is not None:
        return Diagnosis(
            "batch_limited",
            f"{batch} while {_count_text(waiting)} wait, "
            "with no sign of KV pressure: something else limits the batch. Looked at: "
            + _looked_at(kv_usage, tokens_per_step, settings.token_budget, waiting_deferred),
        )
    if waits:
        return Diagnosis(
            "queueing",
            f"{_count_text(waiting)} requests wait; configure the cap to tell a full batch from a "
            "limited one",
        )
    return Diagnosis(
        "underloaded",
        "nothing waits: batches are small because there is little traffic to batch",
    )
