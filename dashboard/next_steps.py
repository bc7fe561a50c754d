"""What an operator should look at next, per diagnosis state, and the checklist of
"Continuous Batching: Why Your GPU Waits for the Slowest Request" (DEV Community),
answered from the signals.

The exporter's diagnosis says what is happening; this says where to go from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchscope.dashboard.formatting import seconds
from batchscope.exporter.core.capacity import fixed_pair
from batchscope.exporter.core.limits import LIMIT_NAMES
from batchscope.exporter.core.signals import SignalSettings

# The exporter's own "near the cap" line, so the checklist and the diagnosis agree.
NEAR_CAP = SignalSettings().near_cap

NEXT_STEP: dict[str, str] = {
    "down": "Check that the server runs and that its /metrics URL answers from the "
    "exporter's machine (host, port, firewall, credentials); the exporter's log has the "
    "scrape error.",
    "unreadable": "The server answers, but a value in its /metrics cannot be read (the "
    "reason names it): check the server's version and metric labels; the other targets are "
    "unaffected.",
    "no_data": "The server answers with its metrics registered but no samples yet: send a "
    "request, or check that its metrics (stats logging) are enabled.",
    "budget_saturated": "The budget is too tight for this traffic, or the server needs "
    "more capacity: raise the budget, add replicas, or shed load. Batching cannot buy "
    "more headroom here.",
    "stalled": "Requests are in the server but nothing finishes: look at the server's own "
    "log and at the device (a hung step, a crashed worker).",
    "memory_bound": "Spend your time on KV cache memory, not on the scheduler: more GPU "
    "memory for the cache (gpu-memory-utilization), shorter max-model-len, a smaller or "
    "quantized KV cache, or more replicas. A higher --max-num-seqs will not help.",
    "token_budget_bound": "Engine steps run at the per-step token budget while requests "
    "wait and the KV cache has room: raise --max-num-batched-tokens (the advice says to "
    "what, and what it costs in inter-token latency), or serve long prompts separately. A "
    "higher --max-num-seqs will not help.",
    "work_too_slow": "Batching cannot help here: nothing waits and batches are small, so "
    "the latency is each request's own serving time. What can: a faster device or server "
    "(one whose CPU is not shared), a smaller or quantized model, shorter inputs or "
    "outputs (max_tokens), or a budget that fits the work. A batcher whose batches fire on "
    "its max wait: shorten the wait.",
    "over_budget": "Latency is over the budget, not yet for the hold: if it stays there, "
    "the budget becomes saturated and the alert fires. Where requests queue behind a full "
    "batch, add replicas (or raise the cap where the KV cache has room); where they queue "
    "below the cap, see what limits the batch above.",
    "preempting": "The KV cache is short of memory at this load: watch whether "
    "preemptions climb with traffic, and give the cache more memory before raising the cap.",
    "batch_limited": "No limit the metrics show is at its bound: the reason lists what was "
    "read. For vLLM, configure the target's max_num_batched_tokens so the token budget can "
    "be judged; for an in-house batcher, look at its max wait and budget. Change one "
    "setting at a time.",
    "routing": "One replica (or data-parallel rank) queues at its limit while another "
    "idles: balance the requests (least-outstanding requests, or vLLM's data-parallel load "
    "balancer) before adding replicas; the replica count recommends none for it.",
    "queueing": "Requests wait and no cap is configured: set the target's cap (vLLM's "
    "--max-num-seqs) so the exporter can tell a full batch from a limited one.",
    "underloaded": "Batches are small because there is little traffic now: nothing to fix at "
    "this load; judge batching again at your busiest hour (the advice reads the whole "
    "window, busier stretches included).",
    "idle": "Nothing runs or waits: send traffic (or wait for the busy hour) to judge batching.",
    "healthy": "Continuous batching is doing its job: the running batch sits near the cap. "
    "The next limit is elsewhere (the cap itself, the device, or the model).",
}


def next_step(state: str) -> str:
    """The next thing to look at for a diagnosis state."""
    return NEXT_STEP.get(state, "See the reason above; docs/metrics.md lists the states.")


# How the Live page names each limit of the exporter's breakdown (exporter/core/limits.py).
LIMIT_LABELS = {
    "requests": "requests (the cap, --max-num-seqs)",
    "kv_cache": "KV cache",
    "token_budget": "token budget (--max-num-batched-tokens)",
    "batch_tokens": "batch tokens (the token cap)",
    "deferred": "deferred requests",
    "max_wait": "max wait (batches fired by the timeout)",
    "latency_budget": "latency budget (batches fired by the budget)",
    "arrivals": "arrivals",
    "unexplained": "no limit the metrics show",
}


@dataclass(frozen=True, slots=True)
class LimitBar:
    """One limit as the Live page draws it: a bar of `fill` (its ratio, 0..1) with `text`,
    marked when it binds; `short`, the line the first screen gives the binding one."""

    label: str
    fill: float | None
    text: str
    binding: bool
    short: str = ""


def limit_bars(limits: dict) -> tuple[str, list[LimitBar], list[str]]:
    """The breakdown (the API's `limits` object) as the Live page shows it: a sentence
    naming the binding limit, a bar per judged limit, and the limits it could not judge
    (each with why)."""
    binding = limits.get("binding")
    at_bound = [LIMIT_LABELS.get(name, name) for name in limits.get("at_bound") or []]
    if not limits.get("readings"):
        headline = "Not judged: the target was not read."
    elif binding is None:
        headline = "No limit binds: the gauges read nothing running or waiting."
    else:
        headline = f"Binding now: **{LIMIT_LABELS.get(binding, binding)}**"
        others = at_bound[1:] if binding in (limits.get("at_bound") or [])[:1] else at_bound
        if others:
            headline += f"; also at its bound: {', '.join(others)}"
        headline += "."
    bars, unjudged = [], []
    for reading in limits.get("readings") or []:
        name, ratio = reading.get("limit", ""), reading.get("ratio")
        label = LIMIT_LABELS.get(name, name)
        if ratio is None:
            if name != "arrivals":
                unjudged.append(f"{label}: {reading.get('reading', '')}")
            continue
        mark = "▶ " if name == binding else ""
        bars.append(
            LimitBar(
                label,
                min(max(ratio, 0.0), 1.0),
                f"{mark}{label}: {ratio:.0%} of its bound, {reading.get('reading', '')}",
                name == binding,
                f"Binds: {LIMIT_NAMES.get(name, label)}, {reading.get('reading', '')}",
            )
        )
    return headline, bars, unjudged


@dataclass(frozen=True, slots=True)
class Check:
    question: str
    answer: str
    # True: fine, False: look here, None: not known from the signals.
    ok: bool | None


def checklist(series: dict) -> list[Check]:
    """The article's checklist, answered from one series' current signals (API dict)."""
    # The batch the diagnosis judged, so that the checklist and the diagnosis agree.
    running = series.get("running_peak", series.get("running"))
    waiting, cap = series.get("waiting"), series.get("cap")
    ratio = running / cap if running is not None and cap else None
    preemptions = series.get("preemptions_per_second")
    static = series.get("static_utilization")
    checks = []
    if ratio is None:
        why = (
            "no cap configured for this target"
            if not cap
            else "the running batch is not read now (the target is down, or does not expose it)"
        )
        checks.append(Check("Does the running batch sit near the cap?", f"unknown: {why}", None))
    else:
        near = ratio >= NEAR_CAP
        waits = (waiting or 0) > 0
        answer = f"running {_n(running)} of {_n(cap)} ({ratio:.0%})"
        if not near and waits:
            answer += f" while {_n(waiting)} wait: something else limits the batch"
        checks.append(Check("Does the running batch sit near the cap?", answer, near or not waits))
    if preemptions is None:
        checks.append(Check("Are requests being preempted?", "unknown over this window", None))
    else:
        checks.append(
            Check(
                "Are requests being preempted?",
                f"{preemptions:.2f} preemptions/s",
                preemptions == 0,
            )
        )
    if static is None:
        checks.append(
            Check(
                "What would static batching waste on this traffic?",
                "unknown: needs the output-length histogram and a cap",
                None,
            )
        )
    else:
        checks.append(
            Check(
                "What would static batching waste on this traffic?",
                f"a static batch would use {static['estimate']:.0%} of its slot-steps "
                f"({static['lower']:.0%} to {static['upper']:.0%}); continuous batching gains "
                f"{static['continuous_batching_gain']:.2f}x here",
                None,
            )
        )
    return checks


def _n(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


# What each advice kind is, as the panel names it (kinds: docs/metrics.md).
ADVICE_LABELS: dict[str, str] = {
    "kv_capacity_tokens": "KV cache capacity",
    "kv_tokens_per_request": "KV tokens per running request, now",
    "kv_tokens_per_request_window": "KV tokens per running request, over the window",
    "kv_tokens_per_request_lengths": "KV tokens per request, from the length mix",
    "kv_cache_fill": "KV cache kept full while requests wait",
    "sustainable_concurrency": "Requests the KV cache holds at today's mix",
    "raise_cap_helps": "Would a higher cap help?",
    "kv_tokens_for_cap": "KV tokens the cap needs",
    "continuous_batching_gain": "Continuous over static batching",
    "arrival_per_second": "Arrival rate",
    "budget_headroom": "Budget headroom",
    "rate_limit_per_second": "Rate at which the batcher runs out",
    "fixed_pair_feasible": "Can a fixed pair keep the budget?",
    "advised_max_wait_seconds": "Advised max_wait",
    "advised_max_batch_size": "Advised max_batch_size",
    "padding_waste": "Padding in batched positions",
}


def advice_value(value: float, unit: str) -> str:
    """One advice number as the panel shows it, with its unit."""
    if unit == "bool":
        return "yes" if value else "no"
    if unit == "ratio":
        return f"{value:.2f}x" if value > 1 else f"{value:.0%}"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    whole = abs(value) >= 100 or float(round(value, 6)).is_integer()
    shown = f"{value:,.0f}" if whole else f"{value:.2f}"
    return f"{shown} {unit}"


def advice_rows(advice: dict) -> list[dict[str, str]]:
    """The advice object of a series as table rows: what, value, confidence, inputs."""
    rows = []
    for item in advice.get("items") or []:
        inputs = ", ".join(f"{k} {_input(v)}" for k, v in (item.get("inputs") or {}).items())
        caveats = "; ".join(item.get("caveats") or [])
        rows.append(
            {
                "what": ADVICE_LABELS.get(item["kind"], item["kind"]),
                "value": advice_value(item["value"], item["unit"]),
                "confidence": item["confidence"] + (f" ({caveats})" if caveats else ""),
                "inputs": inputs,
            }
        )
    return rows


def _input(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"


# Measured latency this many times the device-time model's worst: the rest is elsewhere.
DEVICE_TIME_GAP = 3.0
_COST = "cost_b"


def device_time_note(series: dict) -> str | None:
    """Why the fixed pair's worst latency (a model of the device's time: the wait that
    gathers a batch and the batch's measured execution) is far under the latency measured,
    said where that gap is DEVICE_TIME_GAP times or more; None otherwise."""
    pair_item = next(
        (
            i
            for i in (series.get("advice") or {}).get("items") or []
            if i["kind"] == "fixed_pair_feasible"
        ),
        None,
    )
    measured = series.get("latency_seconds")
    if pair_item is None or measured is None:
        return None
    inputs = pair_item.get("inputs") or {}
    costs = {
        int(k[len(_COST) : -len("_seconds")]): v for k, v in inputs.items() if k.startswith(_COST)
    }
    pair = fixed_pair(inputs["arrival_per_second"], costs, inputs["budget_seconds"])
    if pair is None or measured < DEVICE_TIME_GAP * pair.worst_latency_seconds:
        return None
    waiting = series.get("waiting")
    queued = f" ({_n(waiting)} waiting now)" if waiting else ""
    return (
        f"The latency measured, {seconds(measured)}, is {measured / pair.worst_latency_seconds:.0f} "
        f"times this model's worst ({seconds(pair.worst_latency_seconds)}): the model counts only "
        "the wait that gathers a batch and the batch's measured execution. The rest is time the "
        f"batcher does not time: requests queued in front of it{queued}, the server's own "
        "handling (HTTP, tokenising, serialising) and a CPU shared with other work. The pair "
        "holds once the device's time is the latency; until then, shorten the queue (more "
        "replicas, or shed load)."
    )
