"""The exporter's /metrics exposition over signals computed from real payloads."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from batchscope.exporter.config.reserved_labels import RESERVED_LABELS
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.limits import BINDING_CHOICES, Limits
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series
from batchscope.exporter.serve.exposition import number_text, render_metrics
from tests.support.evaluation import evaluate_target
from tests.support.paths import REPO, fixture_text
from tests.support.reference_exposition import SignalsCollector
from tests.support.signals_data import (
    PAYLOADS,
    exposition,
    target_signals,
)

SERIES = {"target": "llm", "model_name": "/tmp/tinyllama", "engine": "0"}
TOTAL = {"target": "llm"}


def sample(samples: dict, name: str, **labels):
    return samples.get((name, frozenset(labels.items())))


def test_exposition_of_a_loaded_vllm_with_cap_and_budget() -> None:
    s = exposition(SignalSettings(cap=8, budget_seconds=2.0), PAYLOADS[:2])
    for labels in (SERIES, TOTAL):
        assert sample(s, "batchscope_running_requests", **labels) == 8.0
        assert sample(s, "batchscope_waiting_requests", **labels) == 32.0
        assert sample(s, "batchscope_batch_cap", **labels) == 8.0
        assert sample(s, "batchscope_running_vs_cap_ratio", **labels) == 1.0
        assert sample(s, "batchscope_preemptions_per_second", **labels) == 0.0
        assert sample(s, "batchscope_budget_saturated", **labels) == 0.0
        # 20 requests finished between idle and load, p99 from the e2e histogram delta
        latency = sample(
            s, "batchscope_latency_seconds", quantile="0.99", histogram="e2e", **labels
        )
        # 18 of 20 in (0, 0.3], 2 in (0.3, 0.5]: rank 19.8 -> 0.3 + 0.2 * (19.8 - 18) / 2
        assert latency == pytest.approx(0.48)
        assert sample(s, "batchscope_budget_utilization_ratio", **labels) == pytest.approx(0.24)
        states = {
            st: sample(s, "batchscope_diagnosis", state=st, **labels) for st in DIAGNOSIS_STATES
        }
        assert states.pop("healthy") == 1.0 and set(states.values()) == {0.0}
        for bound in ("estimate", "lower", "upper"):
            assert 0 < sample(s, "batchscope_static_utilization_ratio", bound=bound, **labels) <= 1
    assert sample(s, "batchscope_target_up", target="llm") == 1.0


def test_unknowable_values_are_absent_not_made_up() -> None:
    # no cap, no budget, and no finished request between two identical idle scrapes
    s = exposition(SignalSettings(), ["vllm-0.32.0-cpu-idle.txt"] * 2)
    names = {name for name, _ in s}
    for absent in (
        "batchscope_batch_cap",
        "batchscope_running_vs_cap_ratio",
        "batchscope_latency_seconds",
        "batchscope_budget_utilization_ratio",
        "batchscope_static_utilization_ratio",
        "batchscope_continuous_batching_gain_ratio",
        "batchscope_throughput_gain_ratio",
    ):
        assert absent not in names, absent
    assert sample(s, "batchscope_running_requests", **SERIES) == 0.0
    assert sample(s, "batchscope_diagnosis", state="idle", **TOTAL) == 1.0


def test_a_down_target_exports_up_0_and_the_down_state_only() -> None:
    s = exposition(SignalSettings(cap=8), ["vllm-0.32.0-cpu-idle.txt"], up=False)
    assert sample(s, "batchscope_target_up", target="llm") == 0.0
    assert sample(s, "batchscope_diagnosis", state="down", **TOTAL) == 1.0
    assert sample(s, "batchscope_running_requests", **TOTAL) is None


def reference(targets: list[TargetSignals]) -> bytes:
    """prometheus_client's exposition of SignalsCollector over the targets."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(lambda: targets))
    return generate_latest(registry)


