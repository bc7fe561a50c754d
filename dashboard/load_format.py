"""The load-test result format, defined once: what a run record holds and the knee read
off a setting's records. batchscope-loadgen writes it (demo_server/loadgen/report.py); the
Load tests page, the HTML report and the loadgen's own summary read it. Pure.

A run record uses `vllm bench serve`'s field names where the meaning is the same
(RECORD_FIELDS); a step run with `--watch` adds a `batching` object, whose columns the CSV
and the page carry (BATCHING_COLUMNS); a step run against a fleet (several `--url`s) adds
a `by_url` object, each base URL's REPLICA_FIELDS.

The knee is the first step (by offered rate, within one setting) where either
- p99 end-to-end latency crosses the SLO (`--slo-ms`), or
- throughput grew less than KNEE_GROWTH (10%) for a doubling of the offered rate, the
  growth from the step before normalised to a doubling: (t1/t0) ** (1 / log2(r1/r0)) - 1,
  so a sweep of 10, 15, 20 and one of 10, 20, 40 judge the same curve alike.
Where the step carries a `batching` object, the sentence says what bound the batch there:
its binding limit, the batch against the cap, the KV cache and preemptions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchscope.exporter.core.limits import LIMIT_NAMES, UNEXPLAINED

# The fields of a run in the result file and CSV, in order.
RECORD_FIELDS = (
    "setting",
    "rate",
    "arrivals",
    "duration",
    "sent",
    "completed",
    "failed",
    "dropped",
    "errors_by_status",
    "request_throughput",
    "output_throughput",
    "total_output_tokens",
    "mean_e2el_ms",
    "p50_e2el_ms",
    "p90_e2el_ms",
    "p99_e2el_ms",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "slo_ms",
    "goodput",
    "slo_attainment",
    "p99_send_lag_ms",
    "max_send_lag_ms",
    "behind_schedule",
    "over_saturated",
    "stopped_at_s",
)
# What a fleet's `by_url` object holds for each base URL: what it was sent, how it answered.
REPLICA_FIELDS = (
    "sent",
    "completed",
    "failed",
    "errors_by_status",
    "request_throughput",
    "mean_e2el_ms",
    "p50_e2el_ms",
    "p99_e2el_ms",
    "max_outstanding",
)
# The `batching` object's fields the CSV carries (empty for a step without one).
BATCHING_COLUMNS = (
    "binding_limit",
    "diagnosis",
    "running_mean",
    "running_max",
    "cap",
    "waiting_mean",
    "kv_usage_max",
    "preemptions_per_s",
    "tokens_per_step",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`, interpolating linearly between the
    two nearest ranks (as numpy's default does); None when there are no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


# Throughput that grows less than this for a doubling of the offered rate has stopped.
KNEE_GROWTH = 0.10
# KV cache usage at or above this reads "full" in the sentence (the exporter's kv_high).
KV_FULL = 0.95

# What each binding limit means for the settings, said after the limit's name.
CAUSES = {
    "kv_cache": "memory-bound; a higher --max-num-seqs will not help",
    "requests": "bound by the request cap; a higher --max-num-seqs can help while the KV "
    "cache has room",
    "token_budget": "bound by the token budget; a higher --max-num-batched-tokens can help",
    "batch_tokens": "bound by the batch-token cap; a higher --max-batch-total-tokens can help",
    "deferred": "waiting requests were deferred by a transient constraint, not a lack of room",
    "max_wait": "batches fired on the batcher's max wait: the batch is as large as arrivals "
    "within it make it",
    "latency_budget": "batches fired on the batcher's latency budget: the work per batch is "
    "the limit",
    "arrivals": "no batching limit bound (nothing waited): the time per request is the limit, "
    "not the batch",
    "unexplained": "requests waited with no limit at its bound: the metrics do not explain it",
}
# The cause where no limit binds: the gauges read no request at the step.
NO_REQUEST_SEEN = "the gauges read no request"
NO_SIGNALS = "run with --watch METRICS_URL to name what bound the batch"


@dataclass(frozen=True, slots=True)
class Knee:
    """Where a sweep's latency or throughput broke: the step's offered `rate`, `reason`
    ("slo": p99 crossed it; "throughput": it stopped growing), the step's throughput and
    p99, the throughput growth per doubling from the step before (None for the first
    step), the binding limit at the knee (None without `batching`), and the sentence."""

    setting: str
    rate: float
    reason: str
    throughput: float
    p99_ms: float | None
    growth_per_doubling: float | None
    binding_limit: str | None
    sentence: str

    def as_record(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "rate": self.rate,
            "reason": self.reason,
            "throughput": self.throughput,
            "p99_ms": self.p99_ms,
            "growth_per_doubling": self.growth_per_doubling,
            "binding_limit": self.binding_limit,
            "sentence": self.sentence,
        }


def growth_per_doubling(
    rate_before: float, throughput_before: float, rate: float, throughput: float
) -> float | None:
    """Throughput growth between two steps, normalised to a doubling of the offered rate;
    None where it has no meaning (no throughput before, or the rate did not grow)."""
    if throughput_before <= 0 or rate <= rate_before or rate_before <= 0:
        return None
    doublings = math.log2(rate / rate_before)
    return (max(throughput, 0.0) / throughput_before) ** (1.0 / doublings) - 1.0


def find_knee(
    records: Sequence[Mapping[str, Any]], slo_ms: float | None, setting: str = ""
) -> Knee | None:
    """The knee of one setting's steps (result records: `rate`, `request_throughput`,
    `p99_e2el_ms`, optional `batching`), or None when no step breaks."""
    steps = sorted(records, key=lambda r: r["rate"])
    for index, step in enumerate(steps):
        p99 = step.get("p99_e2el_ms")
        throughput = step.get("request_throughput") or 0.0
        growth = None
        if index > 0:
            before = steps[index - 1]
            growth = growth_per_doubling(
                before["rate"], before.get("request_throughput") or 0.0, step["rate"], throughput
            )
        if slo_ms is not None and p99 is not None and p99 > slo_ms:
            reason = "slo"
        elif growth is not None and growth < KNEE_GROWTH:
            reason = "throughput"
        else:
            continue
        batching = step.get("batching")
        binding = batching.get("binding_limit") if batching else None
        knee = Knee(setting, step["rate"], reason, throughput, p99, growth, binding, "")
        return replace(knee, sentence=knee_sentence(knee, slo_ms, batching))
    return None


def sweep_knees(records: Sequence[Mapping[str, Any]], slo_ms: float | None) -> list[Knee]:
    """The knee of each setting's steps (result records), in the order settings first
    appear; settings whose steps never break have none."""
    by_setting: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_setting.setdefault(setting_label(record.get("setting") or {}), []).append(record)
    found = (find_knee(steps, slo_ms, label) for label, steps in by_setting.items())
    return [knee for knee in found if knee is not None]


def setting_label(setting: Mapping[str, float | int]) -> str:
    return " ".join(f"{name}={value:g}" for name, value in setting.items())


def knee_sentence(knee: Knee, slo_ms: float | None, batching: Mapping[str, Any] | None) -> str:
    """The knee in words: where, what broke, and with `batching` what bound the batch."""
    if knee.reason == "slo":
        broke = f"p99 {knee.p99_ms:,.0f} ms crossed the {slo_ms:,.0f} ms SLO"
    else:
        broke = (
            f"throughput stopped at {knee.throughput:.3g} req/s "
            f"({knee.growth_per_doubling:+.0%} for a doubling of the offered rate)"
        )
    head = f"knee at {knee.rate:g} req/s: {broke}"
    if not batching:
        return f"{head}; {NO_SIGNALS}"
    return f"{head}, {batch_words(batching)}: {cause_words(knee.binding_limit, batching)}"


def cause_words(binding: str | None, batching: Mapping[str, Any]) -> str:
    """What bound the batch at a step, from its binding limit (the largest share of the
    readings where something ran or waited). Where that is arrivals but another limit
    bound at other readings (a starved API server hands the engine its requests in
    bursts), it says so, and names the limit that bound the most of those readings."""
    shares = batching.get("binding_shares") or {}
    others = limits_besides_arrivals(shares)
    if binding != "arrivals" or not others:
        return CAUSES.get(str(binding), NO_REQUEST_SEEN)
    limit = max(others, key=others.__getitem__)
    bound = (
        CAUSES[limit] if limit == UNEXPLAINED else f"{LIMIT_NAMES[limit]} bound: {CAUSES[limit]}"
    )
    return (
        f"nothing waited at {shares.get('arrivals', 0.0):.0%} of the readings; "
        f"at {others[limit]:.0%} {bound}"
    )


def limits_besides_arrivals(shares: Mapping[str, float]) -> dict[str, float]:
    """Of a step's binding shares, those of the readings where a limit other than
    arrivals bound (requests waited, or a cap was reached): idle readings and arrivals
    left out."""
    return {
        limit: share
        for limit, share in shares.items()
        if limit in CAUSES and limit != "arrivals" and share > 0
    }


def batch_words(batching: Mapping[str, Any]) -> str:
    """The batch at a step: "the batch stopped at 5 of 8 running with the KV cache full and
    3 preemptions/s" (each part only where it was read)."""
    running = batching.get("running_max")
    cap = batching.get("cap")
    if running is None:
        words = "the batch size was not read"
    elif cap:
        words = f"the batch stopped at {running:g} of {cap:g} running"
    else:
        words = f"the batch stopped at {running:g} running"
    details = []
    kv = batching.get("kv_usage_max")
    if kv is not None:
        details.append("the KV cache full" if kv >= KV_FULL else f"the KV cache at {kv:.0%}")
    preemptions = batching.get("preemptions_per_s")
    if preemptions:
        details.append(f"{preemptions:.3g} preemptions/s")
    waiting = batching.get("waiting_mean")
    if waiting:
        details.append(f"{waiting:.3g} waiting")
    return f"{words} with {' and '.join(details)}" if details else words
