"""The adaptive batcher against its budget (Terrane's "Dynamic batching: more throughput without wrecking the tail"): light load fires at once, heavy
load fills batches within the budget, admission control refuses what cannot make it,
and very different lengths batch apart.

The timing claims run in virtual time (`tests.support.virtual_time`) on a simulated
device whose every batch costs what the scenario says: what they measure follows from
the arrivals and the costs, not from how busy the machine is. The assertions read the
batcher's own records (its triggers, batch sizes and latency histogram)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from batchscope.demo_server.devices import select_device
from batchscope.demo_server.embedding import batcher as batcher_module
from batchscope.demo_server.embedding.batch_policy import (
    DecayingPeak,
    Decision,
    adaptive_decision,
    padding_tokens,
    predicted_drain_seconds,
    shape_class,
)
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.queueing import OverBudget
from tests.support.batching import (
    FakeModel,
    VirtualDevice,
    make_batcher,
    outcomes,
    poisson_load,
    sample,
    triggers,
)
from tests.support.virtual_time import run_virtual

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def frozen_gc() -> Iterator[None]:
    """As the demo server runs: start-up objects out of the collector, so a full
    collection (100 ms and more with torch loaded) does not land inside a measurement."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_drain_prediction_runs_each_shape_group_in_full_batches_after_the_running_one() -> None:
    def cost(size: int) -> float:
        return 0.002 + 0.0001 * size

    # 10 items of one shape in batches of 4: 4 + 4 + 2; 3 of another: one batch of 3.
    expected = 0.005 + 2 * cost(4) + cost(2) + cost(3)
    assert predicted_drain_seconds([10, 3], 0.005, cost, 4) == pytest.approx(expected)
    assert predicted_drain_seconds([], 0.0, cost, 4) == 0.0


def test_shape_classes_split_lengths_a_factor_of_four_apart() -> None:
    assert [shape_class(n) for n in (1, 64, 65, 256, 257, 1024, 1025)] == [0, 0, 1, 1, 2, 2, 3]
    assert padding_tokens([3, 5, 8]) == 3 * 8 - 16
    assert padding_tokens([]) == 0


def test_lag_peak_is_kept_and_forgotten_exponentially() -> None:
    peak = DecayingPeak(memory_seconds=2.0)
    peak.observe(10.0, 0.020)
    peak.observe(10.5, 0.005)  # smaller than the remembered peak: no change
    assert peak.value(10.0) == 0.020
    assert peak.value(12.0) == pytest.approx(0.020 / 2.718281828, rel=1e-6)


def test_one_arrival_per_ten_budgets_runs_alone_and_at_once() -> None:
    budget_s = 0.020

    async def scenario() -> None:
        registry = CollectorRegistry()
        device = VirtualDevice(lambda size: 0.002)
        batcher = make_batcher(
            device,
            registry,
            BatcherSettings(mode="adaptive", max_batch_size=64, latency_budget_seconds=budget_s),
            cost_prior={1: 0.002},
        )
        await batcher.start()
        for _ in range(12):
            await batcher.submit(["lonely"])
            await asyncio.sleep(10 * budget_s)
        await batcher.stop()
        assert [len(b) for b in device.batches] == [1] * 12
        assert triggers(registry) == {"full": 0, "timeout": 0, "budget": 12}
        # The policy decides to wait 0, and in virtual time nothing else adds a wait: a
        # policy that waited for company (a fixed 15 ms, or the budget's edge) could not pass.
        within_5ms = sample(registry, "batchscope_batcher_queue_wait_seconds_bucket", le="0.005")
        assert within_5ms == 12
        assert sample(registry, "batchscope_batcher_queue_wait_seconds_sum") == 0.0

    run_virtual(scenario())


def test_p99_stays_within_the_budget_on_sim_h200_when_traffic_fills_batches() -> None:
    """3,000 items/s against the H200 encoder's curve (1.7 ms at 1 item, 2 ms at 128):
    five times what the device serves one at a time (~600/s), so batches must fill: to
    serve 3,000/s at all the device needs batches of 6 (3,000 x 1.97 ms <= 6), and the
    policy waits for 8 (the smallest that keeps up with its 1.2 rate margin), which form
    in 2.3 ms. The budget is 75 ms, a bucket edge of the latency histogram."""
    h200 = select_device("sim:h200")

    async def scenario() -> None:
        registry = CollectorRegistry()
        device = VirtualDevice(lambda size: h200.simulated_ms("encoder", size) / 1000)
        batcher = make_batcher(
            device,
            registry,
            BatcherSettings(mode="adaptive", max_batch_size=128, latency_budget_seconds=0.075),
            cost_prior={1: 0.0017, 128: 0.0020},
        )
        await batcher.start()
        served = await poisson_load(batcher, rate_per_s=3000, duration_s=1.5, seed=5)
        await batcher.stop()
        assert len(served) > 4000
        batches = sample(registry, "batchscope_batcher_batch_size_count")
        assert sample(registry, "batchscope_batcher_batch_size_sum") / batches > 6
        # p99 within the 75 ms budget, from the batcher's own latency histogram.
        within = sample(registry, "batchscope_batcher_request_latency_seconds_bucket", le="0.075")
        total = sample(registry, "batchscope_batcher_request_latency_seconds_count")
        assert total == len(served)
        assert within / total >= 0.99

    run_virtual(scenario())