def test_metrics_are_byte_for_byte_prometheus_clients_on_the_real_payloads() -> None:
    snapshots, states, targets = [], {}, []
    for i, name in enumerate(PAYLOADS):
        snapshots.append(Snapshot("llm", 100.0 + 5 * i, True, read_series(fixture_text(name))))
        signals, states = evaluate_target(
            "llm",
            "http://x/metrics",
            snapshots,
            SignalSettings(cap=8, budget_seconds=2.0),
            states,
            100.0 + 5 * i,
            {"team": 'a"b\\c\nd'},
        )
    targets = [
        signals,
        replace(
            signals,
            target="other",
            up=False,
            series=(),
            errors_total={"parse": 3, "evaluation": 1},
            window_resets_total={"engine_changed": 2},
        ),
    ]
    body = render_metrics(targets)
    assert body == reference(targets)
    assert (
        b'batchscope_target_errors_total{reason="evaluation",target="other",'
        b'team="a\\"b\\\\c\\nd"} 1.0\n'
    ) in body
    # 3 scrapes of one series and its total: every family present, advice included
    assert body.count(b"\nbatchscope_advice_value{") >= 2


def test_every_label_the_exporter_writes_is_reserved_and_documented() -> None:
    # A target label named like one the exporter sets would be overwritten on that family
    # (`reason` on the error and window-reset counters was, before the families declared
    # their labels): each name either writer emits is refused by the configuration, and
    # docs/configuration.md lists the same names.
    snapshots, states = [], {}
    for i, name in enumerate(PAYLOADS):
        snapshots.append(Snapshot("llm", 100.0 + 5 * i, True, read_series(fixture_text(name))))
        signals, states = evaluate_target(
            "llm",
            "http://x/metrics",
            snapshots,
            SignalSettings(cap=8, budget_seconds=2.0),
            states,
            100.0 + 5 * i,
            {"team": "search"},
        )
    targets = [
        replace(signals, errors_total={"parse": 3}, window_resets_total={"engine_changed": 1})
    ]
    written = {
        name
        for f in text_string_to_metric_families(render_metrics(targets).decode())
        for sample_ in f.samples
        for name in sample_.labels
    }
    assert {"reason", "state", "kind", "bound", "quantile", "histogram"} <= written
    assert written - {"team"} <= set(RESERVED_LABELS)
    assert "reason" in RESERVED_LABELS
    doc = (REPO / "docs" / "configuration.md").read_text()
    listed = doc[
        doc.index("exporter sets itself are refused:") : doc.index("names starting with `__`")
    ]
    assert re.findall(r"`([a-z_]+)`", listed) == list(RESERVED_LABELS)


def test_non_finite_gauges_are_left_out_as_prometheus_client_writes_the_rest() -> None:
    series = SeriesSignals(
        labels={"model_name": "m"},
        running=math.nan,
        waiting=math.inf,
        cap=-0.0,
        kv_cache_usage=1e-7,
        requests_per_second=12345678.9,
        latency_seconds=math.nan,
    )
    signals = TargetSignals("t", "http://t", 0.0, True, None, (series,), series)
    body = render_metrics([signals])
    assert body == reference([signals])
    assert b"batchscope_running_requests{" not in body
    assert b"batchscope_latency_seconds{" not in body
    assert b'batchscope_batch_cap{model_name="m",target="t"} -0.0\n' in body
    assert b'batchscope_requests_per_second{model_name="m",target="t"} 1.23456789e+07\n' in body


# Label values with what the exposition escapes (\\, ", newline) and beyond ASCII.
# Extra label names around the exporter's own (target, state, bound, kind...) in sort order.


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(target_signals(), max_size=4))
def test_metrics_are_byte_for_byte_prometheus_clients_on_any_signals(targets) -> None:
    assert render_metrics(targets) == reference(targets)


def _as_now(series: SeriesSignals, state: str, binding: str | None) -> SeriesSignals:
    return replace(
        series, diagnosis=replace(series.diagnosis, state=state), limits=Limits(binding=binding)
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target_signals(),
    st.lists(
        st.tuples(
            st.sampled_from(DIAGNOSIS_STATES),
            st.sampled_from((*BINDING_CHOICES, None)),
            st.booleans(),
            st.booleans(),
        ),
        min_size=2,
        max_size=6,
    ),
)
def test_a_series_whose_state_changes_between_renders_is_written_as_it_is_now(
    target: TargetSignals, rounds: list[tuple[str, str | None, bool, bool]]
) -> None:
    # The renderer keeps each label set's diagnosis and binding lines until the state
    # they follow from changes: the same labels rendered round after round, the state,
    # the binding limit and whether the target was read changing between them (each
    # state back again), must be written as the reference writes each round.
    for state, binding, up, unreadable in rounds + rounds[:1]:
        now = replace(
            target,
            up=up,
            error="unreadable" if unreadable else None,
            series=tuple(_as_now(s, state, binding) for s in target.series),
            total=_as_now(target.total, state, binding),
        )
        body = render_metrics([now])
        assert body == reference([now])
        current = re.search(rb"batchscope_diagnosis\{[^}]*\} 1.0\n", body)
        assert current is not None and f'state="{state}"'.encode() in current.group(0)


