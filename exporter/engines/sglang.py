"""SGLang (0.4-era schema, label model_name)."""

from __future__ import annotations

from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    latency_by_key,
    values_by_key,
)

NAME = "sglang"
MARKER = "sglang:"
KEY_LABELS = ("model_name",)

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
GENERATION_TOKENS = "sglang:generation_tokens"
LATENCY_FAMILIES = {
    "e2e": "sglang:e2e_request_latency_seconds",
    "ttft": "sglang:time_to_first_token_seconds",
    "tpot": "sglang:time_per_output_token_seconds",
}
FAMILIES = (RUNNING, WAITING, TOKEN_USAGE, GENERATION_TOKENS, *LATENCY_FAMILIES.values())


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per model_name; token_usage is SGLang's KV cache usage (0..1)."""
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    usage = values_by_key(by_name, TOKEN_USAGE, KEY_LABELS)
    tokens = values_by_key(by_name, GENERATION_TOKENS + "_total", KEY_LABELS)
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS)
    finished = {key: kinds["e2e"].count for key, kinds in latency.items() if "e2e" in kinds}
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            waiting=waiting.get(key),
            kv_usage=usage.get(key),
            requests_total=finished.get(key),
            generation_tokens_total=tokens.get(key),
            latency=latency.get(key, {}),
        )
        for key in sorted(set(running) | set(waiting))
    ]
