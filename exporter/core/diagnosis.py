"""The diagnosis: one state per series and target, with a reason an operator can act on.

Pure: `diagnose` reads one `DiagnosisInputs` (what the evaluator measured over the window)
and the target's `SignalSettings`. The states are tried in `DIAGNOSIS_STATES`' order and
the first that matches is the diagnosis; docs/metrics.md explains each, in that order.
The limits a state names are judged with `batchscope.exporter.core.limits`' predicates, so the
state and the binding limit agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchscope.exporter.core.limits import (
    LIMIT_NAMES,
    Limits,
    at_bound,
    deferred_bind,
    kv_short,
    nothing_ran,
    ratio_of,
)
from batchscope.exporter.core.signals import SignalSettings, running_vs_cap
from batchscope.exporter.core.units import percent_text, seconds_text

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
    "work_too_slow",
    "over_budget",
    "healthy",
    "routing",
    "batch_limited",
    "queueing",
    "underloaded",
)
# Latency over the budget: the window's quantile (or mean) exceeds the budget itself.
OVER_BUDGET = 1.0


@dataclass(frozen=True, slots=True)
class Diagnosis:
    state: str
    reason: str


@dataclass(slots=True)
class DiagnosisInputs:
    """What the diagnosis reads about one series (or a target's total) that answered.

    `running` is the batch the diagnosis judges (the evaluator passes the peak of the
    recent scrapes), `waiting` the queue now. `generated_per_second`: tokens generated (a
    batcher: items executed) per second over the window; `finished_per_second`: requests
    finished (or batches executed) per second. `fired_batches`: `running` is the mean
    size of batches a batcher filled and fired, not a continuously refilled batch.
    `batch_tokens` of `token_cap`: the batch against a token budget; whichever cap is
    nearer full is the one the reason names. `tokens_per_step`: the mean tokens an engine
    step carried over the window, judged against `SignalSettings.token_budget`;
    `waiting_deferred`: waiting requests the engine deferred rather than lacked room for.
    `latency_seconds` of `budget_seconds`: the window's latency (`budget_utilization` is
    their ratio); `above_threshold_seconds`: how long utilisation has been at or above the
    saturation threshold in this episode (0 outside one). `limits`: the breakdown of the
    same batch (`batchscope.exporter.core.limits`), whose limits at their bound a reason names.
    """

    running: float | None
    waiting: float | None
    cap: float | None
    kv_usage: float | None
    preemptions_per_second: float | None
    budget_saturated: bool = False
    budget_utilization: float | None = None
    generated_per_second: float | None = None
    finished_per_second: float | None = None
    window_seconds: float = 0.0
    fired_batches: bool = False
    batch_tokens: float | None = None
    token_cap: float | None = None
    tokens_per_step: float | None = None
    waiting_deferred: float | None = None
    latency_seconds: float | None = None
    budget_seconds: float | None = None
    above_threshold_seconds: float = 0.0
    limits: Limits = Limits()


def down_diagnosis(error: str | None) -> Diagnosis:
    """A target that does not answer its /metrics."""
    return Diagnosis("down", f"the target does not answer its /metrics: {error or 'unknown error'}")


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


def _rate_text(x: float) -> str:
    """A rate per second: two significant figures under 10 (0.3), whole above (731)."""
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def _count_text(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.2f}"


def _batch(i: DiagnosisInputs) -> str:
    """The batch against whichever caps are known: requests, and tokens; a batcher's mean
    fired batch against its max batch size."""
    if i.fired_batches:
        return f"batches average {_count_text(i.running or 0)}" + (
            f" of max {_count_text(i.cap)}" if i.cap is not None else ""
        )
    text = f"running {_count_text(i.running or 0)}" + (
        f" of cap {_count_text(i.cap)}" if i.cap is not None else ""
    )
    if i.batch_tokens is not None and i.token_cap is not None:
        text += f" holding {_count_text(i.batch_tokens)} of {_count_text(i.token_cap)} batch tokens"
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


@dataclass(slots=True)
class _Reading:
    """The inputs with what every state's rule derives from them, worked out once."""

    i: DiagnosisInputs
    settings: SignalSettings
    waits: bool
    # Running and waiting by the gauges (vLLM's can read 0 while its counters advance).
    in_flight: float
    # Running against the request cap, and the batch's tokens against the token cap.
    ratio: float | None
    token_ratio: float | None
    # Whichever of the two is nearer full; below_cap: it is below `near_cap`.
    fullest: float | None
    below_cap: bool
    batch: str
    preempting: bool
    kv_full: bool
    kv_short: bool
    # Tokens per step against the per-step token budget.
    budget_ratio: float | None
    # The window's latency is over the budget (not only near it).
    over_budget: bool

    @classmethod
    def of(cls, i: DiagnosisInputs, settings: SignalSettings) -> _Reading:
        ratio = running_vs_cap(i.running, i.cap)
        token_ratio = running_vs_cap(i.batch_tokens, i.token_cap)
        known = [r for r in (ratio, token_ratio) if r is not None]
        fullest = max(known) if known else None
        return cls(
            i=i,
            settings=settings,
            waits=(i.waiting or 0) > 0,
            in_flight=(i.running or 0) + (i.waiting or 0),
            ratio=ratio,
            token_ratio=token_ratio,
            fullest=fullest,
            below_cap=fullest is not None and fullest < settings.near_cap,
            batch=_batch(i),
            preempting=(i.preemptions_per_second or 0) > 0,
            kv_full=i.kv_usage is not None and i.kv_usage >= settings.kv_high,
            kv_short=kv_short(i.kv_usage, i.preemptions_per_second, settings.kv_high),
            budget_ratio=ratio_of(i.tokens_per_step, settings.token_budget),
            over_budget=i.budget_utilization is not None and i.budget_utilization > OVER_BUDGET,
        )


