"""The prefix cache's hit rate and the speculative decoder's acceptance rate, from vLLM's
counters: each the increase of one over the increase of the other over the window."""

from __future__ import annotations

import pytest

from batchscope.exporter.config.settings import Target
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.serve.exposition import render_metrics
from tests.support.evaluation import evaluate_target, snapshot_from_payload
from tests.support.paths import fixture_text
from tests.support.vllm_payload import VllmState, render

TARGET = Target("llm", "http://vllm/metrics", engine="vllm", cap=8)
SETTINGS = SignalSettings(cap=8)


def _signals(states: list[VllmState], step: float = 5.0):
    snapshots = [
        snapshot_from_payload(TARGET, i * step, render(s), None, 0.01) for i, s in enumerate(states)
    ]
    signals, _ = evaluate_target(
        TARGET.name, TARGET.url, snapshots, SETTINGS, {}, (len(states) - 1) * step
    )
    return signals


def _state(queries: float, hits: float, drafts: float, accepted: float) -> VllmState:
    return VllmState(
        prefix_queries=queries, prefix_hits=hits, draft_tokens=drafts, accepted_tokens=accepted
    )


def test_each_rate_is_the_window_increase_of_one_counter_over_the_other() -> None:
    signals = _signals(
        [_state(1000, 100, 300, 30), _state(1800, 500, 600, 180), _state(3000, 1100, 900, 330)]
    )
    series = signals.series[0]
    assert series.prefix_cache_hit_rate == pytest.approx(1000 / 2000)  # (1100-100)/(3000-1000)
    assert series.spec_decode_acceptance_rate == pytest.approx(300 / 600)
    assert signals.total.prefix_cache_hit_rate == pytest.approx(0.5)
    text = render_metrics([signals]).decode()
    assert (
        'batchscope_prefix_cache_hit_ratio{engine="0",model_name="tiny",target="llm"} 0.5' in text
    )
    assert "batchscope_spec_decode_acceptance_ratio{" in text


def test_a_restart_counts_from_zero_and_no_lookups_read_as_unknown() -> None:
    # The server restarted between the second and third scrape: its counters began again.
    restarted = _signals(
        [_state(1000, 100, 300, 30), _state(1400, 300, 400, 80), _state(200, 150, 100, 40)]
    )
    # PromQL's increase: 400 + 200 queries, 200 + 150 hits.
    assert restarted.series[0].prefix_cache_hit_rate == pytest.approx(350 / 600)
    assert restarted.series[0].spec_decode_acceptance_rate == pytest.approx((50 + 40) / (100 + 100))
    idle = _signals([_state(1000, 100, 300, 30), _state(1000, 100, 300, 30)])
    assert idle.series[0].prefix_cache_hit_rate is None
    assert idle.series[0].spec_decode_acceptance_rate is None
    assert "batchscope_prefix_cache_hit_ratio{" not in render_metrics([idle]).decode()


def test_an_engine_without_the_counters_says_so_instead_of_a_zero() -> None:
    plain = _signals([VllmState(), VllmState()])
    series = plain.series[0]
    assert series.prefix_cache_hit_rate is None
    assert {"prefix_cache_hit_rate", "spec_decode_acceptance_rate"} <= set(series.not_exposed)


def test_the_real_vllm_payload_gives_the_hit_rate_of_its_counters() -> None:
    """vLLM 0.32's own payloads (prefix caching on, no speculative decoding): the load
    fixture's queries and hits against the idle one's."""
    idle, load = (fixture_text(f"vllm-0.32.0-cpu-{name}.txt") for name in ("idle", "load"))
    snapshots = [
        snapshot_from_payload(TARGET, t, text, None, 0.01) for t, text in ((0, idle), (10, load))
    ]
    first, last = (s.series[0] for s in snapshots)
    signals, _ = evaluate_target(TARGET.name, TARGET.url, snapshots, SETTINGS, {}, 10.0)
    series = signals.series[0]
    queried = last.prefix_cache_queries_total - first.prefix_cache_queries_total
    assert queried > 0
    assert (
        series.prefix_cache_hit_rate
        == (last.prefix_cache_hits_total - first.prefix_cache_hits_total) / queried
    )
    assert "spec_decode_acceptance_rate" in series.not_exposed
