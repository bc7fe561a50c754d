"""Every metric name the project emits is documented in docs/metrics.md."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.signals import SignalSettings
from exporter.engines import ADAPTERS
from exporter.instrumentation import BatcherMetrics
from tests.test_collector import PAYLOADS, exposition

DOC = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()
DOCUMENTED = set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", DOC))


def undocumented_engines(doc: str, adapters: Mapping[str, ModuleType]) -> dict[str, list[str]]:
    """Per adapter missing from the doc: what is missing (its row, metrics it reads).

    A row belongs to an engine when its first cell names the engine as `--engine`
    takes it; a metric is documented when its name (or its counter's `_total`) is.
    """
    reads = doc.split("## What the exporter reads", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in reads.splitlines() if line.startswith("|")]
    with_rows = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    documented = set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", doc))
    missing = {}
    for name, adapter in adapters.items():
        gaps = [] if name in with_rows else ["a row in 'What the exporter reads'"]
        gaps += [
            family
            for family in adapter.FAMILIES
            if family not in documented and family + "_total" not in documented
        ]
        if gaps:
            missing[name] = gaps
    return missing


def test_every_registered_engine_has_its_row_and_its_metrics_documented() -> None:
    assert len(ADAPTERS) == 8
    assert undocumented_engines(DOC, ADAPTERS) == {}


def family_names(text: str) -> set[str]:
    """Names as a reader of the payload sees them (counters with their _total)."""
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus-client's creation timestamps
            continue
        if family.name.startswith(("process_", "python_")):  # its default collectors
            continue
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_every_exporter_metric_is_documented() -> None:
    samples = exposition(SignalSettings(cap=8, budget_seconds=2.0), PAYLOADS)
    emitted = {name for name, _ in samples}
    assert len(emitted) >= 17  # all but the in-house-only two
    assert emitted <= DOCUMENTED, emitted - DOCUMENTED


def test_every_instrumentation_metric_is_documented() -> None:
    registry = CollectorRegistry()
    m = BatcherMetrics("b", max_batch_size=8, max_wait_seconds=0.01,
                       latency_budget_seconds=0.1, registry=registry)  # fmt: skip
    m.observe_batch(2, "full", 0.01)
    m.observe_request("ok", queue_wait_seconds=0.001, latency_seconds=0.02)
    emitted = family_names(generate_latest(registry).decode())
    assert len(emitted) == 14  # 11, plus rejected by reason, batch tokens, padding avoided
    assert emitted <= DOCUMENTED, emitted - DOCUMENTED
