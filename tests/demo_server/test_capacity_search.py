"""The capacity search: ramp, then bisection, within a bounded number of steps."""

from __future__ import annotations

import pytest

from batchscope.demo_server.loadgen.capacity_search import CapacitySearch, meets_slo


def run(search: CapacitySearch, capacity: float) -> list[float]:
    """Drive the planner against a fake server that passes every rate up to `capacity`."""
    tried = []
    while (rate := search.next_rate()) is not None:
        tried.append(rate)
        search.record(rate, rate <= capacity)
    return tried


def test_ramp_then_bisection_brackets_the_capacity_within_the_precision() -> None:
    search = CapacitySearch(start_rate=5.0, max_steps=12, precision=0.10)
    tried = run(search, capacity=37.0)
    # Ramp: 5, 10, 20, 40 (fails); bisection between 20 and 40 from there.
    assert tried[:4] == [5.0, 10.0, 20.0, 40.0]
    assert tried[4] == pytest.approx((20.0 * 40.0) ** 0.5)
    found = search.result()
    assert found.converged and found.steps == len(tried) <= 12
    assert found.low is not None and found.high is not None
    assert found.low <= 37.0 < found.high <= found.low * 1.10
    assert found.rate == found.low


def test_the_step_bound_stops_an_unfinished_search_with_its_bracket() -> None:
    search = CapacitySearch(start_rate=1.0, max_steps=5, precision=0.01)
    tried = run(search, capacity=1000.0)
    assert tried == [1.0, 2.0, 4.0, 8.0, 16.0]
    found = search.result()
    assert (found.rate, found.high, found.steps, found.converged) == (16.0, None, 5, False)
    assert found.words() == "capacity at the SLO: above 16 req/s (every step passed; 5 steps)"


def test_a_start_above_capacity_ramps_down() -> None:
    search = CapacitySearch(start_rate=100.0, max_steps=10, precision=0.10)
    tried = run(search, capacity=30.0)
    assert tried[:3] == [100.0, 50.0, 25.0]
    found = search.result()
    assert found.low is not None and found.high is not None
    assert found.low <= 30.0 < found.high and found.converged


def test_a_noisy_pass_above_a_fail_reads_as_the_highest_pass() -> None:
    search = CapacitySearch(start_rate=10.0)
    for rate, passed in ((10.0, True), (20.0, False), (14.0, True), (12.0, False)):
        search.record(rate, passed)
    assert search.bracket() == (14.0, 20.0)


def test_a_step_passes_on_attainment_and_not_over_saturated() -> None:
    assert meets_slo({"slo_attainment": 0.995, "over_saturated": False}, 0.99)
    assert not meets_slo({"slo_attainment": 0.985, "over_saturated": False}, 0.99)
    assert not meets_slo({"slo_attainment": 1.0, "over_saturated": True}, 0.99)
    assert not meets_slo({"slo_attainment": None}, 0.99)
