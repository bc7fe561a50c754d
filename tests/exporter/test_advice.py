"""The advice (exporter/core/advice.py): each item's numbers, words, inputs and confidence, alone
and
through the evaluator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchscope.exporter.core.advice import AdviceInputs
from batchscope.exporter.core.advise import advise
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.snapshot import SeriesSnapshot, Snapshot
from batchscope.exporter.core.static_util import UtilizationEstimate
from tests.support.costs import LINEAR
from tests.support.evaluation import evaluate_target


def _window(**kw) -> AdviceInputs:
    return AdviceInputs(window_seconds=120, scrapes=24, engine="vllm", **kw)


def test_too_little_data_advises_nothing_and_says_why():
    advice = advise(AdviceInputs(window_seconds=4, scrapes=2, kv_capacity_tokens=1024))
    assert advice.items == ()
    assert not advice.enough_data
    assert "too little data" in advice.summary and "2 scrapes over 4 s" in advice.summary


def test_items_are_equal_when_they_say_the_same_though_written_when_read():
    inputs = _window(cap=8, kv_capacity_tokens=1024, kv_usage=0.5, running=4)
    first, second = advise(inputs), advise(inputs)
    assert first == second and len(first.items) == 2
    item = first.items[0]
    assert item.text == "the KV cache holds 1,024 tokens"
    assert replace(item, words=lambda: "the KV cache holds 1,024 tokens") == item
    assert replace(item, words=lambda: "the KV cache holds 1,025 tokens") != item


def test_an_items_sentence_is_written_at_its_first_reading_only():
    written = []
    item = advise(_window(kv_capacity_tokens=1024)).items[0]
    item = replace(item, words=lambda: written.append(1) or "the sentence")
    assert written == []
    assert (item.text, item.text, item.text) == ("the sentence",) * 3
    assert written == [1]


def test_memory_bound_advice_says_raising_the_cap_will_not_help_with_both_numbers():
    # The e2e shape: 1024 KV tokens, cap 8, about 3 requests of ~300 tokens fill it.
    advice = advise(
        _window(
            running=3,
            waiting=100,
            cap=8,
            kv_usage=0.9,
            kv_capacity_tokens=1024,
            block_size=128,
            kv_scrapes=[(3, 0.9, 100), (4, 1.0, 100), (3, 0.8, 100)],
            mean_prompt_tokens=10,
            mean_output_tokens=275,
            length_requests=40,
        )
    )
    per_request = (0.9 + 1.0 + 0.8) * 1024 / 10  # 276.48
    assert advice.item("kv_tokens_per_request").value == pytest.approx(0.9 * 1024 / 3)
    assert advice.item("kv_tokens_per_request_window").value == pytest.approx(per_request)
    assert advice.item("kv_cache_fill").value == pytest.approx(0.9)  # every scrape waited
    sustainable = advice.item("sustainable_concurrency")
    assert sustainable.value == pytest.approx(0.9 * 1024 / per_request)  # 3.33
    assert "filled to 90% as measured while requests waited" in sustainable.text
    verdict = advice.item("raise_cap_helps")
    assert verdict.value == 0
    assert verdict.text.startswith("memory-bound: raising max-num-seqs will not help")
    assert "3.33 requests" in verdict.text and "cap of 8" in verdict.text
    assert verdict.inputs["cap"] == 8
    assert advice.summary == verdict.text
    needed = advice.item("kv_tokens_for_cap")
    assert needed.value == pytest.approx(8 * per_request / 0.9)
    assert "115 tokens each" in needed.text  # 0.9 x 1024 / 8
    assert verdict.confidence == "high"


def test_cap_bound_advice_says_raising_the_cap_helps_up_to_the_sustainable_count():
    advice = advise(
        _window(
            running=16,
            waiting=40,
            cap=16,
            kv_usage=0.25,
            kv_capacity_tokens=8192,
            kv_scrapes=[(16, 0.25, 40)] * 4,
            waited_at_cap=True,
        )
    )
    # 0.25 * 8192 / 16 = 128 tokens per request: 64 fit.
    assert advice.item("sustainable_concurrency").value == pytest.approx(64)
    verdict = advice.item("raise_cap_helps")
    assert verdict.value == 1 and "up to 64" in verdict.text
    assert advice.item("kv_tokens_for_cap") is None  # the cap already fits


def test_length_mix_stands_in_when_the_cache_was_not_seen_busy_and_lowers_confidence():
    advice = advise(
        AdviceInputs(
            window_seconds=30,
            scrapes=6,
            engine="vllm",
            cap=8,
            kv_capacity_tokens=1024,
            kv_scrapes=[(1, 0.1, 0)],
            mean_prompt_tokens=20,
            mean_output_tokens=200,
        )
    )
    assert advice.item("kv_tokens_per_request_window") is None
    sustainable = advice.item("sustainable_concurrency")
    assert sustainable.value == pytest.approx(1024 / 120)
    assert sustainable.confidence == "low"
    assert any("length mix" in c for c in sustainable.caveats)
    assert any("short window" in c for c in sustainable.caveats)


def test_kv_memory_is_named_from_cache_config_bytes():
    advice = advise(
        _window(
            running=2,
            waiting=5,
            cap=8,
            kv_usage=1.0,
            kv_capacity_tokens=1024,
            kv_cache_memory_bytes=1 << 30,
            gpu_memory_utilization=0.92,
            kv_scrapes=[(2, 1.0, 5)] * 3,
        )
    )
    # 512 tokens per request, cap 8: 4096 tokens = 4 GiB (+3 GiB).
    needed = advice.item("kv_tokens_for_cap")
    assert needed.value == 4096
    assert "4.00 GiB of KV memory, +3.00 GiB" in needed.text
    assert "gpu_memory_utilization from 0.92" in needed.text


def test_static_gain_is_the_inverse_of_the_static_estimate():
    static = UtilizationEstimate(
        batch_size=8, requests=64, estimate=0.5234375, lower=0.4, upper=0.6
    )
    advice = advise(AdviceInputs(window_seconds=120, scrapes=24, engine="inhouse", static=static))
    gain = advice.item("continuous_batching_gain")
    assert gain.value == pytest.approx(128 / 67)
    assert gain.text.startswith("switching from static to continuous batching would gain 1.91x")
    assert "48% of its slot-steps" in gain.text


def test_batcher_advice_gives_the_pair_headroom_and_rate_limit():
    advice = advise(
        AdviceInputs(
            window_seconds=120,
            scrapes=24,
            engine="inhouse",
            cap=32,
            arrival_per_second=550,
            cost_by_size=LINEAR,
            budget_seconds=0.1,
            latency_seconds=0.04,
        )
    )
    assert advice.item("budget_headroom").value == pytest.approx(0.6)
    assert advice.item("rate_limit_per_second").value == pytest.approx(0.7 * 32 / 0.033)
    assert advice.item("advised_max_batch_size").value == 32
    assert advice.item("advised_max_wait_seconds").value == pytest.approx(3 / 550)
    assert advice.item("fixed_pair_feasible").value == 1
    assert advice.summary.startswith("a fixed batcher needs max_wait 5.5 ms and max_batch_size 32")


def test_no_inputs_for_any_advice_says_so():
    advice = advise(AdviceInputs(window_seconds=120, scrapes=24, engine="tgi", running=3))
    assert advice.items == () and advice.enough_data
    assert advice.summary.startswith("nothing to advise from")


# ---------------------------------------------------------------- through the evaluator


def _evaluate(series_at, settings: SignalSettings):
    """Five scrapes 5 s apart (a 20 s window) of one series; the last evaluation."""
    snapshots, states, signals = [], {}, None
    for i in range(5):
        t = 100.0 + 5 * i
        snapshots.append(Snapshot("x", t, True, (series_at(i),)))
        signals, states = evaluate_target("x", "http://x", snapshots, settings, states, t)
    return signals


def test_the_evaluator_advises_a_memory_bound_vllm_from_its_window():
    def at(i: int) -> SeriesSnapshot:
        return SeriesSnapshot(
            key=(("engine", "0"),),
            engine="vllm",
            running=3,
            waiting=50,
            kv_usage=0.96,
            preemptions_total=10.0 * i,
            kv_capacity_tokens=1024,
            block_size=128,
        )

    signals = _evaluate(at, SignalSettings(cap=8))
    (series,) = signals.series
    assert series.diagnosis.state == "memory_bound"
    advice = series.advice
    # 0.96 x 1024 / 3 = 327.68 tokens per request at each of 5 scrapes, the cache kept
    # 96% full: 3 fit, the running count it settled at.
    assert advice.item("kv_tokens_per_request_window").value == pytest.approx(327.68)
    assert advice.item("sustainable_concurrency").value == pytest.approx(3)
    assert "holds 3 requests of today's mix" in advice.item("raise_cap_helps").text
    assert advice.item("raise_cap_helps").value == 0
    assert advice.item("kv_tokens_for_cap").value == pytest.approx(8 * 327.68 / 0.96)
    assert advice.item("sustainable_concurrency").caveats == ("short window (20 s of 5 scrapes)",)
    assert signals.total.advice.item("raise_cap_helps").value == 0


def test_the_evaluator_advises_an_inhouse_batcher_from_its_cost_by_size():
    # 100 batches of 8 per 5 s (160 items/s), 2 ms each; batches of 1 cost 1.5 ms.
    def at(i: int) -> SeriesSnapshot:
        return SeriesSnapshot(
            key=(("batcher", "embed"),),
            engine="inhouse",
            waiting=0,
            cap=32,
            budget_seconds=0.05,
            max_wait_seconds=0.005,
            items_total=800.0 * i + 10,
            batches_total=100.0 * i + 10,
            execution_by_size={1: (10.0, 0.015), 8: (100.0 * i + 1, 0.002 * (100 * i + 1))},
        )

    (series,) = _evaluate(at, SignalSettings()).series
    advice = series.advice
    assert advice.item("arrival_per_second").value == pytest.approx(160)
    # 160 items/s: load(1) = 0.24 <= 0.7: no waiting; every measured size fits 50 ms.
    assert advice.item("advised_max_wait_seconds").value == 0
    assert advice.item("advised_max_batch_size").value == 8
    assert advice.item("fixed_pair_feasible").value == 1
    assert "(today: max_wait 5.0 ms, max_batch_size 32)" in advice.summary
    # Its max batch of 32 is beyond the measured sizes: no rate limit is extrapolated.
    assert advice.item("rate_limit_per_second") is None


def test_a_few_ramp_up_scrapes_below_the_cap_do_not_set_the_fill():
    # A fresh server: 3 scrapes ramping up (waiting, cache nearly empty), then 7 at the cap.
    scrapes = [(2, 0.1, 30), (5, 0.2, 30), (9, 0.3, 30)] + [(16, 0.8, 30)] * 7
    advice = advise(
        _window(
            running=16,
            waiting=30,
            cap=16,
            kv_usage=0.8,
            kv_capacity_tokens=1500,
            kv_scrapes=scrapes,
            waited_at_cap=True,
        )
    )
    assert advice.item("kv_cache_fill") is None
    per_request = (0.1 + 0.2 + 0.3 + 7 * 0.8) * 1500 / (2 + 5 + 9 + 7 * 16)
    assert advice.item("sustainable_concurrency").value == pytest.approx(1500 / per_request)
    assert advice.item("raise_cap_helps").value == 1


def test_padding_waste_advises_bucketing_above_a_fifth_and_nothing_to_gain_below():
    high = advise(
        AdviceInputs(window_seconds=120, scrapes=24, engine="inhouse", padding_waste=0.25)
    ).item("padding_waste")
    assert high.value == 0.25
    assert high.text.startswith("25% of the token positions batched were padding: bucket")
    low = advise(
        AdviceInputs(window_seconds=120, scrapes=24, engine="inhouse", padding_waste=0.05)
    ).item("padding_waste")
    assert "little to gain" in low.text


def test_a_mean_latency_is_named_and_lowers_the_headroom_confidence():
    advice = advise(
        AdviceInputs(
            window_seconds=120,
            scrapes=24,
            engine="triton",
            arrival_per_second=100,
            cost_by_size=LINEAR,
            budget_seconds=0.1,
            latency_seconds=0.02,
            latency_is_mean=True,
        )
    )
    headroom = advice.item("budget_headroom")
    assert headroom.value == pytest.approx(0.8)
    assert headroom.text.startswith("mean 20.0 ms of a 100 ms budget")
    assert headroom.confidence == "medium"
    assert headroom.caveats == ("a mean latency (no histogram): the tail is longer",)
