"""NVIDIA Triton per-model counters (labels model, version).

Triton has no running gauge: its average batch size over the window is
`nv_inference_count / nv_inference_exec_count` (both counters). Its latencies are
cumulative microsecond counters by default (a mean per request over the window, from
their increase over `nv_inference_request_success`'s); with `--metrics-config
summary_latencies=true` also summaries with quantiles, and for decoupled models with
`histogram_latencies=true` a first-response histogram in milliseconds.
"""

from __future__ import annotations

from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    latency_by_key,
    quantiles_by_key,
    values_by_key,
)

NAME = "triton"
MARKER = "nv_inference_"
KEY_LABELS = ("model", "version")

INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
PENDING = "nv_inference_pending_request_count"
SUCCESS = "nv_inference_request_success"
MICROSECONDS = 1e-6
MILLISECONDS = 1e-3
# latency kind -> cumulative duration counter (microseconds), over SUCCESS
DURATION_COUNTERS = {
    "e2e": "nv_inference_request_duration_us",
    "queue": "nv_inference_queue_duration_us",
    "inference": "nv_inference_compute_infer_duration_us",
}
# latency kind -> summary with quantiles (microseconds)
SUMMARIES = {
    "e2e": "nv_inference_request_summary_us",
    "queue": "nv_inference_queue_summary_us",
    "inference": "nv_inference_compute_infer_summary_us",
}
LATENCY_FAMILIES = {"ttft": "nv_inference_first_response_histogram_ms"}
FAMILIES = (
    INFERENCES,
    EXECUTIONS,
    PENDING,
    SUCCESS,
    *DURATION_COUNTERS.values(),
    *SUMMARIES.values(),
    *LATENCY_FAMILIES.values(),
)


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per (model, version)."""
    inferences = values_by_key(by_name, INFERENCES, KEY_LABELS)
    executions = values_by_key(by_name, EXECUTIONS, KEY_LABELS)
    pending = values_by_key(by_name, PENDING, KEY_LABELS)
    success = values_by_key(by_name, SUCCESS, KEY_LABELS)
    durations = {
        kind: values_by_key(by_name, family, KEY_LABELS)
        for kind, family in DURATION_COUNTERS.items()
    }
    quantiles = {
        kind: quantiles_by_key(by_name, family, KEY_LABELS, MICROSECONDS)
        for kind, family in SUMMARIES.items()
    }
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS, MILLISECONDS)
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            waiting=pending.get(key),
            requests_total=success.get(key),
            items_total=inferences.get(key),
            batches_total=executions.get(key),
            latency=latency.get(key, {}),
            latency_means={
                kind: (success[key], d[key] * MICROSECONDS)
                for kind, d in durations.items()
                if key in d and key in success
            },
            latency_quantiles={kind: q[key] for kind, q in quantiles.items() if key in q},
        )
        for key in sorted(set(inferences) | set(executions))
    ]
