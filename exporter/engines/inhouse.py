"""In-house batchers instrumented with `batchscope.exporter.instrumentation` (label `batcher`).

A batcher has no "running" gauge: its batch is the fired batch, so the running batch
is read as the mean batch size over the window, against its own max-batch-size gauge.
"""

from __future__ import annotations

from batchscope.exporter import instrumentation as names
from batchscope.exporter.core.snapshot import LabelKey, SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    histograms_by_key,
    latency_by_key,
    series_key,
    values_by_key,
)

NAME = "inhouse"
MARKER = names.PREFIX
KEY_LABELS = ("batcher",)

FAMILIES = (
    names.QUEUE_DEPTH,
    names.BATCH_SIZE,
    names.REQUEST_LATENCY,
    names.QUEUE_WAIT,
    names.EXECUTION,
    names.BATCH_EXECUTION_BY_SIZE,
    names.REQUESTS,
    names.MAX_BATCH_SIZE,
    names.MAX_WAIT,
    names.LATENCY_BUDGET,
    names.BATCH_TOKENS,
    names.BATCHES,
)
LATENCY_FAMILIES = {
    "e2e": names.REQUEST_LATENCY,
    "queue": names.QUEUE_WAIT,
    "inference": names.EXECUTION,
}


def _execution_by_size(by_name: SamplesByName) -> dict[LabelKey, dict[int, tuple[float, float]]]:
    """Per batcher: batch size -> (batches, execution seconds), from the by-size summary."""
    counts: dict[LabelKey, dict[int, float]] = {}
    seconds: dict[LabelKey, dict[int, float]] = {}
    for suffix, target in (("_count", counts), ("_sum", seconds)):
        for s in by_name.get(names.BATCH_EXECUTION_BY_SIZE + suffix, ()):
            size = s.labels.get("batch_size")
            if size is None:
                continue
            if not size.isdigit():
                raise ValueError(f"{s.name}: batch_size={size!r} is not a whole number")
            target.setdefault(series_key(s.labels, KEY_LABELS), {})[int(size)] = s.value
    return {
        key: {size: (n, seconds.get(key, {}).get(size, 0.0)) for size, n in by_size.items()}
        for key, by_size in counts.items()
    }


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per batcher."""
    depth = values_by_key(by_name, names.QUEUE_DEPTH, KEY_LABELS)
    cap = values_by_key(by_name, names.MAX_BATCH_SIZE, KEY_LABELS)
    budget = values_by_key(by_name, names.LATENCY_BUDGET, KEY_LABELS)
    max_wait = values_by_key(by_name, names.MAX_WAIT, KEY_LABELS)
    ok = values_by_key(by_name, names.REQUESTS + "_total", KEY_LABELS, where={"outcome": "ok"})
    rejected = values_by_key(
        by_name, names.REQUESTS + "_total", KEY_LABELS, where={"outcome": "rejected"}
    )
    batch_size = histograms_by_key(by_name, names.BATCH_SIZE, KEY_LABELS)
    # Every kind adds up to the positions batched; the padding kind alone is the waste.
    batch_tokens = values_by_key(by_name, names.BATCH_TOKENS + "_total", KEY_LABELS)
    padding = values_by_key(
        by_name, names.BATCH_TOKENS + "_total", KEY_LABELS, where={"kind": "padding"}
    )
    triggers = {
        trigger: values_by_key(
            by_name, names.BATCHES + "_total", KEY_LABELS, where={"trigger": trigger}
        )
        for trigger in names.TRIGGERS
    }
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS)
    by_size = _execution_by_size(by_name)
    keys = sorted(set(depth) | set(batch_size))
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            waiting=depth.get(key),
            cap=cap.get(key) or None,
            budget_seconds=budget.get(key) or None,
            max_wait_seconds=max_wait.get(key),
            requests_total=ok.get(key),
            rejections_total=rejected.get(key),
            items_total=batch_size[key].sum if key in batch_size else None,
            batches_total=batch_size[key].count if key in batch_size else None,
            batch_tokens_total=batch_tokens.get(key),
            padding_tokens_total=padding.get(key),
            latency=latency.get(key, {}),
            batch_size=batch_size.get(key),
            execution_by_size=by_size.get(key, {}),
            batches_by_trigger={
                trigger: by_key[key] for trigger, by_key in triggers.items() if key in by_key
            },
        )
        for key in keys
    ]
