"""The replica count: demand and a replica's capacity from one series' window, the model's
count from its replicas, routing told apart from capacity, and the held count in virtual
time (exporter/core/demand.py, exporter/core/replicas.py)."""

from __future__ import annotations

import math

import pytest

from batchscope.exporter.core.demand import MIN_HEADROOM, Demand, ReplicaCapacity
from batchscope.exporter.core.evaluate import TargetSignals, series_signals
from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.core.replicas import (
    HeldCount,
    Replica,
    ReplicaBounds,
    ReplicaSettings,
    count_model,
    hold_count,
    model_of,
    plan_round,
    seen_models,
)
from batchscope.exporter.core.signals import SaturationState, SignalSettings
from batchscope.exporter.core.snapshot import SeriesSnapshot, Snapshot
from tests.support.evaluation import evaluate_target

KEY = (("engine", "0"), ("model_name", "m"))
SCRAPE = 5.0
# One replica, cap 16, overloaded: 9.5 requests/s finish, the queue grows 5 a second.
CAP, FINISHED, GROWTH = 16.0, 9.5, 5.0


def _inference(count: float, seconds: float) -> Histogram:
    """`count` requests served in (seconds / 2, seconds]: the p99 is 0.995 of `seconds`."""
    return Histogram((seconds / 2, seconds, math.inf), (0.0, count, count), count * seconds, count)


def _snapshot(
    t: float, running: float, waiting: float, finished: float, **fields
) -> SeriesSnapshot:
    return SeriesSnapshot(
        KEY, "vllm", running=running, waiting=waiting, requests_total=finished, **fields
    )


def overloaded(scrapes: int = 13, service: float = 1.6) -> list[tuple[float, SeriesSnapshot]]:
    """An overloaded replica at its cap: finishing FINISHED a second, its queue growing."""
    return [
        (
            i * SCRAPE,
            _snapshot(
                i * SCRAPE,
                CAP,
                10 + GROWTH * i * SCRAPE,
                FINISHED * i * SCRAPE,
                latency={"inference": _inference(FINISHED * i * SCRAPE, service)},
            ),
        )
        for i in range(scrapes)
    ]


SETTINGS = SignalSettings(cap=CAP, budget_seconds=4.0)


def signals_of(points, settings=SETTINGS):
    return series_signals(points, settings, SaturationState(), points[-1][0])[0]


def test_demand_is_completions_plus_rejections_plus_the_growth_in_flight() -> None:
    s = signals_of(overloaded())
    d = s.demand
    assert (d.completions_per_second, d.growth_per_second) == pytest.approx((FINISHED, GROWTH))
    assert d.rejections_per_second == 0.0 and d.window_seconds == 60.0
    assert d.per_second == pytest.approx(FINISHED + GROWTH)
    refused = [(t, _snapshot(t, CAP, 10, FINISHED * t, rejections_total=2.0 * t)) for t in (0, 60)]
    assert signals_of(refused).demand.per_second == pytest.approx(FINISHED + 2.0)


def test_an_overloaded_replica_reads_its_capacity_at_the_request_cap_with_headroom() -> None:
    c = signals_of(overloaded()).replica_capacity
    assert c.limit == "requests" and c.concurrency == CAP
    # Little's law: 16 running over 9.5 finished a second, 1.684 s a slot.
    assert c.slot_seconds == pytest.approx(CAP / FINISHED)
    assert c.at_limit_per_second == pytest.approx(FINISHED)
    # The p99 wait within 4 s less the p99 service, 1.592 s:
    # 1 - ln(100) 1.684 / (2 x 16 x 2.408) = 0.899.
    expected = 1 - math.log(100) * (CAP / FINISHED) / (2 * CAP * (4.0 - 1.592))
    assert c.headroom == pytest.approx(expected) and c.headroom == pytest.approx(0.899, abs=1e-3)
    assert c.per_second == pytest.approx(FINISHED * expected)
    assert c.inputs["service_seconds"] == pytest.approx(1.592)
    assert c.confidence == "high" and not c.caveats
    assert c.text.startswith("one replica serves 8.54 requests/s within the budget at the request")