def test_the_wait_for_company_is_the_first_plan_s_allowance_however_the_rate_decays() -> None:
    """At 200/s with 10 ms batches, one item does not keep up (200 x 10 ms x 1.2 > 1)
    and the smallest batch that does is 3: the plan allows (3 - 1) / 200 = 10 ms for
    company. Once those 10 ms have passed the queue fires, even though the rate has
    decayed meanwhile (a slower rate would allow a longer wait: a rolling plan), and
    even when float rounding leaves 1e-18 s of the allowance."""

    def decide(rate: float, waited: float, allowance: float | None) -> Decision:
        return adaptive_decision(
            1,
            waited,
            rate,
            lambda size: 0.010,
            0.200,
            256,
            waited_for_company_seconds=waited,
            company_allowance_seconds=allowance,
        )

    first = decide(200.0, 0.0, None)
    assert not first.fire and first.target_size == 3
    assert first.company_seconds == pytest.approx(0.010)
    assert first.wait_seconds == pytest.approx(0.010)
    # Without the allowance, a rate decayed to 180/s (still 3 to keep up: 180 x 10 ms x
    # 1.2 = 2.16) would plan (3 - 1) / 180 - 10 ms = 1.1 ms more.
    rolling = decide(180.0, 0.010, None)
    assert not rolling.fire and rolling.wait_seconds == pytest.approx(2 / 180 - 0.010)
    spent = decide(180.0, 0.010, first.company_seconds)
    assert spent.fire and spent.trigger == "budget"
    rounded = decide(200.0, 0.010 - 5e-18, 0.010)
    assert rounded.fire and rounded.trigger == "budget"
    halfway = decide(180.0, 0.004, first.company_seconds)
    assert not halfway.fire and halfway.wait_seconds == pytest.approx(0.006)


