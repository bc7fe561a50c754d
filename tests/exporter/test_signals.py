"""The pure signal math: rates through restarts, quantiles, saturation, diagnosis."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscope.exporter.core.diagnosis import Diagnosis, DiagnosisInputs, diagnose, down_diagnosis
from batchscope.exporter.core.evaluate import TargetSignals, series_signals
from batchscope.exporter.core.histogram import Histogram, histogram_increase, histogram_quantile
from batchscope.exporter.core.limits import LimitInputs, limits
from batchscope.exporter.core.signals import (
    SaturationState,
    SignalSettings,
    batch_size_distribution,
    budget_utilization,
    counter_increase,
    execution_increase,
    per_second,
    running_vs_cap,
    step_saturation,
    throughput_gain,
)
from batchscope.exporter.core.snapshot import SeriesSnapshot, merge_series
from tests.support.signals_data import label_values, target_signals

INF = math.inf


def hist(counts, bounds=(0.1, 0.5, 1.0, INF), total=None):
    return Histogram(tuple(bounds), tuple(float(c) for c in counts), total or 0.0, counts[-1])


def test_running_vs_cap_is_absent_without_a_cap() -> None:
    assert running_vs_cap(8, 8) == 1.0
    assert running_vs_cap(3, 8) == 0.375
    assert running_vs_cap(3, None) is None
    assert running_vs_cap(None, 8) is None


def test_counter_reset_gives_no_negative_rate() -> None:
    # 10 -> 15 (+5), restart to 3 (+3 since the restart), 3 -> 8 (+5)
    assert counter_increase([10, 15, 3, 8]) == 13
    assert per_second(counter_increase([10, 15, 3, 8]), 15.0) == pytest.approx(13 / 15)
    assert counter_increase([7]) is None
    assert counter_increase([None, None]) is None
    # absent at the first scrape: created since, so it counts from zero
    assert counter_increase([None, 4, None]) == 4
    assert counter_increase([3, None, 5]) == 2


def test_counter_increase_is_promqls_arithmetic_last_less_first_plus_each_drop() -> None:
    # Prometheus's extrapolatedRate (promql/functions.go): the last value less the first,
    # then the value before each drop added. Summing each scrape's difference instead
    # rounds otherwise: (0.2 - 0.1) + (1.1 - 0.2) is 1.0000000000000002.
    assert counter_increase([0.1, 0.2, 1.1]) == 1.1 - 0.1 == 1.0
    # a drop from 1.1 to 0.3: 1.1 less 0.1, then 1.1 added
    assert counter_increase([0.1, 1.1, 0.3]) == (0.3 - 0.1) + 1.1
    # NaN reads as absent, at the first scrape as anywhere (no count from zero then)
    assert counter_increase([math.nan, 2.0, 5.0]) == 3.0
    assert counter_increase([None, 2.0, 5.0]) == 5.0


def test_histogram_increase_counts_through_a_restart() -> None:
    before = [hist([1, 2, 3, 3]), hist([2, 4, 6, 6])]
    after_restart = [hist([0, 1, 1, 1]), hist([1, 2, 3, 4])]
    inc = histogram_increase(before + after_restart)
    # 3 observations before the restart, 4 after it (counted from zero)
    assert inc.counts == (1 + 1, 2 + 2, 3 + 3, 3 + 4)
    assert inc.count == 7
    # a histogram first seen at the second scrape (a labelled child created on first use)
    assert histogram_increase([None, hist([1, 2, 3, 3])]).count == 3
    assert histogram_increase([hist([1, 2, 3, 3])]) is None


def test_histogram_delta_and_quantile_match_promql_interpolation() -> None:
    older = hist([10, 20, 30, 30])
    newer = hist([10, 60, 100, 100])
    delta = histogram_increase([older, newer])
    assert delta.counts == (0, 40, 70, 70)
    # rank 0.5*70 = 35 falls in (0.1, 0.5]: 0.1 + 0.4 * 35/40
    assert histogram_quantile(0.5, delta) == pytest.approx(0.45)
    # rank 0.99*70 = 69.3 falls in (0.5, 1.0]: 0.5 + 0.5 * (69.3-40)/30
    assert histogram_quantile(0.99, delta) == pytest.approx(0.98833333)
    # in the +Inf bucket: the largest finite bound, as PromQL
    assert histogram_quantile(0.99, hist([0, 0, 1, 10])) == 1.0
    assert histogram_quantile(0.99, hist([0, 0, 0, 0])) is None


def test_budget_utilization() -> None:
    assert budget_utilization(0.095, 0.1) == pytest.approx(0.95)
    assert budget_utilization(None, 0.1) is None
    assert budget_utilization(0.05, None) is None


def _run(utilizations, start=0.0, step=5.0, **kw):
    params = {"threshold": 0.95, "hold_seconds": 60.0, "release_margin": 0.05} | kw
    state = SaturationState()
    out = []
    for i, u in enumerate(utilizations):
        state = step_saturation(state, u, start + i * step, **params)
        out.append(state.saturated)
    return out


def test_saturation_needs_the_hold_time_continuously() -> None:
    # at >= 0.95 from t=0: saturated when t - 0 >= 60, i.e. the 13th evaluation (t=60)
    flags = _run([0.96] * 14)
    assert flags.index(True) == 12
    # a dip below the threshold restarts the clock
    flags = _run([0.96] * 10 + [0.5] + [0.96] * 13)
    assert flags.index(True) == 11 + 12


def test_saturation_hysteresis_does_not_flap_around_the_threshold() -> None:
    flags = _run([0.96] * 13 + [0.93, 0.96, 0.92, 0.94, 0.91])
    assert flags[12:] == [True] * 6  # 0.91..0.94 stay inside the band (> 0.90)
    flags = _run([0.96] * 13 + [0.89])
    assert flags[-1] is False


def test_saturation_seconds_count_the_episode() -> None:
    state = SaturationState()
    for t in (0, 5, 10):
        state = step_saturation(state, 1.2, t, threshold=0.95, hold_seconds=60, release_margin=0.05)
    assert state.above_since == 0 and not state.saturated
    assert step_saturation(
        state, None, 15, threshold=0.95, hold_seconds=60, release_margin=0.05
    ) == SaturationState(read_at=15)


def test_throughput_gain_against_batch_size_one() -> None:
    # batch 1 costs 10 ms: 100 items/s; batches of 32 cost 20 ms: 1600 items/s
    window = {32: (10.0, 0.2)}
    cumulative = {1: (5.0, 0.05), 32: (10.0, 0.2)}
    assert throughput_gain(window, cumulative) == pytest.approx(16.0)
    assert throughput_gain(window, {32: (10.0, 0.2)}) is None
    assert execution_increase({8: (4, 1.0)}, {8: (10, 2.5), 16: (1, 0.5)}) == {
        8: (6, 1.5),
        16: (1, 0.5),
    }


def test_batch_size_distribution_from_samples_and_from_a_histogram() -> None:
    assert batch_size_distribution([8, 8, 3, 8], None) == [(3, 0.25), (8, 0.75)]
    h = Histogram((1, 2, 4, INF), (2, 2, 8, 8), 30.0, 8)
    assert batch_size_distribution([], h) == [(1, 0.25), (4, 0.75)]


def diagnosed(settings: SignalSettings | None = None, **inputs) -> Diagnosis:
    return diagnose(DiagnosisInputs(**inputs), settings or SignalSettings())


DIAG = dict(
    running=8,
    waiting=0,
    cap=8,
    kv_usage=0.1,
    preemptions_per_second=0.0,
    budget_saturated=False,
    budget_utilization=0.3,
)


# Saturated with the gauges at 0 at every scrape: requests that ran between scrapes, or
# vLLM's gauges under overload.
BLIND_SATURATED = {
    "running": 0,
    "waiting": 0,
    "budget_saturated": True,
    "budget_utilization": 2.0,
    "latency_seconds": 2.0,
    "budget_seconds": 1.0,
}


@pytest.mark.parametrize(
    ("changes", "state", "phrase"),
    [
        ({"running": 0, "waiting": 0}, "idle", "no request"),
        # The alert is up, so not idle, whatever the gauges read.
        (
            BLIND_SATURATED,
            "budget_saturated",
            "p99 latency 2 s of a 1 s budget (200%)",
        ),
        ({"budget_saturated": True, "budget_utilization": 1.1}, "budget_saturated", "110%"),
        (
            {"running": 3, "waiting": 18, "kv_usage": 1.0, "preemptions_per_second": 2.5},
            "memory_bound",
            "running 3 of cap 8 while 18 wait, KV cache 100% full and 2.50",
        ),
        ({"running": 8, "preemptions_per_second": 0.4}, "preempting", "0.40 preemptions/s"),
        ({"running": 8, "waiting": 32}, "healthy", "running 8 of cap 8 with 32 waiting"),
        ({"running": 3, "waiting": 5}, "batch_limited", "something else limits the batch"),
        (
            {"running": 4.95, "waiting": 20, "cap": 32, "fired_batches": True},
            "batch_limited",
            "batches average 4.95 of max 32 while 20 wait: the batcher fires before",
        ),
        ({"running": 3, "waiting": 5, "cap": None}, "queueing", "configure the cap"),
        ({"running": 2, "waiting": 0}, "underloaded", "little traffic"),
    ],
)
def test_diagnosis_states(changes, state, phrase) -> None:
    d = diagnosed(**(DIAG | changes))
    assert d.state == state
    assert phrase in d.reason


def test_gauges_at_0_under_a_saturated_episode_do_not_say_batching_cannot_help() -> None:
    # Requests ran over the budget while the gauges read none at the scrapes: nothing
    # says the batch was small or that nothing waited.
    blind = diagnosed(**(DIAG | BLIND_SATURATED))
    assert blind.state == "budget_saturated"
    assert "batching cannot" not in blind.reason, blind.reason
    # A batch the gauges saw, small with nothing waiting: the work itself is the latency.
    seen = diagnosed(**(DIAG | BLIND_SATURATED | {"running": 1}))
    assert "batching cannot" in seen.reason, seen.reason


def test_a_target_that_does_not_answer_is_down_with_its_error() -> None:
    d = down_diagnosis("timed out after 2 s")
    assert d.state == "down"
    assert "timed out after 2 s" in d.reason
    assert down_diagnosis(None).reason.endswith("unknown error")


def _vllm(t_running, preempt, e2e_counts, tokens=None):
    return SeriesSnapshot(
        key=(("model_name", "m"),),
        engine="vllm",
        running=t_running[0],
        waiting=t_running[1],
        preemptions_total=preempt,
        kv_usage=t_running[2],
        requests_total=e2e_counts[-1],
        latency={"e2e": hist(e2e_counts)},
        output_tokens=tokens,
    )


def test_series_signals_over_a_window() -> None:
    points = [
        (100.0, _vllm((3, 10, 0.98), 10, [0, 0, 0, 0])),
        (105.0, _vllm((3, 15, 0.99), 20, [0, 5, 10, 10])),
        (110.0, _vllm((3, 18, 1.00), 40, [0, 10, 20, 20])),
    ]
    settings = SignalSettings(cap=8, budget_seconds=1.0)
    signals, state = series_signals(points, settings, SaturationState(), 110.0)
    assert signals.cap == 8 and signals.running_vs_cap == 0.375
    assert signals.preemptions_per_second == pytest.approx(30 / 10)
    assert signals.requests_per_second == pytest.approx(20 / 10)
    # 20 observations: rank 19.8 in (0.5, 1.0] -> 0.5 + 0.5*(19.8-10)/10
    assert signals.latency_seconds == pytest.approx(0.99)
    assert signals.budget_utilization == pytest.approx(0.99)
    assert state.above_since == 110.0 and not signals.budget_saturated
    assert signals.diagnosis.state == "memory_bound"


def test_total_adds_series_and_takes_the_fullest_kv_cache() -> None:
    a = _vllm((8, 2, 0.5), 1, [1, 2, 3, 3])
    b = _vllm((4, 0, 0.9), 2, [0, 1, 1, 1])
    total = merge_series([a, b], default_cap=8)
    assert (total.running, total.waiting, total.preemptions_total, total.cap) == (12, 2, 3, 16)
    assert total.kv_usage == 0.9
    assert total.latency["e2e"].counts == (1, 3, 4, 4)


def test_total_keeps_no_latency_when_its_series_answer_to_different_budgets() -> None:
    llm = _vllm((8, 2, 0.5), 1, [1, 2, 3, 3])  # judged against the configured 10 s
    batcher = replace(_vllm((4, 0, 0.1), 0, [0, 1, 1, 1]), budget_seconds=0.05)
    total = merge_series([llm, batcher], default_cap=8, default_budget=10.0)
    assert total.latency == {} and total.budget_seconds is None
    same = merge_series([llm, replace(batcher, budget_seconds=10.0)], 8, default_budget=10.0)
    assert same.budget_seconds == 10.0
    assert same.latency["e2e"].counts == (1, 3, 4, 4)


def test_diagnosis_reads_the_recent_peak_so_a_finish_between_admissions_is_not_a_limit() -> None:
    def at(running):
        return SeriesSnapshot(key=(), engine="vllm", running=running, waiting=140)

    points = [(0.0, at(8)), (1.0, at(8)), (2.0, at(7))]
    signals, _ = series_signals(points, SignalSettings(cap=8), SaturationState(), 2.0)
    assert signals.running_vs_cap == 0.875  # the instant, as scraped
    assert signals.diagnosis.state == "healthy"
    assert "running 8 of cap 8" in signals.diagnosis.reason
    points = [(0.0, at(7)), (1.0, at(6)), (2.0, at(7)), (3.0, at(7))]
    signals, _ = series_signals(points, SignalSettings(cap=8), SaturationState(), 3.0)
    assert signals.diagnosis.state == "batch_limited"


STALL = DIAG | dict(
    running=2,
    waiting=12,
    kv_usage=0.3,
    generated_per_second=0.0,
    finished_per_second=0.0,
    window_seconds=30.0,
)


def test_stalled_when_requests_wait_with_room_and_nothing_is_generated() -> None:
    d = diagnosed(**STALL)
    assert d.state == "stalled"
    assert d.reason.startswith("12 requests wait, running 2 of cap 8, KV cache 30% used")
    assert "in the last 30 s" in d.reason
    assert "engine's logs" in d.reason and "restarting the server" in d.reason
    # "nearly stopped": under 0.1 per second, every known rate
    assert diagnosed(**STALL | {"generated_per_second": 0.05}).state == "stalled"
    assert diagnosed(**STALL | {"finished_per_second": None}).state == "stalled"
    # no cap known: a stall is still a stall
    assert diagnosed(**STALL | {"cap": None}).state == "stalled"


@pytest.mark.parametrize(
    ("changes", "state"),
    [
        # a healthy busy server generates: full batch, or below the cap with tokens flowing
        (
            {
                "running": 8,
                "waiting": 32,
                "generated_per_second": 400.0,
                "finished_per_second": 2.0,
            },
            "healthy",
        ),
        ({"generated_per_second": 120.0}, "batch_limited"),
        ({"generated_per_second": 0.2}, "batch_limited"),
        ({"finished_per_second": 0.5}, "batch_limited"),
        # memory-bound: KV full or preemptions, even when little is generated
        ({"kv_usage": 0.95}, "memory_bound"),
        ({"preemptions_per_second": 0.5, "kv_usage": 0.6}, "memory_bound"),
        # running at the cap is not "admits nothing"
        ({"running": 8}, "healthy"),
        # a window too short to tell a stall from a long prefill
        ({"window_seconds": 10.0}, "batch_limited"),
        # no progress counter at all: cannot tell
        ({"generated_per_second": None, "finished_per_second": None}, "batch_limited"),
        ({"waiting": 0}, "underloaded"),
    ],
)
def test_not_stalled(changes, state) -> None:
    assert diagnosed(**STALL | changes).state == state


def _window(make, seconds=30.0, step=5.0):
    return [(i * step, make(i)) for i in range(int(seconds / step) + 1)]


def test_a_vllm_series_with_flat_generation_over_the_window_is_stalled() -> None:
    def flat(i):
        return SeriesSnapshot(
            key=(),
            engine="vllm",
            running=1,
            waiting=10,
            kv_usage=0.2,
            preemptions_total=3,
            requests_total=50,
            generation_tokens_total=9000,
        )

    signals, _ = series_signals(_window(flat), SignalSettings(cap=8), SaturationState(), 30.0)
    assert signals.generation_tokens_per_second == 0.0
    assert signals.diagnosis.state == "stalled"

    def generating(i):
        return SeriesSnapshot(
            key=(),
            engine="vllm",
            running=1,
            waiting=10,
            kv_usage=0.2,
            preemptions_total=3,
            requests_total=50,
            generation_tokens_total=9000 + 60 * i,
        )

    signals, _ = series_signals(_window(generating), SignalSettings(cap=8), SaturationState(), 30)
    assert signals.generation_tokens_per_second == pytest.approx(12.0)
    assert signals.diagnosis.state == "batch_limited"
    # two scrapes 5 s apart are not enough window to call it
    signals, _ = series_signals(_window(flat, 5.0), SignalSettings(cap=8), SaturationState(), 5)
    assert signals.diagnosis.state == "batch_limited"


def test_a_batcher_without_generation_counters_is_judged_by_items_and_batches() -> None:
    def batcher(items, batches, requests=None):
        return SeriesSnapshot(
            key=(("batcher", "b"),),
            engine="inhouse",
            waiting=40,
            cap=32,
            items_total=items,
            batches_total=batches,
            requests_total=requests,
        )

    # no token and no request counter: flat items and batches alone tell the stall
    stuck = _window(lambda i: batcher(500.0, 100.0))
    signals, _ = series_signals(stuck, SignalSettings(), SaturationState(), 30.0)
    assert signals.generation_tokens_per_second is None
    assert signals.requests_per_second is None
    assert signals.diagnosis.state == "stalled"
    assert "40 requests wait, running 0 of cap 32" in signals.diagnosis.reason
    stuck = _window(lambda i: batcher(500.0, 100.0, 480.0))
    signals, _ = series_signals(stuck, SignalSettings(), SaturationState(), 30.0)
    assert signals.diagnosis.state == "stalled"

    # items executing (no requests counter): progress, so not stalled
    working = _window(lambda i: batcher(500.0 + 20 * i, 100.0 + 4 * i))
    signals, _ = series_signals(working, SignalSettings(), SaturationState(), 30.0)
    assert signals.mean_batch_size == 5.0
    assert signals.diagnosis.state == "batch_limited"
    assert "the batcher fires before batches fill" in signals.diagnosis.reason


def test_a_saturated_reason_without_a_reading_states_the_configured_threshold() -> None:
    reason = diagnosed(
        running=8,
        waiting=3,
        cap=8,
        kv_usage=0.2,
        preemptions_per_second=0,
        budget_saturated=True,
        budget_utilization=None,
        settings=SignalSettings(saturation_threshold=0.9),
    ).reason
    assert reason.startswith("latency has stayed at or above 90% of the budget")


# The embeddings batcher of `make demo`'s heavy phase, as a run of it once read: p99 116 ms of a
# 50 ms budget, nothing queued, small batches, 12 s into the 60 s hold.
OVER = DIAG | dict(
    running=2,
    waiting=0,
    budget_utilization=2.33,
    latency_seconds=0.1165,
    budget_seconds=0.05,
    window_seconds=20.0,
    above_threshold_seconds=12.0,
)


def test_over_budget_with_nothing_waiting_and_small_batches_is_work_too_slow() -> None:
    d = diagnosed(**OVER)
    assert d.state == "work_too_slow"
    assert d.reason.startswith(
        "over the last 20 s, p99 latency 116 ms of a 50 ms budget (233%), while running 2 of "
        "cap 8: nothing waits and batches are small, so the latency is each request's own "
        "serving time (its execution and the server's handling of it), which batching cannot "
        "shorten"
    )
    assert d.reason.endswith(
        "(at or above 95% for 12 s so far; it becomes budget-saturated after 60 s)"
    )
    # no cap known: nothing says the batch has room, so not "batching cannot help"
    uncapped = diagnosed(**OVER | {"cap": None})
    assert uncapped.state == "over_budget"
    assert "running 2 and nothing waits: with no cap known, a full batch cannot be told" in (
        uncapped.reason
    )


def test_a_batcher_firing_on_its_max_wait_is_told_to_shorten_it() -> None:
    breakdown = limits(
        LimitInputs(
            running=3, waiting=0, cap=32, fired_batches=True, trigger_shares={"timeout": 0.8}
        )
    )
    d = diagnosed(**OVER | {"running": 3, "cap": 32, "fired_batches": True, "limits": breakdown})
    assert d.state == "work_too_slow"
    assert "batches average 3 of max 32" in d.reason
    assert "fire on the batcher's max wait: that wait is part of the latency" in d.reason
    # batches that fire on the max wait had room, whether or not a max is known
    uncapped = limits(
        LimitInputs(
            running=3, waiting=0, cap=None, fired_batches=True, trigger_shares={"timeout": 0.8}
        )
    )
    d = diagnosed(**OVER | {"running": 3, "cap": None, "fired_batches": True, "limits": uncapped})
    assert d.state == "work_too_slow"


@pytest.mark.parametrize(
    ("changes", "phrase"),
    [
        (
            {"running": 8, "waiting": 20},
            "running 8 of cap 8 with 20 waiting: requests queue behind a full batch",
        ),
        ({"running": 3, "waiting": 5}, "running 3 of cap 8 while 5 wait: requests queue"),
        (
            {"running": 3, "waiting": 5, "cap": None},
            "running 3 while 5 wait: requests queue, and with no cap known a full batch",
        ),
        ({"running": 8}, "running 8 of cap 8 and nothing waits: the batch is full"),
    ],
)
def test_over_budget_before_the_hold_is_over_budget_not_healthy(changes, phrase) -> None:
    d = diagnosed(**OVER | changes)
    assert d.state == "over_budget"
    assert d.reason.startswith("over the last 20 s, p99 latency 116 ms of a 50 ms budget (233%)")
    assert phrase in d.reason
    assert "it becomes budget-saturated after 60 s" in d.reason


def test_only_latency_over_the_budget_itself_is_over_budget() -> None:
    # at the threshold but within the budget: the batch's own state
    assert diagnosed(**OVER | {"running": 8, "budget_utilization": 1.0}).state == "healthy"
    assert diagnosed(**OVER | {"budget_utilization": 0.97}).state == "underloaded"
    # a cause the metrics show comes first: memory holds the batch
    d = diagnosed(**OVER | {"running": 3, "waiting": 5, "kv_usage": 0.95})
    assert d.state == "memory_bound"


def test_a_saturated_budget_says_how_long_against_the_hold_and_what_it_measures() -> None:
    d = diagnosed(**OVER | {"budget_saturated": True, "above_threshold_seconds": 57.01})
    assert d.state == "budget_saturated"
    assert d.reason.startswith(
        "latency has stayed at or above 95% of the budget for 57 s (saturated after 60 s); "
        "over the last 20 s, p99 latency 116 ms of a 50 ms budget (233%)"
    )
    # nothing waits and batches are small: more capacity is not what helps
    assert d.reason.endswith("a budget that fits the work can")


@settings(max_examples=300, deadline=None)
@given(
    running=st.floats(0.5, 80),
    waiting=st.floats(0, 50),
    cap=st.one_of(st.none(), st.sampled_from([8.0, 64.0])),
    kv=st.one_of(st.none(), st.floats(0, 1)),
    preemptions=st.one_of(st.none(), st.sampled_from([0.0, 1.5])),
    utilization=st.floats(1.01, 20),
    fired=st.booleans(),
)
def test_a_latency_over_budget_is_never_called_healthy_or_underloaded(
    running, waiting, cap, kv, preemptions, utilization, fired
) -> None:
    state = diagnosed(
        running=running,
        waiting=waiting,
        cap=cap,
        kv_usage=kv,
        preemptions_per_second=preemptions,
        budget_utilization=utilization,
        fired_batches=fired,
    ).state
    assert state in {
        "memory_bound",
        "token_budget_bound",
        "preempting",
        "work_too_slow",
        "over_budget",
    }, state


def test_preempting_at_the_cap_with_a_long_queue_names_both_limits() -> None:
    # make demo's overload: 8 of 8 running, 421 waiting, KV at 67%, preemptions rising
    def at(i):
        return SeriesSnapshot(
            key=(),
            engine="vllm",
            running=8,
            waiting=421,
            kv_usage=0.67,
            preemptions_total=10.0 + 2.5 * i,
        )

    signals, _ = series_signals(_window(at), SignalSettings(cap=8), SaturationState(), 30.0)
    d = signals.diagnosis
    assert d.state == "preempting"
    assert d.reason.startswith(
        "running 8 of cap 8 with 421 waiting, 0.50 preemptions/s: 2 limits are at their bound "
        "at once, the KV cache (67% used, 0.50 preemptions/s) and the request cap (8 of 8 "
        "running)"
    )
    assert "raising the request cap alone will not help" in d.reason
    assert signals.limits.at_bound == ("kv_cache", "requests")
    # preempting with nothing waiting: the cache alone, as before
    d = diagnosed(**DIAG | {"running": 8, "preemptions_per_second": 0.4})
    assert d.reason.startswith("0.40 preemptions/s: the KV cache is short of memory")


@settings(max_examples=50, deadline=None)
@given(target_signals(), st.dictionaries(st.sampled_from(["team", "zone"]), label_values))
def test_with_counts_gives_what_replace_gives(
    target: TargetSignals, labels: dict[str, str]
) -> None:
    errors, resets = {"parse": 3}, {"engine_changed": 1}
    counted = target.with_counts(errors, resets)
    assert counted == replace(target, errors_total=errors, window_resets_total=resets)
    assert (counted.errors_total, counted.window_resets_total) == (
        {"parse": 3},
        {"engine_changed": 1},
    )
