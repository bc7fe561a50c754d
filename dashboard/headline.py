"""The Live page's words of one line: a state's headline (at most 12 words, naming the
numbers it was judged on) and a saturation banner's title. Pure: the exporter's JSON in,
text out; the full reason stays the diagnosis' own, one click away.
"""

from __future__ import annotations

from collections.abc import Callable

from batchscope.dashboard.formatting import exposed, number, percent, plain_markdown, seconds
from batchscope.exporter.core.limits import LIMIT_NAMES

HEADLINE_WORDS = 12
# A target name longer than this is cut in a banner's title, so that it stays one line.
BANNER_NAME_CHARS = 40


def _n(value: float | None) -> str:
    """A count: whole numbers without decimals, others with one."""
    return number(value, 1)


def batch_words(series: dict) -> str:
    """The batch the diagnosis judged, against its cap: "3 of 8 running"; a batcher's
    "batches of 3 of 32"; a token cap's "15500 of 16000 batch tokens"."""
    cap = series.get("cap")
    if not exposed(series, "running"):
        mean = series.get("mean_batch_size", series.get("running_peak"))
        return f"batches of {_n(mean)}" + (f" of {_n(cap)}" if cap is not None else "")
    if cap is None and series.get("token_cap") is not None:
        return f"{_n(series.get('batch_tokens'))} of {_n(series['token_cap'])} batch tokens"
    running = _n(series.get("running_peak", series.get("running")))
    return f"{running} of {_n(cap)} running" if cap is not None else f"{running} running"


def statistic(series: dict) -> str:
    """The latency statistic judged against the budget: "p99", or "mean"."""
    if series.get("latency_statistic") == "mean":
        return "mean"
    return f"p{(series.get('latency_quantile') or 0.99) * 100:g}"


def _used(series: dict) -> str:
    """ "p99 at 497% of the 2 s budget"; the share alone without a latency now."""
    share = percent(series.get("budget_utilization"))
    budget = series.get("budget_seconds")
    of = f"of the {seconds(budget)} budget" if budget is not None else "of the budget"
    if series.get("latency_seconds") is None:
        return f"budget used {share}"
    return f"{statistic(series)} at {share} {of}"


def _waiting(series: dict) -> str:
    return f"{_n(series.get('waiting'))} waiting"


def _saturated(s: dict) -> str:
    return f"{_used(s)} for {seconds(s.get('budget_saturated_seconds') or 0.0)}"


def _memory_bound(s: dict) -> str:
    kv, preemptions = s.get("kv_cache_usage"), s.get("preemptions_per_second")
    evidence = [f"KV {percent(kv)} full"] if kv is not None else []
    if preemptions:
        evidence.append(f"{preemptions:.2f} preemptions/s")
    if len(evidence) == 1 and kv is not None:
        evidence = [f"KV cache {percent(kv)} full"]
    return f"{batch_words(s)}, {_waiting(s)}: {', '.join(evidence) or 'short of KV cache'}"


def _token_budget(s: dict) -> str:
    steps = s.get("token_budget_ratio")
    share = percent(steps) if steps is not None else "the bound"
    return f"{batch_words(s)}, {_waiting(s)}: steps at {share} of token budget"


def _preempting(s: dict) -> str:
    rate = f"{s.get('preemptions_per_second') or 0.0:.2f} preemptions/s"
    kv = s.get("kv_cache_usage")
    kv_words = f"KV {percent(kv)}" if kv is not None else "KV cache short"
    if s.get("waiting"):
        return f"{batch_words(s)}, {_waiting(s)}, {kv_words}, {rate}"
    return f"{rate}, {kv_words}: short of memory"


def _too_slow(s: dict) -> str:
    latency, budget = seconds(s.get("latency_seconds")), seconds(s.get("budget_seconds"))
    share = percent(s.get("budget_utilization"))
    return f"{statistic(s)} {latency} of a {budget} budget ({share}); nothing waits"


def _over_budget(s: dict) -> str:
    used = f"{statistic(s)} {percent(s.get('budget_utilization'))} of budget"
    return f"{used}; {batch_words(s)}, {_waiting(s)}"


def _healthy(s: dict) -> str:
    waiting = f", {_waiting(s)}" if s.get("waiting") else ""
    return f"{batch_words(s)}{waiting}: batching is doing its job"