def test_padding_waste_of_an_in_house_batcher_is_read_back_and_exported() -> None:
    from batchscope.exporter.core.signals import padding_waste
    from batchscope.exporter.instrumentation import BatcherMetrics
    from batchscope.exporter.serve.api_json import series_json

    registry = CollectorRegistry()
    batcher = BatcherMetrics("embed", max_batch_size=8, registry=registry)
    batcher.observe_padding(tokens=500, padding=500, avoided=0)  # before the window
    snapshots, states = [], {}
    for t, (tokens, padding) in ((100.0, (0, 0)), (105.0, (300, 100))):
        batcher.observe_padding(tokens=tokens, padding=padding, avoided=40)
        snapshots.append(Snapshot("b", t, True, read_series(generate_latest(registry).decode())))
        signals, states = evaluate_target("b", "http://x", snapshots, SignalSettings(), states, t)
    [series] = snapshots[-1].series
    assert (series.batch_tokens_total, series.padding_tokens_total) == (1400.0, 600.0)
    # In the window: 300 real and 100 padding tokens batched, a quarter of it padding.
    assert padding_waste(100.0, 400.0) == 0.25
    assert signals.total.padding_waste == 0.25
    assert series_json(signals.total)["padding_waste"] == 0.25
    exported = CollectorRegistry()
    exported.register(SignalsCollector(lambda: [signals]))
    text = generate_latest(exported).decode()
    assert 'batchscope_padding_waste_ratio{target="b"} 0.25' in text
    assert padding_waste(None, 400.0) is None and padding_waste(0.0, 0.0) is None


def test_advice_is_exported_per_kind_with_the_fixture_numbers() -> None:
    s = exposition(SignalSettings(cap=8, budget_seconds=2.0), PAYLOADS)
    for labels in (SERIES, TOTAL):
        assert sample(s, "batchscope_advice_value", kind="kv_capacity_tokens", **labels) == 1048576
        # 60 requests since idle: prompt 3510 / 60 = 58.5, output 11642 / 60, half a
        # 128-token block: 58.5 + 97.02 + 63.5 tokens held per running request.
        per_request = 58.5 + 11642 / 120 + 63.5
        assert sample(
            s, "batchscope_advice_value", kind="kv_tokens_per_request_lengths", **labels
        ) == pytest.approx(per_request)
        assert sample(
            s, "batchscope_advice_value", kind="sustainable_concurrency", **labels
        ) == pytest.approx(1048576 / per_request)
        # 32 waited while 8 ran at the cap of 8: raising the cap can help.
        assert sample(s, "batchscope_advice_value", kind="raise_cap_helps", **labels) == 1.0


def test_no_advice_is_exported_from_two_scrapes() -> None:
    s = exposition(SignalSettings(cap=8, budget_seconds=2.0), PAYLOADS[:2])
    assert not [name for name, _ in s if name == "batchscope_advice_value"]


NUMBER_EDGES = [
    0.0, -0.0, 1.0, True, False, 3, -7, 0.1, 1e-300, 5e-324, 999999.0, 999999.9, 1000000.0,
    1234567.0, 12345678.9, -1234567.0, 1e15, 1e16, 1.5e300, 2.0**53, math.inf, -math.inf, math.nan,
]  # fmt: skip


@given(st.one_of(st.floats(), st.integers(-(2**60), 2**60), st.sampled_from(NUMBER_EDGES)))
@settings(max_examples=2000)
def test_a_number_is_written_as_floattogostring_writes_it(value) -> None:
    # The fast path of the render's numbers (repr, but for what Go writes otherwise) against
    # the function the byte-for-byte reference writes them with.
    assert number_text(value) == floatToGoString(value)


@pytest.mark.parametrize("value", NUMBER_EDGES)
def test_each_edge_number_is_written_as_floattogostring_writes_it(value) -> None:
    assert number_text(value) == floatToGoString(value)