def _idle(r: _Reading) -> Diagnosis | None:
    # A saturated episode means requests ran, whatever the gauges read (limits.nothing_ran).
    i = r.i
    if nothing_ran(i.running, i.waiting, i.preemptions_per_second) and not i.budget_saturated:
        return Diagnosis("idle", "no request is running or waiting")
    return None


def _window_latency(r: _Reading) -> str:
    """The window's latency against the budget, in words: "over the last 20 s, p99 latency
    116 ms of a 50 ms budget (233%)"."""
    i = r.i
    share = percent_text(i.budget_utilization) if i.budget_utilization is not None else "unknown"
    if i.latency_seconds is None and i.budget_utilization is not None:
        # The utilisation last measured, standing (evaluate.series_signals): through a window
        # of one scrape, or one that finished nothing with requests in flight.
        last = f"the latency last measured was {share} of the budget"
        if not i.window_seconds:
            return (
                "the window holds one scrape (the exporter evaluated late) and measures "
                f"nothing; {last}"
            )
        # vLLM's gauges can read 0 while its token counter advances: then the tokens say it.
        doing = (
            f"{_count_text(r.in_flight)} ran or waited"
            if r.in_flight > 0 or not i.generated_per_second
            else f"{_rate_text(i.generated_per_second)} tokens a second were generated"
        )
        return f"no request finished in the last {i.window_seconds:.0f} s while {doing}; {last}"
    if i.latency_seconds is None or i.budget_seconds is None:
        return f"over the last {i.window_seconds:.0f} s, latency {share} of the budget"
    return (
        f"over the last {i.window_seconds:.0f} s, p{r.settings.quantile * 100:g} latency "
        f"{seconds_text(i.latency_seconds)} of a {seconds_text(i.budget_seconds)} budget "
        f"({share})"
    )


def _small_and_unqueued(r: _Reading) -> bool:
    """Nothing waits and the batch has room: it is below every cap it has, or, with no cap
    known, a batcher's batches fire on its max wait before they fill. The latency is then
    not spent queueing or in a full batch; with no cap known and no such trigger, nothing
    says the batch has room."""
    no_cap_but_fires_early = r.fullest is None and "max_wait" in r.i.limits.at_bound
    return not r.waits and (r.below_cap or no_cap_but_fires_early)


def _work_is_the_latency(r: _Reading) -> str:
    """Why batching cannot help a latency over budget with nothing waiting, and what can."""
    if "max_wait" in r.i.limits.at_bound:
        return (
            "nothing waits and batches are small, yet most of them fire on the batcher's max "
            "wait: that wait is part of the latency, so a shorter max wait (or an adaptive "
            "policy) cuts it"
        )
    return (
        "nothing waits and batches are small, so the latency is each request's own serving "
        "time (its execution and the server's handling of it), which batching cannot "
        "shorten: a faster device or server, a smaller or quantized model, shorter inputs or "
        "outputs, or a budget that fits the work can"
    )


