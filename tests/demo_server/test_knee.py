"""The knee of a sweep: where latency or throughput breaks, and what bound the batch there."""

from __future__ import annotations

import pytest

from batchscope.dashboard.load_format import find_knee, growth_per_doubling


def step(rate: float, throughput: float, p99: float, batching: dict | None = None) -> dict:
    record = {"rate": rate, "request_throughput": throughput, "p99_e2el_ms": p99}
    if batching is not None:
        record["batching"] = batching
    return record


KV_BOUND = {
    "running_max": 5.0,
    "cap": 8.0,
    "kv_usage_max": 0.99,
    "preemptions_per_s": 3.0,
    "waiting_mean": 0.0,
    "binding_limit": "kv_cache",
}


def test_growth_is_normalised_to_a_doubling_of_the_rate() -> None:
    # 10 -> 40 req/s is two doublings; throughput x1.21 over them is +10% a doubling.
    assert growth_per_doubling(10.0, 10.0, 40.0, 12.1) == pytest.approx(0.10)
    assert growth_per_doubling(10.0, 10.0, 20.0, 20.0) == pytest.approx(1.0)
    assert growth_per_doubling(10.0, 0.0, 20.0, 5.0) is None


def test_the_knee_is_the_first_step_whose_throughput_stops_growing_and_names_its_cause() -> None:
    steps = [
        step(10.0, 10.0, 200.0),
        step(20.0, 19.8, 260.0),
        step(40.0, 31.0, 900.0),  # +57%: still growing
        step(80.0, 32.0, 4000.0, KV_BOUND),  # +3% for a doubling: stopped
        step(160.0, 31.0, 9000.0),
    ]
    knee = find_knee(steps, slo_ms=None)
    assert knee is not None
    assert knee.rate == 80.0 and knee.reason == "throughput"
    assert knee.growth_per_doubling == pytest.approx(32.0 / 31.0 - 1)
    assert knee.binding_limit == "kv_cache"
    assert knee.sentence == (
        "knee at 80 req/s: throughput stopped at 32 req/s (+3% for a doubling of the offered "
        "rate), the batch stopped at 5 of 8 running with the KV cache full and 3 "
        "preemptions/s: memory-bound; a higher --max-num-seqs will not help"
    )


def test_p99_crossing_the_slo_makes_an_earlier_knee_than_throughput() -> None:
    request_bound = {
        "running_max": 8.0,
        "cap": 8.0,
        "kv_usage_max": 0.4,
        "waiting_mean": 6.5,
        "binding_limit": "requests",
    }
    steps = [step(10.0, 10.0, 200.0), step(20.0, 19.9, 1240.0, request_bound)]
    knee = find_knee(steps, slo_ms=1000.0)
    assert knee is not None and knee.rate == 20.0 and knee.reason == "slo"
    assert knee.sentence == (
        "knee at 20 req/s: p99 1,240 ms crossed the 1,000 ms SLO, the batch stopped at 8 of 8 "
        "running with the KV cache at 40% and 6.5 waiting: bound by the request cap; a higher "
        "--max-num-seqs can help while the KV cache has room"
    )


def test_a_step_where_arrivals_bound_most_readings_names_the_limit_when_requests_waited() -> None:
    # Clean-clone run 13: a starved API server handed vLLM its requests in bursts; 16 of
    # 23 readings had nothing waiting in the engine, 7 had the KV cache full with a queue.
    bursts = {
        "running_max": 6.0,
        "cap": 8.0,
        "kv_usage_max": 1.0,
        "waiting_mean": 35.5,
        "binding_limit": "arrivals",
        "binding_shares": {"arrivals": 16 / 23, "kv_cache": 5 / 23, "unexplained": 2 / 23},
    }
    knee = find_knee([step(1.0, 1.0, 1575.0), step(16.0, 4.1, 33555.0, bursts)], 6000.0)
    assert knee is not None and knee.binding_limit == "arrivals"
    assert knee.sentence == (
        "knee at 16 req/s: p99 33,555 ms crossed the 6,000 ms SLO, the batch stopped at 6 of "
        "8 running with the KV cache full and 35.5 waiting: nothing waited at 70% of the "
        "readings; at 22% the KV cache bound: memory-bound; a higher --max-num-seqs will "
        "not help"
    )
    # Requests that waited with no limit at its bound, at the most readings besides
    # arrivals: said in the unexplained words (no limit to name).
    unexplained = {
        **bursts,
        "binding_shares": {"arrivals": 0.6, "unexplained": 0.3, "kv_cache": 0.1},
    }
    knee = find_knee([step(1.0, 1.0, 1575.0), step(16.0, 4.1, 33555.0, unexplained)], 6000.0)
    assert knee is not None and knee.sentence.endswith(
        ": nothing waited at 60% of the readings; at 30% requests waited with no limit at "
        "its bound: the metrics do not explain it"
    )
    # Arrivals at every reading (idle ones aside), or shares not recorded (an older result
    # file): nothing else to name.
    for shares in ({"arrivals": 0.8, "none": 0.2}, None):
        quiet = {**bursts, "waiting_mean": 0.0, "binding_shares": shares}
        knee = find_knee([step(1.0, 1.0, 1575.0), step(16.0, 4.1, 33555.0, quiet)], 6000.0)
        assert knee is not None and knee.sentence.endswith(
            ": no batching limit bound (nothing waited): the time per request is the limit, "
            "not the batch"
        )


def test_a_sweep_that_never_breaks_has_no_knee_and_old_steps_say_how_to_name_a_cause() -> None:
    healthy = [step(10.0, 10.0, 100.0), step(20.0, 20.0, 110.0), step(40.0, 39.0, 130.0)]
    assert find_knee(healthy, slo_ms=500.0) is None
    knee = find_knee([*healthy, step(80.0, 40.0, 900.0)], slo_ms=None)
    assert knee is not None and knee.rate == 80.0 and knee.binding_limit is None
    assert knee.sentence.endswith("run with --watch METRICS_URL to name what bound the batch")
