"""The SLO math: attainment from bucket increases, burn rates, the error budget, and the
history that keeps what the long windows need in bounded memory."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchscope.exporter.core.evaluate import TargetIdentity, evaluate_window
from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.slo import (
    RESOLUTION,
    WINDOWS,
    Totals,
    attainment_reason,
    attainment_share,
    budget_edges,
    burn_rate,
    error_budget_remaining,
    history_windows,
    measure_attainment,
    slo_status,
)
from batchscope.exporter.core.slo import SloHistory as History
from batchscope.exporter.core.snapshot import SeriesSnapshot, Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines.vllm import REQUEST_LATENCY_BUCKETS
from batchscope.exporter.serve.api_json import history_point, history_row

BOUNDS = (*REQUEST_LATENCY_BUCKETS, math.inf)
DAY = 86400.0
SCALE = 1.0
PERIOD = 30 * DAY


def histogram_of(latencies: list[float], bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    """The cumulative histogram a server would expose after observing these latencies."""
    counts = tuple(float(sum(1 for x in latencies if x <= b)) for b in bounds)
    return Histogram(bounds, counts, sum(latencies), float(len(latencies)))


def exact_share(latencies: list[float], budget: float) -> float:
    """The plain reference: the share of requests within the budget, counted one by one."""
    return sum(1 for x in latencies if x <= budget) / len(latencies)


def test_a_budget_on_a_bucket_edge_gives_the_exact_share() -> None:
    latencies = [0.4, 0.9, 1.2, 1.9, 2.0, 2.2, 4.0, 12.0]
    share, edges = attainment_share(histogram_of(latencies), 2.0)
    assert edges.exact and (edges.lower, edges.upper) == (2.0, 2.0)
    assert share == (5 / 8, 5 / 8, 5 / 8)
    assert share.estimate == exact_share(latencies, 2.0)


def test_a_budget_between_edges_is_bounded_by_them_and_interpolated_inside() -> None:
    # 1.2 s lies 40% into (1.0, 1.5]: two requests at or below 1.0, four at or below 1.5.
    latencies = [0.4, 0.9, 1.1, 1.4, 1.9, 2.2, 3.0, 12.0]
    share, edges = attainment_share(histogram_of(latencies), 1.2)
    assert (edges.lower, edges.upper) == (1.0, 1.5)
    assert edges.weight == pytest.approx(0.4)
    assert share.lower == 2 / 8 and share.upper == 4 / 8
    assert share.estimate == pytest.approx(2 / 8 + 0.4 * 2 / 8)
    assert share.lower <= exact_share(latencies, 1.2) <= share.upper


def test_budgets_outside_the_finite_edges() -> None:
    latencies = [0.1, 0.2, 0.6, 9000.0]
    below, edges = attainment_share(histogram_of(latencies), 0.15)
    # Below the first edge (0.3): nothing is below 0, two requests within 0.3.
    assert (edges.lower, edges.upper, below.lower, below.upper) == (0.0, 0.3, 0.0, 0.5)
    assert below.estimate == pytest.approx(0.5 * 0.15 / 0.3)
    past, edges = attainment_share(histogram_of(latencies), 8000.0)
    # Past the last finite edge (7680): only +Inf above it, and nothing says where inside.
    assert (edges.lower, edges.upper) == (7680.0, math.inf)
    assert past == (0.75, 0.75, 1.0)


def test_no_requests_in_the_window_is_no_attainment() -> None:
    empty = histogram_of([])
    assert attainment_share(empty, 2.0) is None
    assert measure_attainment(empty, 2.0, "vllm", "e2e") is None
    assert measure_attainment(histogram_of([1.0]), None, "vllm", "e2e") is None


@given(
    latencies=st.lists(st.floats(0.001, 100.0), min_size=1, max_size=60),
    budget=st.one_of(st.sampled_from(REQUEST_LATENCY_BUCKETS), st.floats(0.01, 9000.0)),
)
def test_the_exact_share_always_lies_within_the_stated_bounds(
    latencies: list[float], budget: float
) -> None:
    share, edges = attainment_share(histogram_of(latencies), budget)
    exact = exact_share(latencies, budget)
    assert share.lower <= share.estimate <= share.upper
    assert share.lower - 1e-12 <= exact <= share.upper + 1e-12
    if budget in REQUEST_LATENCY_BUCKETS:
        assert edges.exact and share.estimate == pytest.approx(exact)


def test_the_reason_says_how_exact_and_where_to_put_an_edge() -> None:
    exact = measure_attainment(histogram_of([0.4, 3.0]), 2.0, "vllm", "e2e")
    assert exact.reason == "Exact: 2 s is a bucket edge of the e2e histogram."
    near = measure_attainment(histogram_of([0.4, 1.4, 3.0]), 1.4, "vllm", "e2e")
    # 1.5 is 7% from 1.4: bounded, and near enough to say nothing more.
    assert near.reason.startswith("Between 33.33% (within 1 s) and 66.67% (within 1.5 s)")
    assert "put an edge" not in near.reason
    # 3.5 s: the nearest edges are 2.5 and 5 s, 29% and 43% away.
    far = measure_attainment(histogram_of([0.4, 3.0]), 3.5, "vllm", "e2e")
    assert "The nearest edge is 28.57% of the budget away: put an edge at 3.5 s" in far.reason
    assert "--custom-histogram-buckets '{\"request_latency\": [..., 3.5, ...]}'" in far.reason
    ttft = measure_attainment(histogram_of([0.4, 3.0]), 3.5, "vllm", "ttft")
    assert '"time_to_first_token"' in ttft.reason
    share, edges = attainment_share(histogram_of([0.004, 0.02]), 0.012)
    batcher = attainment_reason(share, edges, "inhouse", "e2e")
    assert "BatcherMetrics(..., latency_buckets=(..., 0.012, ...))" in batcher


def test_burn_rate_and_error_budget_left() -> None:
    assert burn_rate(0.99, 0.99) == pytest.approx(1.0)
    assert burn_rate(0.0, 0.99) == pytest.approx(100.0)
    assert burn_rate(0.95, 0.99) == pytest.approx(5.0)
    # 1,000 requests, 4 over the budget, 10 allowed: 60% of the budget left.
    assert error_budget_remaining(Totals(996, 996, 996, 1000), 0.99) == pytest.approx(0.6)
    assert error_budget_remaining(Totals(970, 970, 970, 1000), 0.99) == pytest.approx(-2.0)
    assert error_budget_remaining(Totals(0, 0, 0, 0), 0.99) == 1.0


class Traffic:
    """A server's cumulative latency histogram, advanced a scrape at a time: `rate`
    requests per second, a share `bad` of them over a 2 s budget (at 3 s), the rest at 1 s."""

    def __init__(self) -> None:
        self.good = 0.0
        self.bad = 0.0

    def advance(self, seconds: float, rate: float, bad: float) -> Histogram:
        self.good += seconds * rate * (1 - bad)
        self.bad += seconds * rate * bad
        total = self.good + self.bad
        counts = tuple(self.good if b < 3.0 else total for b in BOUNDS)
        return Histogram(BOUNDS, counts, 0.0, total)


def test_burn_rates_read_each_window_and_the_pairs_alert_only_when_both_burn() -> None:
    history = History(history_windows(SCALE, PERIOD))
    traffic = Traffic()
    t = 0.0
    # Five good hours, then 10 minutes with every request over the budget.
    for _ in range(5 * 720):
        t += 5
        history.observe(t, traffic.advance(5, 10, 0.0), 2.0)
    status = slo_status(history, 0.99, SCALE, PERIOD)
    assert status.rate("5m") == 0.0 and status.burning == ()
    for _ in range(120):
        t += 5
        history.observe(t, traffic.advance(5, 10, 1.0), 2.0)
    status = slo_status(history, 0.99, SCALE, PERIOD)
    assert status.rate("5m") == pytest.approx(100.0)
    # The hour holds 10 bad minutes (its span reaches up to 1/RESOLUTION further back).
    assert 100 * 10 / (60 + 60 / RESOLUTION) <= status.rate("1h") <= 100 * 10 / 60
    assert status.rate("30m") == pytest.approx(100 / 3, rel=1 / RESOLUTION)
    # 1h/5m: 16.4x and 100x over 14.4x: the fast alert. The 6h/30m pair (3.2x, 33x) is
    # under 6x; 3d/6h, over the whole 5 h 10 min, is at 3.2x, over 1x, but the history
    # does not cover 6 hours yet: no ticket.
    assert status.rate("6h") == pytest.approx(100 * 10 / 310, rel=1e-3)
    assert status.burning == ("fast",)
    assert status.speed_burn_rate("fast") == status.rate("1h")
    assert status.error_budget_remaining is None  # 5 hours of a 30-day period
    assert status.history_seconds == t - 5


def test_a_young_history_pages_only_once_it_covers_the_short_window() -> None:
    history = History(history_windows(SCALE, PERIOD))
    traffic = Traffic()
    history.observe(0.0, traffic.advance(0, 10, 0.0), 2.0)
    t = 0.0
    for _ in range(59):  # every request over the budget, for 295 s
        t += 5
        history.observe(t, traffic.advance(5, 10, 1.0), 2.0)
        status = slo_status(history, 0.99, SCALE, PERIOD)
        # 100x over both windows of every pair, but no window is watched in full yet.
        assert status.rate("5m") == status.rate("1h") == pytest.approx(100.0)
        assert status.burning == ()
    history.observe(300.0, traffic.advance(5, 10, 1.0), 2.0)
    # Five minutes watched: the 1h/5m pair pages; 30 minutes and 6 hours are not covered.
    assert slo_status(history, 0.99, SCALE, PERIOD).burning == ("fast",)


def test_a_speed_s_burn_rate_is_its_burning_pair_s_not_a_quiet_pair_s() -> None:
    history = History(history_windows(SCALE, PERIOD))
    traffic = Traffic()
    history.observe(0.0, traffic.advance(0, 10, 0.0), 2.0)
    t = 0.0
    # Five hours at 5x, half an hour at 30x, half an hour at 10x.
    for seconds, bad in ((5 * 3600, 0.05), (1800, 0.3), (1800, 0.1)):
        for _ in range(int(seconds / 5)):
            t += 5
            history.observe(t, traffic.advance(5, 10, bad), 2.0)
    status = slo_status(history, 0.99, SCALE, PERIOD)
    # 1h (20x) and 5m (10x) are not both over 14.4x; 6h (7.5x) and 30m (10x) are over 6x:
    # the fast alert is the 6h/30m pair's, at its long window's 7.5x, not the hour's 20x.
    assert status.rate("1h") == pytest.approx(20.0, rel=1 / RESOLUTION)
    assert status.rate("5m") == pytest.approx(10.0) and status.rate("30m") == pytest.approx(10.0)
    assert status.speed_burn_rate("fast") == status.rate("6h") == pytest.approx(7.5, rel=1e-3)
    assert [(p.long, p.short) for p in status.burning_pairs if p.speed == "fast"] == [("6h", "30m")]


def test_a_short_spike_burns_the_short_window_only() -> None:
    history = History(history_windows(SCALE, PERIOD))
    traffic = Traffic()
    t = 0.0
    for seconds, bad in ((7 * 3600, 0.0), (300, 1.0), (60, 0.0)):
        for _ in range(int(seconds / 5)):
            t += 5
            history.observe(t, traffic.advance(5, 10, bad), 2.0)
    status = slo_status(history, 0.99, SCALE, PERIOD)
    assert status.rate("5m") > 14.4 and status.rate("1h") < 14.4
    # No page. (Seven hours of history make five bad minutes 1.17x over "3d" and 1.35x
    # over "6h": a ticket.)
    assert status.rate("3d") == pytest.approx(100 * 5 / (7 * 60 + 6), rel=1e-3)
    assert status.burning == ("slow",)


def test_the_history_stays_bounded_and_knows_the_period_once_it_covers_it() -> None:
    period = 3 * DAY
    history = History(history_windows(SCALE, period))
    traffic = Traffic()
    bound = len(history_windows(SCALE, period)) * (RESOLUTION + 2)
    t = 0.0
    most = 0
    for i in range(int(3.5 * DAY / 15)):
        t += 15
        # 0.5% of requests over the budget, one scrape in 50 missing (a gap, not a reset).
        history.observe(t, None if i % 50 == 49 else traffic.advance(15, 10, 0.005), 2.0)
        most = max(most, history.checkpoints())
    assert most <= bound == 6 * 32
    status = slo_status(history, 0.99, SCALE, period)
    # Half the allowed 1% spent over the period: half the budget left, burning 0.5x.
    assert status.error_budget_remaining == pytest.approx(0.5, rel=1e-6)
    assert status.rate("3d") == pytest.approx(0.5, rel=1e-6)
    young = History(history_windows(SCALE, period))
    young.observe(0.0, traffic.advance(0, 10, 0.0), 2.0)
    young.observe(3600.0, traffic.advance(3600, 10, 0.0), 2.0)
    assert slo_status(young, 0.99, SCALE, period).error_budget_remaining is None


def test_a_restart_counts_from_zero_and_a_new_budget_starts_the_history_again() -> None:
    history = History(history_windows(SCALE, PERIOD))
    history.observe(0.0, histogram_of([1.0] * 100), 2.0)
    history.observe(60.0, histogram_of([1.0] * 160), 2.0)
    # The server restarted: 10 requests since, 5 of them over the budget.
    history.observe(120.0, histogram_of([1.0] * 5 + [3.0] * 5), 2.0)
    assert history.totals == (65.0, 65.0, 65.0, 70.0)
    # A new bucket layout is a restart too.
    history.observe(180.0, histogram_of([1.0] * 4, (1.0, 2.5, math.inf)), 2.0)
    assert history.totals.requests == 74.0 and history.totals.lower == 69.0
    history.observe(240.0, histogram_of([1.0] * 8), 1.5)
    assert history.totals == (0.0, 0.0, 0.0, 0.0) and history.started_at == 240.0


def test_the_windows_scale_together() -> None:
    assert history_windows(0.01, 3600.0) == (3.0, 18.0, 36.0, 216.0, 2592.0, 3600.0)
    assert set(WINDOWS) == {"5m", "30m", "1h", "6h", "3d"}


def test_edges_of_a_budget_read_as_text_match_the_bound() -> None:
    assert budget_edges(BOUNDS, 0.1 + 0.2 + 0.2).exact  # 0.5000000000000001
    with pytest.raises(ValueError, match="budget must be > 0"):
        budget_edges(BOUNDS, 0.0)


# ---------------------------------------------------------------- through the window


SERIES_KEY = (("engine", "0"), ("model_name", "m"))


def _series(t: float, traffic: Traffic, seconds: float, bad: float) -> SeriesSnapshot:
    return SeriesSnapshot(
        key=SERIES_KEY,
        engine="vllm",
        latency={"e2e": traffic.advance(seconds, 10, bad)},
    )


def test_the_window_keeps_the_history_through_an_outage_longer_than_itself() -> None:
    settings = SignalSettings(budget_seconds=2.0, slo_objective=0.99)
    window = Window(60.0, settings)
    traffic = Traffic()
    states: dict = {}
    target = TargetIdentity("llm", "http://x")
    t = 0.0
    for _ in range(120):  # 10 minutes, all of it bad
        t += 5
        window.add(Snapshot("llm", t, True, (_series(t, traffic, 5, 1.0),)))
        signals, states = evaluate_window(target, window, states, t)
    assert signals.total.slo.rate("5m") == pytest.approx(100.0)
    for _ in range(24):  # two minutes down: the window holds no point of the series
        t += 5
        window.add(Snapshot("llm", t, False, error="timed out"))
        evaluate_window(target, window, states, t)
    assert not window.series
    t += 5
    window.add(Snapshot("llm", t, True, (_series(t, traffic, 125, 0.0),)))
    window.add(Snapshot("llm", t + 5, True, (_series(t + 5, traffic, 5, 0.0),)))
    signals, _ = evaluate_window(target, window, states, t + 5)
    [series] = signals.series
    # The hour still holds the ten bad minutes before the outage (119 scrapes' worth: the
    # first scrape is where the counting starts), and the 1,300 good requests since.
    assert series.slo.rate("1h") == pytest.approx(100 * 5950 / (5950 + 1300), rel=1e-9)
    assert series.slo.history_seconds == pytest.approx(t)
    assert signals.total.slo == series.slo
    # One series all along: its history is the total's, not a second copy of it.
    assert window.total_slo_history() is window.slo_history(SERIES_KEY)


def test_without_an_objective_nothing_is_kept_and_no_burn_is_reported() -> None:
    settings = SignalSettings(budget_seconds=2.0)
    window = Window(60.0, settings)
    traffic = Traffic()
    states: dict = {}
    for t in (5.0, 10.0, 15.0):
        window.add(Snapshot("llm", t, True, (_series(t, traffic, 5, 0.2),)))
        signals, states = evaluate_window(TargetIdentity("llm", "x"), window, states, t)
    assert window.slo_history((("engine", "0"), ("model_name", "m"))) is None
    assert window.total_slo_history() is None
    assert signals.total.slo is None
    # Attainment and goodput are the window's, objective or not: 80% of 10/s.
    assert signals.total.slo_attainment.share.estimate == pytest.approx(0.8)
    assert signals.total.goodput_per_second.estimate == pytest.approx(8.0)


def test_a_target_of_several_series_keeps_the_total_s_history_apart() -> None:
    settings = SignalSettings(budget_seconds=2.0, slo_objective=0.99)
    window = Window(60.0, settings)
    fast, slow = Traffic(), Traffic()
    states: dict = {}
    rng = random.Random(3)
    for i in range(1, 100):
        t = 5.0 * i
        a = SeriesSnapshot(
            key=(("model_name", "a"),), engine="vllm", latency={"e2e": fast.advance(5, 10, 0)}
        )
        b = SeriesSnapshot(
            key=(("model_name", "b"),),
            engine="vllm",
            latency={"e2e": slow.advance(5, 10, rng.choice((0.5, 1.0)))},
        )
        window.add(Snapshot("llm", t, True, (a, b)))
        signals, states = evaluate_window(TargetIdentity("llm", "x"), window, states, t)
    by_model = {s.labels["model_name"]: s for s in signals.series}
    assert by_model["a"].slo.rate("5m") == 0.0
    total_bad = slow.bad / (fast.good + fast.bad + slow.good + slow.bad)
    # The total's history began at the first scrape: the whole run is within 30 minutes.
    assert signals.total.slo.rate("30m") == pytest.approx(total_bad / 0.01, rel=0.02)
    assert by_model["b"].slo.rate("30m") > signals.total.slo.rate("30m")


def _model(name: str, hist: Histogram) -> SeriesSnapshot:
    return SeriesSnapshot(key=(("model_name", name),), engine="vllm", latency={"e2e": hist})


def test_a_series_missing_from_one_scrape_adds_only_what_it_served_meanwhile() -> None:
    settings = SignalSettings(budget_seconds=2.0, slo_objective=0.99)
    window = Window(60.0, settings)
    old, fresh = Traffic(), Traffic()
    # Model a served 10,000 requests over the budget before the exporter started.
    old.advance(1000, 10, 1.0)
    states: dict = {}
    target = TargetIdentity("llm", "x")
    t = 0.0
    for i in range(1, 41):
        t = 5.0 * i
        a = _model("a", old.advance(5, 10, 0.0))
        b = _model("b", fresh.advance(5, 10, 0.0))
        # Model a is missing from the 20th scrape (its engine was slow to answer).
        window.add(Snapshot("llm", t, True, (b,) if i == 20 else (a, b)))
        signals, states = evaluate_window(target, window, states, t)
    history = window.total_slo_history()
    # 39 scrapes' worth of both models since the first: 2 x 39 x 50 requests, all good.
    assert history.totals.requests == 2 * 39 * 50
    assert signals.total.slo.rate("5m") == 0.0
    assert signals.total.slo.burning == ()


def test_a_second_series_keeps_the_total_s_history_from_the_first_scrape() -> None:
    settings = SignalSettings(budget_seconds=2.0, slo_objective=0.99)
    window = Window(60.0, settings)
    a_traffic, b_traffic = Traffic(), Traffic()
    states: dict = {}
    target = TargetIdentity("llm", "x")
    t = 0.0
    # Ten bad minutes of one model, then 20 good ones, then a second model joins.
    for i in range(1, 361):
        t = 5.0 * i
        series = [_model("a", a_traffic.advance(5, 10, 1.0 if i <= 120 else 0.0))]
        if i > 360 - 12:
            series.append(_model("b", b_traffic.advance(5, 10, 0.0)))
        window.add(Snapshot("llm", t, True, tuple(series)))
        signals, states = evaluate_window(target, window, states, t)
    assert signals.total.slo.history_seconds == t - 5.0
    # The hour still holds the ten bad minutes: 119 bad scrapes of 50 requests, among
    # 359 scrapes of model a and 11 of model b.
    assert signals.total.slo.rate("1h") == pytest.approx(100 * 119 / (359 + 11), rel=1e-9)


def test_a_scrape_that_reads_nothing_carries_the_burn_until_the_target_is_stale() -> None:
    settings = SignalSettings(budget_seconds=2.0, slo_objective=0.99, stale_seconds=30.0)
    window = Window(60.0, settings)
    traffic = Traffic()
    states: dict = {}
    target = TargetIdentity("llm", "x")
    t = 0.0
    for _ in range(120):  # 10 minutes, all of it bad
        t += 5
        window.add(Snapshot("llm", t, True, (_series(t, traffic, 5, 1.0),)))
        read, states = evaluate_window(target, window, states, t)
    assert "fast" in read.total.slo.burning
    t += 5
    window.add(Snapshot("llm", t, False, error="timed out"))
    down, states = evaluate_window(target, window, states, t)
    # Nothing read: the burn stands as last read, and the history row still flags it.
    assert not down.up and down.total.slo == read.total.slo
    assert history_point(history_row(down))["slo_burning_fast"] is True
    t += 5
    window.add(Snapshot("llm", t, True, (_series(t, traffic, 10, 1.0),)))
    again, states = evaluate_window(target, window, states, t)
    assert again.total.slo.rate("5m") == pytest.approx(100.0)
    # Every request over the budget: the total is saturated. Its episode outlasts the
    # staleness (30 s) by the hold (60 s), unread; the burn, as the alert book's burn
    # alerts, the staleness alone.
    assert again.total.budget_saturated
    for _ in range(6):  # unread for 25 s since the first, within the 30 s staleness
        t += 5
        window.add(Snapshot("llm", t, False, error="timed out"))
        down, states = evaluate_window(target, window, states, t)
    assert down.total.slo == again.total.slo
    for _ in range(2):  # unread for 35 s, past the staleness
        t += 5
        window.add(Snapshot("llm", t, False, error="timed out"))
        down, states = evaluate_window(target, window, states, t)
    assert down.total.slo is None and down.total.budget_saturated
    for _ in range(12):  # unread for 95 s, past the staleness and the hold
        t += 5
        window.add(Snapshot("llm", t, False, error="timed out"))
        down, states = evaluate_window(target, window, states, t)
    assert down.total.slo is None and not down.total.budget_saturated