def _budget_saturated(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not i.budget_saturated:
        return None
    held = (
        f" for {seconds_text(i.above_threshold_seconds)}" if i.above_threshold_seconds > 0 else ""
    )
    measured = f"; {_window_latency(r)}" if i.budget_utilization is not None else ""
    # Gauges that read no request while an episode is up (requests between scrapes;
    # vLLM's under overload) cannot say that nothing waits.
    misread = r.in_flight == 0
    work = f"; {_work_is_the_latency(r)}" if _small_and_unqueued(r) and not misread else ""
    return Diagnosis(
        "budget_saturated",
        f"latency has stayed at or above {percent_text(r.settings.saturation_threshold)} of "
        f"the budget{held} (saturated after {seconds_text(r.settings.hold_seconds)}){measured}: "
        "the budget is too tight for this traffic, or the server needs more capacity" + work,
    )


def _not_yet_saturated(r: _Reading) -> str:
    """How far an episode over the budget is from counting as saturated."""
    threshold = percent_text(r.settings.saturation_threshold)
    hold = seconds_text(r.settings.hold_seconds)
    so_far = r.i.above_threshold_seconds
    if so_far <= 0:
        return f"it becomes budget-saturated after {hold} at or above {threshold}"
    return (
        f"at or above {threshold} for {seconds_text(so_far)} so far; it becomes "
        f"budget-saturated after {hold}"
    )


def _work_too_slow(r: _Reading) -> Diagnosis | None:
    if not (r.over_budget and _small_and_unqueued(r)):
        return None
    return Diagnosis(
        "work_too_slow",
        f"{_window_latency(r)}, while {r.batch}: {_work_is_the_latency(r)} "
        f"({_not_yet_saturated(r)})",
    )


def _over_budget(r: _Reading) -> Diagnosis | None:
    if not r.over_budget:
        return None
    if r.waits and r.fullest is not None and not r.below_cap:
        where = (
            f"{r.batch} with {_count_text(r.i.waiting)} waiting: requests queue behind a full "
            "batch, so more replicas, or a higher cap where the KV cache has room, shorten "
            "the wait"
        )
    elif r.waits and r.fullest is None:
        where = (
            f"{r.batch} while {_count_text(r.i.waiting)} wait: requests queue, and with no "
            "cap known a full batch cannot be told from one something else holds back; "
            "configure the cap to tell them apart"
        )
    elif r.waits:
        where = (
            f"{r.batch} while {_count_text(r.i.waiting)} wait: requests queue while the "
            "batch is below its cap, so what limits the batch is where the time goes"
        )
    elif r.fullest is None:
        where = (
            f"{r.batch} and nothing waits: with no cap known, a full batch cannot be told "
            "from work too slow for the budget; configure the cap to tell them apart"
        )
    else:
        where = (
            f"{r.batch} and nothing waits: the batch is full and the time goes to running "
            "it; a smaller cap shortens each step, more replicas spread the load"
        )
    return Diagnosis("over_budget", f"{_window_latency(r)}: {where} ({_not_yet_saturated(r)})")


def _stalled(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not (
        r.waits
        and (r.fullest is None or r.below_cap)
        and not r.kv_full
        and not r.preempting
        and progress_stopped(
            i.generated_per_second, i.finished_per_second, i.window_seconds, r.settings
        )
    ):
        return None
    kv = f", KV cache {i.kv_usage:.0%} used" if i.kv_usage is not None else ""
    deferred = (
        f" {_count_text(i.waiting_deferred)} of them are deferred (held back by a "
        "transient constraint: a LoRA budget, a KV transfer, a blocked request), not "
        "short of room: the deferred requests hold the scheduler."
        if deferred_bind(i.waiting, i.waiting_deferred)
        else ""
    )
    return Diagnosis(
        "stalled",
        f"{_count_text(i.waiting)} requests wait, {r.batch}{kv}, no "
        f"preemptions, yet almost nothing was generated or finished in the last "
        f"{i.window_seconds:.0f} s: the scheduler admits nothing while the server still "
        f"answers /metrics.{deferred} Check the engine's logs for a hung worker or a "
        "scheduler error; restarting the server clears it",
    )


def _memory_bound(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not (r.waits and r.below_cap and r.kv_short):
        return None
    evidence = []
    if r.kv_full:
        evidence.append(f"KV cache {i.kv_usage:.0%} full")
    if r.preempting:
        evidence.append(f"{i.preemptions_per_second:.2f} preemptions/s")
    return Diagnosis(
        "memory_bound",
        f"{r.batch} while {_count_text(i.waiting)} wait, "
        f"{' and '.join(evidence)}: KV cache memory limits the batch, a higher cap "
        "will not help",
    )


def _token_budget_bound(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not (
        r.waits
        and (r.fullest is None or r.below_cap)
        and not r.kv_short
        and at_bound(r.budget_ratio, r.settings.near_cap)
    ):
        return None
    kv = f", and the KV cache has room ({i.kv_usage:.0%} used)" if i.kv_usage is not None else ""
    return Diagnosis(
        "token_budget_bound",
        f"{r.batch} while {_count_text(i.waiting)} wait, engine steps carry "
        f"{i.tokens_per_step:.0f} tokens of the {_count_text(r.settings.token_budget)}-token "
        f"budget ({r.budget_ratio:.0%}){kv}: the per-step token budget limits the batch. "
        "A higher --max-num-seqs will not help; a larger --max-num-batched-tokens will, "
        "at the cost of inter-token latency for the running decodes, or serve "
        "prefill-heavy traffic (long prompts) separately",
    )


def _preempting(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not r.preempting:
        return None
    bound = [limit for limit in i.limits.at_bound if limit in LIMIT_NAMES]
    if r.waits and len(bound) > 1:
        named = " and ".join(f"{LIMIT_NAMES[b]} ({i.limits.reading(b)})" for b in bound)
        others = " or ".join(LIMIT_NAMES[b] for b in bound if b != "kv_cache")
        return Diagnosis(
            "preempting",
            f"{r.batch} with {_count_text(i.waiting)} waiting, "
            f"{i.preemptions_per_second:.2f} preemptions/s: {len(bound)} limits are at their "
            f"bound at once, {named}. Running requests are pushed back to the queue for lack "
            f"of KV cache memory, so raising {others} alone will not help until the cache "
            "has more memory",
        )
    return Diagnosis(
        "preempting",
        f"{i.preemptions_per_second:.2f} preemptions/s: the KV cache is short of memory "
        "and running requests are being pushed back to the queue",
    )


def _with_waiting(r: _Reading) -> str:
    return f" with {_count_text(r.i.waiting)} waiting" if r.waits else ""


def _healthy_at_cap(r: _Reading) -> Diagnosis | None:
    if r.ratio is None or not r.ratio >= r.settings.near_cap:  # NaN is not at the cap
        return None
    also = (
        f"; steps also run at the token budget ({r.i.tokens_per_step:.0f} of "
        f"{_count_text(r.settings.token_budget)} tokens), so a higher cap alone will not help"
        if r.waits and at_bound(r.budget_ratio, r.settings.near_cap)
        else ""
    )
    return Diagnosis(
        "healthy",
        r.batch
        + _with_waiting(r)
        + ": continuous batching is doing its job; the next limit is elsewhere"
        + also,
    )


def _healthy_at_token_cap(r: _Reading) -> Diagnosis | None:
    if r.token_ratio is None or not r.token_ratio >= r.settings.near_cap:
        return None
    return Diagnosis(
        "healthy",
        r.batch
        + _with_waiting(r)
        + ": the batch is at its token budget (a token cap, not a request cap): "
        "continuous batching is doing its job, and longer requests make smaller batches",
    )


def _batcher_fires_early(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not (r.waits and r.ratio is not None and i.fired_batches):
        return None
    return Diagnosis(
        "batch_limited",
        f"batches average {_count_text(i.running or 0)} of max {_count_text(i.cap)} while "
        f"{_count_text(i.waiting)} "
        "wait: the batcher fires before batches fill (its max wait or latency budget is "
        "short for this traffic) or execution cannot keep up",
    )


def _batch_limited(r: _Reading) -> Diagnosis | None:
    i = r.i
    if not (r.waits and r.fullest is not None):
        return None
    return Diagnosis(
        "batch_limited",
        f"{r.batch} while {_count_text(i.waiting)} wait, "
        "with no sign of KV pressure: something else limits the batch. Looked at: "
        + _looked_at(i.kv_usage, i.tokens_per_step, r.settings.token_budget, i.waiting_deferred),
    )


def _queueing(r: _Reading) -> Diagnosis | None:
    if not r.waits:
        return None
    return Diagnosis(
        "queueing",
        f"{_count_text(r.i.waiting)} requests wait; configure the cap to tell a full batch "
        "from a limited one",
    )


def _underloaded(r: _Reading) -> Diagnosis:
    return Diagnosis(
        "underloaded",
        "nothing waits now: batches are small because there is little traffic to batch",
    )


DEFAULTS = SignalSettings()

# The rules of an answering target, in DIAGNOSIS_STATES' order: the first match wins, and
# `_underloaded` matches whatever is left.
_RULES: tuple[Callable[[_Reading], Diagnosis | None], ...] = (
    _idle,
    _budget_saturated,
    _stalled,
    _memory_bound,
    _token_budget_bound,
    _preempting,
    _work_too_slow,
    _over_budget,
    _healthy_at_cap,
    _healthy_at_token_cap,
    _batcher_fires_early,
    _batch_limited,
    _queueing,
)


def diagnose(inputs: DiagnosisInputs, settings: SignalSettings = DEFAULTS) -> Diagnosis:
    """One state, with a plain-language reason an operator can act on (the advice of "Continuous Batching: Why
    Your GPU Waits for the Slowest Request"):
    the first of `_RULES` that matches, else underloaded. A target that did not answer is
    `down_diagnosis`; one whose payload could not be read, `unreadable_diagnosis`."""
    reading = _Reading.of(inputs, settings)
    for rule in _RULES:
        found = rule(reading)
        if found is not None:
            return found
    return _underloaded(reading)