def test_one_overloaded_replica_reads_more_than_one() -> None:
    s = signals_of(overloaded())
    replica = Replica("a", dict(KEY), True, CAP, 70, CAP, "requests", s.demand, s.replica_capacity)
    count = count_model("m", [replica], ReplicaBounds())
    # 14.5 asked over 8.54 served within the budget: 2.
    assert count.needed == 2 and count.count == 2 and count.state == "scale_up"
    assert count.limit == "requests" and count.capacity == pytest.approx(8.54, abs=0.01)
    assert count.reason.startswith("14.5 requests/s asked (9.5 finished, in flight +5) over 8.54")


def test_headroom_is_one_without_budget_or_for_a_latency_no_queue_delays() -> None:
    no_budget = signals_of(overloaded(), SignalSettings(cap=CAP)).replica_capacity
    assert no_budget.headroom == 1.0 and no_budget.per_second == pytest.approx(FINISHED)
    assert no_budget.caveats == ("no latency budget: the count keeps each replica at its limit",)
    per_token = SignalSettings(cap=CAP, budget_seconds=0.05, histogram="tpot")
    assert signals_of(overloaded(), per_token).replica_capacity.headroom == 1.0


def test_a_budget_the_service_fills_keeps_the_least_headroom_and_says_so() -> None:
    c = signals_of(overloaded(service=4.0)).replica_capacity
    assert c.headroom == MIN_HEADROOM
    assert "the service time leaves the budget little room for a queue" in c.caveats


def test_without_the_service_quantile_its_mean_stands_and_confidence_drops() -> None:
    points = [(t, _snapshot(t, CAP, 10, FINISHED * t)) for t in (0.0, 30.0, 60.0)]
    c = signals_of(points).replica_capacity
    assert c.inputs["service_seconds"] == pytest.approx(CAP / FINISHED)
    assert c.confidence == "medium" and len(c.caveats) == 1


def test_the_kv_cache_holds_the_mean_running_and_the_token_budget_scales_it() -> None:
    kv = [
        (t, _snapshot(t, r, 20, 2.0 * t, kv_usage=0.97, preemptions_total=t))
        for t, r in ((0.0, 6), (30.0, 8), (60.0, 7))
    ]
    c = signals_of(kv).replica_capacity
    assert c.limit == "kv_cache" and c.concurrency == 7.0
    assert c.at_limit_per_second == pytest.approx(2.0)  # runs what the cache holds
    budget = [
        (
            t,
            _snapshot(
                t,
                4,
                20,
                2.0 * t,
                kv_usage=0.1,
                step_tokens=Histogram((math.inf,), (n,), 480 * n, n),
            ),
        )
        for t, n in ((0.0, 0.0), (60.0, 600.0))
    ]
    c = signals_of(
        budget, SignalSettings(cap=CAP, budget_seconds=4.0, token_budget=512)
    ).replica_capacity
    assert c.limit == "token_budget"
    assert c.concurrency == pytest.approx(4 * 512 / 480)


def _replica(limit, demand, capacity, running=8.0, waiting=0.0, read=True, engine="0"):
    d = Demand(demand, demand, 0.0, 0.0, 60.0)
    c = ReplicaCapacity(capacity, limit, capacity, 16.0, 1.0, 1.0) if capacity else None
    return Replica("t" + engine, {"engine": engine}, read, running, waiting, 16.0, limit, d, c)


def test_arrivals_or_routing_never_count_more_than_today() -> None:
    calm = count_model("m", [_replica("arrivals", 30.0, 10.0)], ReplicaBounds())
    assert calm.needed == 3 and calm.count == 1 and calm.state == "steady"
    queued = _replica("requests", 30.0, 10.0, running=16, waiting=32)
    queued = Replica(*[getattr(queued, f) for f in Replica.__slots__[:-1]], "queued")
    idle = Replica("t1", {"engine": "1"}, True, 0.0, 0.0, 16.0, None, None, None, "idle")
    routed = count_model("m", [queued, idle], ReplicaBounds())
    assert routed.state == "routing" and routed.needed == 3 and routed.count == 2
    assert routed.reason.startswith(
        "t0 engine 0 runs 16 of 16 with 32 waiting at the request cap while t1 engine 1 runs "
        "0 of 16 with nothing waiting: requests are routed unevenly, not short of capacity"
    )


