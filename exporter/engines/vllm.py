"""vLLM: V1 (0.8+, labels model_name and engine) and V0 (model_name only).

`gpu_cache_usage_perc` became `kv_cache_usage_perc` in 0.9; counters carry `_total`
with `_created` siblings. vLLM does not expose `max_num_seqs`: the cap comes from config.
"""

from __future__ import annotations

from exporter.samples import (
    SamplesByName,
    histograms_by_key,
    histograms_by_kind,
    of_key,
    values_by_key,
)
from exporter.snapshot import SeriesSnapshot

NAME = "vllm"
MARKER = "vllm:"
KEY_LABELS = ("model_name", "engine")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SWAPPED = "vllm:num_requests_swapped"
PREEMPTIONS = "vllm:num_preemptions"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
REQUEST_SUCCESS = "vllm:request_success"
GENERATION_TOKENS = "vllm:generation_tokens"
OUTPUT_TOKENS = "vllm:request_generation_tokens"
LATENCY_FAMILIES = {
    "e2e": "vllm:e2e_request_latency_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
}

FAMILIES = (
    RUNNING, WAITING, SWAPPED, PREEMPTIONS, KV_USAGE, KV_USAGE_OLD,
    REQUEST_SUCCESS, GENERATION_TOKENS, OUTPUT_TOKENS, *LATENCY_FAMILIES.values(),
)  # fmt: skip


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per (model_name, engine) that any scheduler metric names."""
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    swapped = values_by_key(by_name, SWAPPED, KEY_LABELS)
    preemptions = values_by_key(by_name, PREEMPTIONS + "_total", KEY_LABELS)
    kv = values_by_key(by_name, KV_USAGE, KEY_LABELS) or values_by_key(
        by_name, KV_USAGE_OLD, KEY_LABELS
    )
    finished = values_by_key(by_name, REQUEST_SUCCESS + "_total", KEY_LABELS)
    tokens = values_by_key(by_name, GENERATION_TOKENS + "_total", KEY_LABELS)
    output_tokens = histograms_by_key(by_name, OUTPUT_TOKENS, KEY_LABELS)
    latency = histograms_by_kind(by_name, LATENCY_FAMILIES, KEY_LABELS)
    keys = sorted(set(running) | set(waiting) | set(kv) | set(preemptions) | set(finished))
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            # V0 swapped requests wait too: they hold no running slot.
            waiting=_add(waiting.get(key), swapped.get(key)),
            preemptions_total=preemptions.get(key),
            kv_usage=kv.get(key),
            requests_total=finished.get(key),
            generation_tokens_total=tokens.get(key),
            latency=of_key(latency, key),
            output_tokens=output_tokens.get(key),
        )
        for key in keys
    ]


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b
