"""Ray Serve `@serve.batch` (labels application, deployment, function_name).

Ray prefixes every metric with `ray_`. A batch queue fills and fires batches, as an
in-house batcher does: the batch is the mean fired batch size over the window
(`ray_serve_actual_batch_size`), the waiting requests are `ray_serve_batch_queue_length`.
Ray does not publish `max_batch_size`, but each batch records its size and its
utilisation (size / max_batch_size x 100), so the cap is their sums' ratio (a configured
cap overrides it). Replicas of one deployment add up.
"""

from __future__ import annotations

from batchscope.exporter.core.snapshot import LabelKey, SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    histograms_by_key,
    latency_by_key,
    values_by_key,
)

NAME = "rayserve"
MARKER = "ray_serve_"
KEY_LABELS = ("application", "deployment", "function_name")

QUEUE_LENGTH = "ray_serve_batch_queue_length"
BATCH_SIZE = "ray_serve_actual_batch_size"
UTILIZATION = "ray_serve_batch_utilization_percent"
BATCHES = "ray_serve_batches_processed"
MILLISECONDS = 1e-3
LATENCY_FAMILIES = {
    "queue": "ray_serve_batch_wait_time_ms",
    "inference": "ray_serve_batch_execution_time_ms",
}
FAMILIES = (QUEUE_LENGTH, BATCH_SIZE, UTILIZATION, BATCHES, *LATENCY_FAMILIES.values())


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per batched function of a deployment."""
    queue = values_by_key(by_name, QUEUE_LENGTH, KEY_LABELS)
    sizes = histograms_by_key(by_name, BATCH_SIZE, KEY_LABELS)
    utilization = histograms_by_key(by_name, UTILIZATION, KEY_LABELS)
    batches = values_by_key(by_name, BATCHES + "_total", KEY_LABELS)
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS, MILLISECONDS)

    def cap(key: LabelKey) -> float | None:
        if key not in sizes or key not in utilization or utilization[key].sum <= 0:
            return None
        return round(sizes[key].sum * 100 / utilization[key].sum)

    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            waiting=queue.get(key),
            engine_cap=cap(key),
            items_total=sizes[key].sum if key in sizes else None,
            batches_total=batches.get(key, sizes[key].count if key in sizes else None),
            latency=latency.get(key, {}),
            batch_size=sizes.get(key),
        )
        for key in sorted(set(queue) | set(sizes))
    ]