def test_a_lone_item_after_a_burst_waits_for_company_once_then_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 items at once set the smoothed arrival rate near 200/s, which decays over a
    second: an item that comes alone right after finds one item cannot keep up with that
    rate (200/s x 10 ms x 1.2 > 1) and waits for company. The company does not come. It
    must wait one plan and fire, not plan the same wait again until the budget ends."""
    decisions: list[tuple[int, float, Decision]] = []

    def recording(queue_len: int, *args: object, **kwargs: float) -> Decision:
        decision = adaptive_decision(queue_len, *args, **kwargs)  # type: ignore[arg-type]
        decisions.append((queue_len, kwargs["waited_for_company_seconds"], decision))
        return decision

    monkeypatch.setattr(batcher_module, "adaptive_decision", recording)

    async def scenario() -> None:
        registry = CollectorRegistry()
        device = VirtualDevice(lambda size: 0.010)
        batcher = make_batcher(
            device,
            registry,
            BatcherSettings(mode="adaptive", max_batch_size=256, latency_budget_seconds=0.200),
            cost_prior={1: 0.010, 256: 0.010},
        )
        await batcher.start()
        await asyncio.gather(*(batcher.submit([f"r{i}"]) for i in range(200)))
        decisions.clear()
        await batcher.submit(["lonely"])
        await batcher.stop()
        assert device.batches[-1] == ["lonely"]

    run_virtual(scenario())
    waits = [d for _, _, d in decisions if not d.fire]
    assert [queue_len for queue_len, _, _ in decisions] == [1, 1]
    assert len(waits) == 1 and waits[0].target_size > 1
    (_, first_waited, _), (_, second_waited, fired) = decisions
    assert first_waited == 0.0  # the burst's batch fired: a fresh allowance
    assert fired.fire and fired.trigger == "budget"
    assert second_waited >= waits[0].wait_seconds  # it fired because the plan ran out


def test_admission_control_refuses_what_cannot_make_the_budget_and_serves_the_rest() -> None:
    """40 requests at once into batches of 4 that take 30 ms each, budget 150 ms (135 ms
    planned after the 10% headroom): 4 batches (120 ms) fit, the fifth (150 ms) does
    not, so 16 are served and 24 refused at once. The served finish at 120 ms."""

    async def scenario() -> None:
        registry = CollectorRegistry()
        device = VirtualDevice(lambda size: 0.030)
        batcher = make_batcher(
            device,
            registry,
            BatcherSettings(mode="adaptive", max_batch_size=4, latency_budget_seconds=0.150),
            cost_prior={1: 0.030, 4: 0.030},
        )
        await batcher.start()
        clock = asyncio.get_running_loop().time
        started = clock()
        answers = await asyncio.gather(
            *(batcher.submit([f"r{i}"]) for i in range(40)), return_exceptions=True
        )
        await batcher.stop()
        refused = [a for a in answers if isinstance(a, OverBudget)]
        assert len(refused) == 24
        assert all(a.retry_after_seconds >= 1 for a in refused)
        assert answers[:16] == [[[2.0]]] * 10 + [[[3.0]]] * 6
        assert outcomes(registry) == {"ok": 16, "error": 0, "rejected": 24, "cancelled": 0}
        assert sample(registry, "batchscope_batcher_rejected_requests_total", reason="budget") == 24
        assert sum(len(b) for b in device.batches) == 16
        within = sample(registry, "batchscope_batcher_request_latency_seconds_bucket", le="0.15")
        assert within == 16
        assert clock() - started == pytest.approx(0.120)  # 4 batches; refused at once
        latencies = sample(registry, "batchscope_batcher_request_latency_seconds_sum")
        assert latencies == pytest.approx(4 * (0.030 + 0.060 + 0.090 + 0.120))

    run_virtual(scenario())


def test_a_cost_estimate_over_the_budget_heals_on_the_items_that_find_the_batcher_idle() -> None:
    """A stall taught the curve that one item costs 200 ms (a 50 ms budget); the device
    takes 5 ms. Items sent one after another find the batcher idle and are served, each
    teaching the curve the real cost, until a burst is admitted by the queue ahead of it
    again: 6 at once fit in batches of 4 and 2 at 5 ms an item."""

    async def scenario() -> None:
        registry = CollectorRegistry()
        batcher = make_batcher(
            VirtualDevice(lambda size: 0.005 * size),
            registry,
            BatcherSettings(mode="adaptive", max_batch_size=4, latency_budget_seconds=0.050),
            cost_prior={1: 0.200},
        )
        await batcher.start()
        for i in range(20):
            assert await batcher.submit([f"alone {i}"]) == [[6.0 + len(str(i))]]
        assert batcher.cost_curve.estimate(1) < 0.010
        await asyncio.sleep(2.0)  # the arrival rate of the lone items decays
        answers = await asyncio.gather(*(batcher.submit([f"b{i}"]) for i in range(6)))
        await batcher.stop()
        assert answers == [[[2.0]]] * 6
        assert outcomes(registry) == {"ok": 26, "error": 0, "rejected": 0, "cancelled": 0}

    run_virtual(scenario())


def test_the_fixed_policy_admits_up_to_its_queue_bound_whatever_the_budget() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        batcher = make_batcher(
            FakeModel(lambda size: 0.010),
            registry,
            BatcherSettings(
                mode="fixed", max_batch_size=4, max_wait_seconds=0.0, latency_budget_seconds=0.001
            ),
        )
        await batcher.start()
        await asyncio.gather(*(batcher.submit([f"r{i}"]) for i in range(20)))
        await batcher.stop()
        assert outcomes(registry)["ok"] == 20

    asyncio.run(scenario())


def test_very_different_lengths_batch_apart_and_the_padding_avoided_is_counted() -> None:
    short, long = "s" * 10, "l" * 500  # shape classes 0 and 2

    async def scenario() -> None:
        registry = CollectorRegistry()
        model = FakeModel()
        batcher = make_batcher(
            model, registry, BatcherSettings(max_batch_size=4, max_wait_seconds=0.050)
        )
        await batcher.start()
        await asyncio.gather(*(batcher.submit([short if i % 2 else long]) for i in range(8)))
        await batcher.stop()
        assert sorted(sorted(set(b)) for b in model.batches) == [[long], [short]]
        tokens = "batchscope_batcher_batch_tokens_total"
        assert sample(registry, tokens, kind="real") == 4 * 10 + 4 * 500
        assert sample(registry, tokens, kind="padding") == 0
        # The long group fired first; in arrival order its 4 slots would have held
        # 2 long and 2 short items: 2 x (500 - 10) padding tokens, avoided. The short
        # group, alone in the queue when it fired, avoided none.
        avoided = sample(registry, "batchscope_batcher_padding_avoided_tokens_total")
        assert avoided == 2 * (500 - 10)

    asyncio.run(scenario())
