"""NVIDIA Triton per-model counters (labels model, version).

Triton has no running gauge or latency histogram: its average batch size over the
window is `nv_inference_count / nv_inference_exec_count` (both counters).
"""

from __future__ import annotations

from exporter.samples import SamplesByName, values_by_key
from exporter.snapshot import SeriesSnapshot

NAME = "triton"
MARKER = "nv_inference_"
KEY_LABELS = ("model", "version")

INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
PENDING = "nv_inference_pending_request_count"
SUCCESS = "nv_inference_request_success"
FAMILIES = (INFERENCES, EXECUTIONS, PENDING, SUCCESS)
LATENCY_FAMILIES: dict[str, str] = {}


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per (model, version)."""
    inferences = values_by_key(by_name, INFERENCES, KEY_LABELS)
    executions = values_by_key(by_name, EXECUTIONS, KEY_LABELS)
    pending = values_by_key(by_name, PENDING, KEY_LABELS)
    success = values_by_key(by_name, SUCCESS, KEY_LABELS)
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            waiting=pending.get(key),
            requests_total=success.get(key),
            items_total=inferences.get(key),
            batches_total=executions.get(key),
        )
        for key in sorted(set(inferences) | set(executions))
    ]