def test_a_replica_queued_at_its_cap_that_finished_nothing_keeps_arrivals_from_binding():
    """Arrivals bind only where every read replica with a limit is at the arrivals: one
    queued at its cap with no capacity measured yet (nothing finished) still binds."""
    calm = _replica("arrivals", 30.0, 10.0, engine="0")
    stuck = _replica("requests", 6.0, None, running=16, waiting=40, engine="1")
    count = count_model("m", [calm, stuck], ReplicaBounds())
    # 36 asked over 10 a replica: 4 needed, not ceilinged at today's 2.
    assert (count.needed, count.count, count.state) == (4, 4, "scale_up")
    assert "never more than now" not in count.reason


def test_a_batchers_count_says_items_per_second() -> None:
    d = Demand(30.0, 30.0, 0.0, 0.0, 60.0, unit="items/s")
    c = ReplicaCapacity(10.0, "requests", 10.0, 16.0, 1.0, 1.0, unit="items/s")
    batcher = Replica("b", {}, True, None, 4.0, 16.0, "requests", d, c)
    count = count_model("m", [batcher], ReplicaBounds())
    assert count.needed == 3
    assert count.reason.startswith("30 items/s asked (30 finished, in flight +0) over 10 a")


def test_idle_is_the_minimum_bounds_hold_and_unread_is_no_count() -> None:
    idle = Replica("t", {}, True, 0.0, 0.0, 16.0, None, None, None, "idle")
    assert count_model("m", [idle], ReplicaBounds(2, 5)).count == 2
    busy = _replica("requests", 100.0, 10.0, running=16, waiting=50)
    assert count_model("m", [busy], ReplicaBounds(1, 4)).count == 4
    assert count_model("m", [busy], ReplicaBounds(1, 4)).needed == 10
    unread = count_model("m", [Replica("t", {}, read=False)], ReplicaBounds())
    assert (unread.count, unread.state) == (None, "unread")


def test_the_model_is_the_configured_one_else_its_label_else_the_target() -> None:
    assert model_of("llama", {"model_name": "x"}, "t") == "llama"
    assert model_of(None, {"model_name": "x"}, "t") == "x"
    assert model_of(None, {"model": "y"}, "t") == "y"
    assert model_of(None, {}, "t") == "t"


HOLD = ReplicaSettings(scale_up_seconds=60.0, scale_down_seconds=300.0, stale_seconds=120.0)


def run(counts, step=5.0, settings=HOLD, start=None):
    """The held count after each of `counts` ("unread": a round that read nothing), one a
    `step` of virtual time, with `start` replicas today (default: the first count)."""
    held, out = HeldCount(), []
    start = counts[0] if start is None else start
    for i, count in enumerate(counts):
        read = count != "unread"
        held = hold_count(held, count if read else None, read, i * step, settings, start)
        out.append(held)
    return out


def test_the_first_count_starts_from_todays_replicas_and_waits_its_hold() -> None:
    """A restarted exporter publishes today's replicas at first, not a count that has held
    for no time: up after the saturation hold (60 s), down after the window (300 s)."""
    up = [h.desired for h in run([5] * 20, start=2)]
    assert up[:12] == [2] * 12 and up[12:] == [5] * 8  # t=60 s: held for the hold
    assert run([5], start=2)[0].pending == 2 + 3
    down = [h.desired for h in run([1] * 70, start=4)]
    assert down[:60] == [4] * 60 and down[60:] == [1] * 10  # t=300 s
    # Measuring (no count yet) publishes nothing, as before.
    assert run([None, None], start=4)[-1].desired is None


def test_a_drop_for_two_minutes_that_comes_back_does_not_scale_down() -> None:
    counts = [4] * 12 + [2] * 24 + [4] * 60  # 2 minutes at 2, then back
    held = run(counts)
    assert {h.desired for h in held} == {4}


def test_a_drop_that_holds_for_the_window_scales_down_to_the_most_seen() -> None:
    counts = [4] * 12 + [2] * 30 + [3] * 30 + [2] * 40
    held = run(counts)
    # 2 then 3 below 4 from t=60 s: five minutes later (t=360 s) the most seen, 3.
    assert [h.desired for h in held[:72]] == [4] * 72
    assert held[72].desired == 3 and held[72].read_at == 360.0
    # Then 2 for five minutes more.
    assert held[-1].desired == 3 and run(counts + [2] * 30)[-1].desired == 2


