"""Every metric name the project emits is documented in docs/metrics.md."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.core.catalog import FAMILIES, SERIES
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.engines import ADAPTERS
from batchscope.exporter.instrumentation import BatcherMetrics
from batchscope.exporter.metrics_doc import with_tables
from tests.support.metrics_doc import DOC, DOCUMENTED, family_names, undocumented_engines
from tests.support.signals_data import PAYLOADS, exposition


def test_every_registered_engine_has_its_row_and_its_metrics_documented() -> None:
    assert len(ADAPTERS) == 8
    assert undocumented_engines(DOC, ADAPTERS) == {}


def test_every_exporter_metric_is_documented() -> None:
    samples = exposition(SignalSettings(cap=8, budget_seconds=2.0, slo_objective=0.99), PAYLOADS)
    emitted = {name for name, _ in samples}
    assert len(emitted) >= 17  # all but the in-house-only two
    assert emitted <= DOCUMENTED, emitted - DOCUMENTED


def test_every_instrumentation_metric_is_documented() -> None:
    registry = CollectorRegistry()
    m = BatcherMetrics(
        "b", max_batch_size=8, max_wait_seconds=0.01, latency_budget_seconds=0.1, registry=registry
    )
    m.observe_batch(2, "full", 0.01)
    m.observe_request("ok", queue_wait_seconds=0.001, latency_seconds=0.02)
    emitted = family_names(generate_latest(registry).decode())
    assert len(emitted) == 14  # 11, plus rejected by reason, batch tokens, padding avoided
    assert emitted <= DOCUMENTED, emitted - DOCUMENTED


def test_the_pages_signal_tables_are_the_catalogs() -> None:
    """docs/metrics.md's table of families and of fields is what the catalog writes: a
    signal declared (or changed) without `python -m batchscope.exporter.metrics_doc`
    fails here."""
    assert with_tables(DOC) == DOC
    for signal in SERIES:
        assert f"| `{signal.name}` | {signal.unit} |" in DOC
    for family in FAMILIES:
        assert (
            f"`{family.name}" in DOC.split("generated from exporter/core/catalog.py: families")[1]
        )
