"""Every metric name the project emits is documented in docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.instrumentation import BatcherMetrics
from exporter.signals import SignalSettings
from tests.test_collector import PAYLOADS, exposition

DOC = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()
DOCUMENTED = set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", DOC))


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