def _batch_limited(s: dict) -> str:
    if not exposed(s, "running"):
        return f"{batch_words(s)} while {_n(s.get('waiting'))} wait: fired before full"
    return f"{batch_words(s)} while {_n(s.get('waiting'))} wait; no metric shows why"


HEADLINES: dict[str, Callable[[dict], str]] = {
    "down": lambda s: "Its /metrics does not answer; the last data stays shown",
    "unreadable": lambda s: "Its /metrics answers, but a value in it cannot be read",
    "no_data": lambda s: "Metrics registered with no samples yet: no request served",
    "idle": lambda s: f"{_n(s.get('running') or 0)} running, {_waiting(s)}: no traffic to judge",
    "budget_saturated": _saturated,
    "stalled": lambda s: f"{_waiting(s)}, {batch_words(s)}, nothing finishing",
    "memory_bound": _memory_bound,
    "token_budget_bound": _token_budget,
    "preempting": _preempting,
    "work_too_slow": _too_slow,
    "over_budget": _over_budget,
    "healthy": _healthy,
    "batch_limited": _batch_limited,
    "routing": lambda s: f"{batch_words(s)}, {_waiting(s)}: one rank queues, another idles",
    "queueing": lambda s: f"{_waiting(s)}, and no cap configured to judge the batch",
    "underloaded": lambda s: f"{batch_words(s)}, nothing waiting: little traffic to batch",
}


def headline(series: dict) -> str:
    """What the state means for this series, with its numbers, in at most 12 words; a
    state this page does not know: the start of the diagnosis' own reason."""
    diagnosis = series.get("diagnosis") or {}
    words = HEADLINES.get(diagnosis.get("state", ""))
    if words is not None:
        return words(series)
    reason = (diagnosis.get("reason") or "").split()
    cut = " ".join(reason[:HEADLINE_WORDS])
    return cut + ("…" if len(reason) > HEADLINE_WORDS else "")


def banner_title(target: dict) -> str:
    """A saturated target's banner in one line (markdown): its name, the state, for how
    long, and how far over its budget."""
    total = target.get("total") or {}
    name = target.get("target", "")
    if len(name) > BANNER_NAME_CHARS:
        name = name[: BANNER_NAME_CHARS - 1] + "…"
    lasted = seconds(total.get("budget_saturated_seconds") or 0.0)
    measured = total.get("budget_utilization") is not None
    over = _used(total) if measured else "no latency measured now"
    return f"**Budget saturated: {plain_markdown(name)}** for {lasted}, {over}"


def replicas_line(model: dict | None) -> str | None:
    """The replica count of the model this target serves, in one line with its why:
    "Replicas of llama: 1 now, 2 recommended: 27.9 requests/s asked, 14.2 a replica
    serves at the request cap"; None where the exporter sends no count for it."""
    if not model:
        return None
    now = model.get("replicas") or 0
    head = f"Replicas of {model.get('model', '')}: {now} now"
    desired = model.get("desired_replicas")
    if desired is None:
        why = "not read lately" if model.get("stale") else "not measured yet"
        return f"{head}, no recommendation ({why})"
    head += f", {desired} recommended"
    pending = model.get("pending") or {}
    if pending.get("replicas") not in (None, desired):
        head += f" ({pending['replicas']} once it holds)"
    state = model.get("state")
    if state == "routing":
        return f"{head}: routed unevenly, not short of capacity"
    if state == "idle":
        return f"{head}: idle, the minimum"
    demand = (model.get("demand") or {}).get("per_second")
    capacity = model.get("capacity") or {}
    if demand is None or capacity.get("per_second") is None:
        return head
    limit = LIMIT_NAMES.get(capacity.get("limit") or "", capacity.get("limit") or "its limit")
    return (
        f"{head}: {_n(demand)} requests/s asked, {_n(capacity['per_second'])} a replica "
        f"serves at {limit}"
    )


def model_of(target: str, replicas: dict | None) -> dict | None:
    """The model (of /api/v1/replicas) that `target` serves: the one whose spread names it."""
    for model in (replicas or {}).get("models") or ():
        if any(r.get("target") == target for r in model.get("spread") or ()):
            return model
    return None