def test_a_rise_scales_up_once_it_holds_for_the_saturation_hold_to_the_least_seen() -> None:
    held = run([2] * 4 + [5] * 6 + [4] * 20)
    desired = [h.desired for h in held]
    # Above 2 from t=20 s; at t=80 s the least seen above is 4.
    assert desired[:16] == [2] * 16 and desired[16] == 4
    assert run([2, 5, 2, 5, 2, 5] * 10)[-1].desired == 2  # flapping never holds


def test_unread_rounds_hold_the_count_until_the_staleness_then_it_is_absent() -> None:
    held = run([3] * 4 + ["unread"] * 24 + [1])
    assert [h.desired for h in held[4:28]] == [3] * 24  # 120 s unread: kept
    assert held[27].stale is False
    after = run([3] * 4 + ["unread"] * 30)
    assert after[-1].desired is None and after[-1].stale
    # Read again: it starts from today's replicas (3), the lower count pending its window.
    again = run([3] * 4 + ["unread"] * 30 + [1])[-1]
    assert (again.desired, again.pending, again.since) == (3, 1, 34 * 5.0)


def test_unknown_counts_keep_what_was_held() -> None:
    # Never NaN: tests/exporter/test_replica_metrics.py feeds infinite and NaN inputs.
    held = run([3, None, None, 3])
    assert [h.desired for h in held] == [3, 3, 3, 3]


def _dp_snapshot(t: float, engine0: tuple, engine1: tuple) -> Snapshot:
    def series(engine, running, waiting, finished):
        return SeriesSnapshot(
            (("engine", engine), ("model_name", "m")),
            "vllm",
            running=running,
            waiting=waiting,
            kv_usage=0.2,
            requests_total=finished,
        )

    return Snapshot("dp", t, True, (series("0", *engine0), series("1", *engine1)))


def test_a_rank_queueing_at_its_cap_beside_an_idle_one_is_routing_not_batch_limited() -> None:
    snapshots = [_dp_snapshot(t, (8, 32, 2.0 * t), (0, 0, 0)) for t in (0.0, 30.0, 60.0)]
    signals, _ = evaluate_target("dp", "u", snapshots, SignalSettings(cap=8), {}, 60.0)
    assert [s.diagnosis.state for s in signals.series] == ["healthy", "idle"]
    assert signals.total.diagnosis.state == "routing"
    assert signals.total.diagnosis.reason.startswith(
        "dp engine 0 runs 8 of 8 with 32 waiting at the request cap while dp engine 1 runs 0"
    )
    # The model counts two replicas and recommends none for the queue.
    (model,) = plan_round([signals], {}, {}, {}, 60.0, ReplicaSettings())
    assert model.count.current == 2 and model.count.state == "routing"
    # At most today's 2, and the held count starts at today's.
    assert model.count.count <= 2 and model.desired == 2


def test_an_unread_target_stands_for_its_replicas_as_last_seen() -> None:
    points = overloaded()
    s = signals_of(points)
    up = TargetSignals("a", "u", 60.0, True, None, (s,), s)
    seen = seen_models([up], {})
    down = TargetSignals("a", "u", 65.0, False, "refused", (), s)
    (model,) = plan_round([down], {}, seen, {"m": HeldCount(2, read_at=60.0)}, 65.0, HOLD)
    assert model.count.current == 1 and model.count.read == 0
    assert model.desired == 2 and not model.held.stale


