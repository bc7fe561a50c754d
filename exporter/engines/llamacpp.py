"""llama.cpp's server (`llama-server --metrics`, unlabelled `llamacpp:*` metrics).

Each of its `--parallel` slots holds one request: processing requests are the running
batch, deferred ones wait. The slot count is not published: the cap comes from config.
`kv_cache_usage_ratio` was published until the 2025 unified KV cache; newer builds leave
KV usage unknown.
"""

from __future__ import annotations

from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines.grouping import SamplesByName, values_by_key

NAME = "llamacpp"
MARKER = "llamacpp:"
KEY_LABELS: tuple[str, ...] = ()

RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"
GENERATED = "llamacpp:tokens_predicted"
FAMILIES = (RUNNING, WAITING, KV_USAGE, GENERATED)
LATENCY_FAMILIES: dict[str, str] = {}


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One server, one series with no identifying labels."""
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    kv = values_by_key(by_name, KV_USAGE, KEY_LABELS)
    generated = values_by_key(by_name, GENERATED + "_total", KEY_LABELS)
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            waiting=waiting.get(key),
            kv_usage=kv.get(key),
            generation_tokens_total=generated.get(key),
        )
        for key in sorted(set(running) | set(waiting))
    ]
