"""TensorRT-LLM behind Triton (the inflight batcher backend, labels model, version).

The backend's custom metrics are gauges keyed by a label naming the quantity:
`nv_trt_llm_request_metrics{request_type=active|max|waiting|...}` and
`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=used|free|max|...}`. Active
requests are the running batch, `max` is the engine's own cap (max batch size), and KV
usage is used / max blocks. A configured cap overrides the engine's max. The same server exposes
Triton's `nv_inference_*` counters
for the same model: `read_series` joins them into one series per model.
"""

from __future__ import annotations

from batchscope.exporter.core.snapshot import LabelKey, SeriesSnapshot
from batchscope.exporter.engines.grouping import SamplesByName, values_by_key

NAME = "trtllm"
MARKER = "nv_trt_llm_"
KEY_LABELS = ("model", "version")

REQUESTS = "nv_trt_llm_request_metrics"
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
FAMILIES = (REQUESTS, KV_BLOCKS)
LATENCY_FAMILIES: dict[str, str] = {}


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per (model, version) that reports its requests."""

    def by_type(family: str, label: str, value: str) -> dict[LabelKey, float]:
        return values_by_key(by_name, family, KEY_LABELS, where={label: value})

    active = by_type(REQUESTS, "request_type", "active")
    waiting = by_type(REQUESTS, "request_type", "waiting")
    cap = by_type(REQUESTS, "request_type", "max")
    used = by_type(KV_BLOCKS, "kv_cache_block_type", "used")
    blocks = by_type(KV_BLOCKS, "kv_cache_block_type", "max")
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=active.get(key),
            waiting=waiting.get(key),
            engine_cap=cap.get(key) or None,
            kv_usage=used[key] / blocks[key] if blocks.get(key) and key in used else None,
        )
        for key in sorted(set(active) | set(waiting))
    ]
