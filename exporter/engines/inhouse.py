"""In-house batchers instrumented with `exporter.instrumentation` (label `batcher`).

A batcher has no "running" gauge: its batch is the fired batch, so the running batch
is read as the mean batch size over the window, against its own max-batch-size gauge.
"""

from __future__ import annotations

from exporter import instrumentation as names
from exporter.promtext import Sample
from exporter.samples import histograms_by_key, values_by_key
from exporter.snapshot import SeriesSnapshot

NAME = "inhouse"
MARKER = names.PREFIX
KEY_LABELS = ("batcher",)

FAMILIES = (
    names.QUEUE_DEPTH, names.BATCH_SIZE, names.REQUEST_LATENCY, names.QUEUE_WAIT,
    names.EXECUTION, names.BATCH_EXECUTION_BY_SIZE, names.REQUESTS,
    names.MAX_BATCH_SIZE, names.LATENCY_BUDGET,
)  # fmt: skip


def _execution_by_size(samples: list[Sample]) -> dict[tuple, dict[int, tuple[float, float]]]:
    counts: dict[tuple, dict[int, float]] = {}
    seconds: dict[tuple, dict[int, float]] = {}
    for s in samples:
        if not s.name.startswith(names.BATCH_EXECUTION_BY_SIZE) or "batch_size" not in s.labels:
            continue
        target = {"_count": counts, "_sum": seconds}.get(
            s.name[len(names.BATCH_EXECUTION_BY_SIZE) :]
        )
        if target is not None:
            key = (("batcher", s.labels.get("batcher", "")),)
            target.setdefault(key, {})[int(s.labels["batch_size"])] = s.value
    return {
        key: {size: (n, seconds.get(key, {}).get(size, 0.0)) for size, n in by_size.items()}
        for key, by_size in counts.items()
    }


def to_series(samples: list[Sample]) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per batcher."""
    depth = values_by_key(samples, names.QUEUE_DEPTH, KEY_LABELS)
    cap = values_by_key(samples, names.MAX_BATCH_SIZE, KEY_LABELS)
    budget = values_by_key(samples, names.LATENCY_BUDGET, KEY_LABELS)
    ok = {
        key: value
        for key, value in values_by_key(
            [s for s in samples if s.labels.get("outcome") == "ok"],
            names.REQUESTS + "_total",
            KEY_LABELS,
        ).items()
    }
    batch_size = histograms_by_key(samples, names.BATCH_SIZE, KEY_LABELS)
    latency = {
        "e2e": histograms_by_key(samples, names.REQUEST_LATENCY, KEY_LABELS),
        "queue": histograms_by_key(samples, names.QUEUE_WAIT, KEY_LABELS),
        "inference": histograms_by_key(samples, names.EXECUTION, KEY_LABELS),
    }
    by_size = _execution_by_size(samples)
    keys = sorted(set(depth) | set(batch_size))
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            waiting=depth.get(key),
            cap=cap.get(key) or None,
            budget_seconds=budget.get(key) or None,
            requests_total=ok.get(key),
            items_total=batch_size[key].sum if key in batch_size else None,
            batches_total=batch_size[key].count if key in batch_size else None,
            latency={kind: h[key] for kind, h in latency.items() if key in h},
            batch_size=batch_size.get(key),
            execution_by_size=by_size.get(key, {}),
        )
        for key in keys
    ]
