"""Hugging Face Text Generation Inference (unlabelled `tgi_*` metrics)."""

from __future__ import annotations

from exporter.samples import SamplesByName, histograms_by_key, values_by_key
from exporter.snapshot import SeriesSnapshot

NAME = "tgi"
MARKER = "tgi_"
KEY_LABELS: tuple[str, ...] = ()

RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"
OUTPUT_TOKENS = "tgi_request_generated_tokens"
LATENCY_FAMILIES = {
    "e2e": "tgi_request_duration",
    "queue": "tgi_request_queue_duration",
    "inference": "tgi_request_inference_duration",
}
FAMILIES = (RUNNING, WAITING, OUTPUT_TOKENS, *LATENCY_FAMILIES.values())


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """TGI serves one model: a single series with no identifying labels."""
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    output_tokens = histograms_by_key(by_name, OUTPUT_TOKENS, KEY_LABELS)
    latency = {
        kind: histograms_by_key(by_name, family, KEY_LABELS)
        for kind, family in LATENCY_FAMILIES.items()
    }
    key = ()
    if key not in running and key not in waiting:
        return []
    e2e = latency["e2e"].get(key)
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            waiting=waiting.get(key),
            requests_total=e2e.count if e2e else None,
            latency={kind: h[key] for kind, h in latency.items() if key in h},
            output_tokens=output_tokens.get(key),
        )
    ]
