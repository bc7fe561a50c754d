"""The exporter's /metrics exposition over signals computed from real payloads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import SignalsCollector, render_exposition
from exporter.engines import read_series
from exporter.signals import DIAGNOSIS_STATES, SignalSettings
from exporter.snapshot import Snapshot
from exporter.target import evaluate_target
from tests.conftest import fixture_text


def exposition(settings: SignalSettings, payloads: list[str], up: bool = True) -> dict:
    """Samples by (name, frozenset(labels)) after evaluating the payloads 5 s apart."""
    snapshots, states, signals = [], {}, None
    for i, name in enumerate(payloads):
        t = 100.0 + 5 * i
        if up:
            snap = Snapshot("llm", t, True, read_series(fixture_text(name)))
        else:
            snap = Snapshot("llm", t, False, error="timed out after 4 s")
        snapshots.append(snap)
        signals, states = evaluate_target("llm", "http://x", snapshots, settings, states, t)
    registry = CollectorRegistry()
    registry.register(SignalsCollector(lambda: [signals]))
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


SERIES = {"target": "llm", "model_name": "/tmp/tinyllama", "engine": "0"}
TOTAL = {"target": "llm"}


def sample(samples: dict, name: str, **labels):
    return samples.get((name, frozenset(labels.items())))


PAYLOADS = ["vllm-0.32.0-cpu-idle.txt", "vllm-0.32.0-cpu-load.txt", "vllm-0.32.0-cpu-after.txt"]


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


def test_the_fast_exposition_is_byte_for_byte_prometheus_clients() -> None:
    snapshots, states, targets = [], {}, []
    for i, name in enumerate(PAYLOADS):
        snapshots.append(Snapshot("llm", 100.0 + 5 * i, True, read_series(fixture_text(name))))
        signals, states = evaluate_target("llm", "http://x/metrics", snapshots,
                                          SignalSettings(cap=8, budget_seconds=2.0), states,
                                          100.0 + 5 * i, {"team": 'a"b\\c'})  # fmt: skip
    targets = [signals, replace(signals, target="other", up=False, series=(),
                                errors_total={"parse": 3})]  # fmt: skip
    collector = SignalsCollector(lambda: targets)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    assert render_exposition(collector.collect()) == generate_latest(registry)


def test_padding_waste_of_an_in_house_batcher_is_read_back_and_exported() -> None:
    from exporter.api import series_json
    from exporter.instrumentation import BatcherMetrics
    from exporter.signals import padding_waste

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