def test_bounds_come_from_the_flags_and_each_models_entry_with_file_line_and_key(tmp_path):
    from batchscope.exporter.config.fleet_file import load_config
    from batchscope.exporter.config.settings import ConfigError
    from batchscope.exporter.serve.replica_plan import replica_settings

    path = tmp_path / "fleet.yaml"
    path.write_text(
        "targets:\n  - {url: 'http://a:8000', model: llama}\nmax_replicas: 6\n"
        "models:\n  llama: {min_replicas: 2}\n  tiny: {max_replicas: 3}\n"
    )
    settings = load_config(path, {"scale_down_seconds": 120.0})
    assert settings.targets[0].model == "llama"
    made = replica_settings(settings)
    assert made.bounds_of("llama") == ReplicaBounds(2, 6)
    assert made.bounds_of("tiny") == ReplicaBounds(1, 3)
    assert made.bounds_of("other") == ReplicaBounds(1, 6)
    assert (made.scale_down_seconds, made.scale_up_seconds) == (120.0, settings.hold_seconds)
    for text, said in (
        ("models:\n  llama: {min_replicas: 3, max_replicas: 2}\n", "fleet.yaml:4: models.llama.max_replicas: must be >= min_replicas (3) (got 2)"),
        ("models:\n  llama: {max_replica: 2}\n", "fleet.yaml:4: models.llama.max_replica: unknown key; did you mean 'max_replicas'?"),
        ("models:\n  llama: {min_replicas: -1}\n", "fleet.yaml:4: models.llama.min_replicas: must be >= 1"),
        ("models:\n  llama: {min_replicas: 0}\n", "fleet.yaml:4: models.llama.min_replicas: must be >= 1: a model scaled to zero has no pods, so no series to scale it back up (got 0)"),
        ("min_replicas: 0\n", "fleet.yaml:3: min_replicas: must be >= 1: a model scaled to zero has no pods, so no series to scale it back up (got 0)"),
        ("models: [llama]\n", "fleet.yaml:3: models: must be a mapping of model names"),
        ("min_replicas: 4\nmax_replicas: 2\n", "fleet.yaml:4: max_replicas: max_replicas 2 is below min_replicas 4"),
        ("min_replicas: 4\nmodels:\n  tiny: {max_replicas: 3}\n", "models.tiny: max_replicas 3 is below min_replicas 4 (a key a model leaves out takes the fleet's)"),
    ):  # fmt: skip
        path.write_text("targets:\n  - {url: 'http://a:8000'}\n" + text)
        with pytest.raises(ConfigError) as refused:
            load_config(path)
        assert said in str(refused.value), str(refused.value)


def test_a_replica_waiting_below_its_cap_for_no_limit_shown_is_counted_at_its_cap() -> None:
    # 7 of 16 running with 2 waiting and the cache empty: a wait until the next step, not
    # a full replica. Counted at the mean running, it once read 6 replicas where 3 sufficed.
    points = [(t, _snapshot(t, 7, 2, 2.5 * t, kv_usage=0.1)) for t in (0.0, 30.0, 60.0)]
    c = signals_of(points).replica_capacity
    assert c.limit == "unexplained" and c.concurrency == CAP
    assert c.caveats[0] == "no limit the metrics show binds: counted at its cap"
    full = _replica("requests", 6.0, 5.0, running=16, waiting=4, engine="0")
    calm = _replica("unexplained", 2.0, 2.0, running=7, waiting=2, engine="1")
    count = count_model("m", [full, calm], ReplicaBounds())
    # The model's capacity is the full replica's: it is at a limit the metrics show.
    assert (count.capacity, count.limit) == (5.0, "requests") and count.needed == 2


def test_the_planner_holds_each_models_count_between_rounds_and_forgets_removed_targets():
    from batchscope.exporter.config.settings import Settings, Target
    from batchscope.exporter.serve.replica_plan import ReplicaPlanner

    settings = Settings(targets=(Target("a", "http://a:1/metrics"),), hold_seconds=30.0)
    planner = ReplicaPlanner(settings)
    s = signals_of(overloaded())
    up = TargetSignals("a", "u", 60.0, True, None, (s,), s)
    # The first count (2) starts from today's 1 replica and waits the 30 s hold.
    (first,) = planner.step([up], settings.targets, 60.0)
    assert (first.count.model, first.desired, first.count.needed) == ("m", 1, 2)
    assert (first.held.pending, first.held.since) == (2, 60.0)
    (risen,) = planner.step([up], settings.targets, 90.0)
    assert risen.desired == 2
    down = TargetSignals("a", "u", 95.0, False, "refused", (), s)
    (held,) = planner.step([down], settings.targets, 95.0)
    assert (held.count.current, held.count.read, held.desired) == (1, 0, 2)
    # Unread past the staleness (hold 30 s and an interval): absent, flagged.
    (stale,) = planner.step([down], settings.targets, 90.0 + 30.0 + 5.0 + 1.0)
    assert stale.desired is None and stale.held.stale
    # A target no longer configured takes its replicas with it.
    assert planner.step([down], (), 100.0) == ()
