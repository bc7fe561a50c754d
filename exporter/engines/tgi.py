"""Hugging Face Text Generation Inference (unlabelled `tgi_*` metrics).

TGI's durations are histograms in seconds without a `_seconds` suffix. Its batch is
bounded by `--max-batch-total-tokens` (a token budget, always set) and optionally by
`--max-batch-size` (requests); neither is published, both come from config (`token_cap`,
`cap`). `tgi_batch_current_max_tokens` is what the running batch reserves of the budget.
"""

from __future__ import annotations

from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    histograms_by_key,
    latency_by_key,
    values_by_key,
)

NAME = "tgi"
MARKER = "tgi_"
KEY_LABELS: tuple[str, ...] = ()

RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"
BATCH_TOKENS = "tgi_batch_current_max_tokens"
OUTPUT_TOKENS = "tgi_request_generated_tokens"
LATENCY_FAMILIES = {
    "e2e": "tgi_request_duration",
    "queue": "tgi_request_queue_duration",
    "inference": "tgi_request_inference_duration",
}
FAMILIES = (RUNNING, WAITING, BATCH_TOKENS, OUTPUT_TOKENS, *LATENCY_FAMILIES.values())


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """TGI serves one model: a single series with no identifying labels."""
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    batch_tokens = values_by_key(by_name, BATCH_TOKENS, KEY_LABELS)
    output_tokens = histograms_by_key(by_name, OUTPUT_TOKENS, KEY_LABELS)
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS)
    key = ()
    if key not in running and key not in waiting:
        return []
    e2e = latency.get(key, {}).get("e2e")
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            waiting=waiting.get(key),
            batch_tokens=batch_tokens.get(key),
            requests_total=e2e.count if e2e else None,
            latency=latency.get(key, {}),
            output_tokens=output_tokens.get(key),
        )
    ]
