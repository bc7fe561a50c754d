"""A fifth of a fleet hanging: what holds whatever the machine's speed.

A target whose last scrape failed waits for scrape slots of its own, so 200 hung targets
never hold the healthy targets' slots, and a dead target is backed off. The loop's own
schedule runs here in virtual time (its clock is the event loop's, the scrape a stand-in
that answers or hangs in virtual seconds), so it is exact whatever the machine's speed.
The wall-clock claim (the exporter process scraping 1,000 real local targets) is a
benchmark: `scripts/bench.py --only schedule`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

import aiohttp
import pytest
from aiohttp import web

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape.fetch import ScrapeResult, client_session
from batchscope.exporter.scrape.loop import (
    BACKOFF_AFTER_FAILURES,
    MAX_BACKOFF_INTERVALS,
    MAX_CONCURRENT_FAILING_SCRAPES,
    MAX_CONCURRENT_SCRAPES,
    Exporter,
    ScrapeSlots,
    backoff_intervals,
)
from batchscope.exporter.serve.api_json import history_point
from batchscope.exporter.serve.history import Histories
from tests.support.live import Targets, vllm_payload, wait_for
from tests.support.virtual_time import loop_clock, run_virtual

FLEET = 1000
HUNG = 200  # more than the 128 scrape slots: sharing them, they would starve the healthy


def test_a_dead_target_is_backed_off_doubling_up_to_eight_intervals() -> None:
    assert BACKOFF_AFTER_FAILURES == 3 and MAX_BACKOFF_INTERVALS == 8
    assert [backoff_intervals(n) for n in range(8)] == [1, 1, 1, 2, 4, 8, 8, 8]
    assert backoff_intervals(1000) == MAX_BACKOFF_INTERVALS


@pytest.mark.integration
async def test_hung_targets_take_their_own_slots_and_every_healthy_target_is_scraped() -> None:
    assert HUNG > MAX_CONCURRENT_SCRAPES
    release = asyncio.Event()

    async def fail_then_hang(request: web.Request) -> web.Response:
        if targets.requests[request.match_info["name"]] > 1:  # the second scrape hangs
            await release.wait()
        return web.Response(status=503)

    hung = [f"hung{i:03d}" for i in range(HUNG)]
    healthy = [f"ok{i:03d}" for i in range(FLEET - HUNG)]
    async with Targets() as targets:
        targets.handlers = dict.fromkeys(hung, fail_then_hang)
        targets.payloads = {name: vllm_payload(2) for name in healthy}
        configured = tuple(Target(n, targets.url(n), engine="vllm", cap=8) for n in hung + healthy)
        # No scrape times out in the test: a hung one hangs until released.
        exporter = Exporter(Settings(targets=configured, timeout_seconds=3600.0))
        async with client_session() as session:
            await exporter.run_round(session)  # every hung target fails once
            assert all(exporter.states[n].failures == 1 for n in hung)
            assert not any(exporter.states[n].signals.up for n in hung)
            assert all(exporter.states[n].failures == 0 for n in healthy)

            # The next round, the hung targets first: sharing the slots, they would take
            # every one and no healthy target would be scraped until they time out.
            slots = ScrapeSlots()
            scrapes = [
                asyncio.create_task(exporter._scrape_one(session, slots, exporter.states[n]))
                for n in hung + healthy
            ]
            try:

                async def every_healthy_target_scraped_again() -> bool:
                    return all(scrape.done() for scrape in scrapes[HUNG:])

                async def failing_slots_all_taken() -> bool:
                    hanging = sum(targets.requests[n] - 1 for n in hung)
                    return hanging == MAX_CONCURRENT_FAILING_SCRAPES

                await wait_for(every_healthy_target_scraped_again, 120, "the healthy targets")
                await wait_for(failing_slots_all_taken, 60, "the failing targets' slots taken")
                await asyncio.gather(*scrapes[HUNG:])  # none raised
                # every healthy target evaluated, none of the hung ones' scrapes ended, and
                # past the failing targets' slots no hung target was even asked
                assert all(targets.requests[n] == 2 for n in healthy)
                assert all(exporter.states[n].signals.total.running == 2.0 for n in healthy)
                assert not any(s.done() for s in scrapes[:HUNG])
                asked_again = sum(targets.requests[n] - 1 for n in hung)
                assert asked_again == MAX_CONCURRENT_FAILING_SCRAPES
            finally:
                release.set()
                await asyncio.gather(*scrapes)
    assert all(exporter.states[n].failures == 2 for n in hung)


INTERVAL = 3.0


class StandIn:
    """The scrape of a virtual fleet: `ok*` targets answer at once, `hung*` ones hang until
    their timeout, `dead*` ones refuse at once; notes when each scrape started."""

    def __init__(self) -> None:
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.payload = vllm_payload(2)

    async def __call__(
        self, session: aiohttp.ClientSession, target: Target, timeout: float, max_bytes: int
    ) -> ScrapeResult:
        self.starts[target.name].append(asyncio.get_running_loop().time())
        if target.name.startswith("hung"):
            await asyncio.sleep(timeout)
            return ScrapeResult(None, f"timed out after {timeout:g} s", timeout)
        if target.name.startswith("dead"):
            return ScrapeResult(None, "connection refused", 0.0)
        return ScrapeResult(self.payload, None, 0.0)


def run_loop(names: list[str], intervals: int) -> tuple[Histories, StandIn]:
    """The exporter's `run_forever` over these targets for `intervals` virtual intervals;
    the targets' histories."""
    stand_in = StandIn()

    async def main() -> Histories:
        targets = tuple(Target(n, f"http://127.0.0.1:9/{n}", engine="vllm", cap=8) for n in names)
        settings = Settings(targets=targets, interval_seconds=INTERVAL, timeout_seconds=INTERVAL)
        exporter = Exporter(settings, clock=loop_clock(), scrape_target=stand_in)
        histories = Histories(exporter)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(intervals * INTERVAL, stop.set)
        await exporter.run_forever(stop)
        return histories

    return run_virtual(main()), stand_in


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 9) for a, b in itertools.pairwise(times)]


def test_the_loop_backs_a_dead_target_off_by_the_back_off_sequence() -> None:
    intervals = 60
    _, stand_in = run_loop(["dead", "hung", "ok"], intervals)
    dead = stand_in.starts["dead"]
    backoff = [INTERVAL * backoff_intervals(n) for n in range(1, len(dead))]
    assert backoff[:7] == [3.0, 3.0, 6.0, 12.0, 24.0, 24.0, 24.0]
    # A refused scrape ends at once, a hung one when it times out (one interval): either
    # way the next one starts the back-off after the last one was due, until the end.
    assert gaps(dead) == backoff
    assert gaps(stand_in.starts["hung"]) == backoff
    assert intervals * INTERVAL - dead[-1] <= INTERVAL * MAX_BACKOFF_INTERVALS
    assert set(gaps(stand_in.starts["ok"])) == {INTERVAL}


def test_a_fifth_of_the_fleet_hanging_delays_no_healthy_scrape_in_the_loop() -> None:
    healthy = [f"ok{i:03d}" for i in range(FLEET - HUNG)]
    hung = [f"hung{i:03d}" for i in range(HUNG)]
    intervals, settle = 20, 8
    histories, stand_in = run_loop(hung + healthy, intervals)
    since = settle * INTERVAL
    for name in healthy:
        measured = [t for t in stand_in.starts[name] if t >= since]
        # Once an interval, on its phase, every interval: the hung never take its slot.
        assert len(measured) == intervals - settle, name
        assert set(gaps(measured)) == {INTERVAL}, name
        times = [history_point(row)["t"] for row in histories.rows(name)]
        evaluated = [t for t in times if t >= since]
        assert set(gaps(evaluated)) == {INTERVAL}, name
    hung_per_interval = [
        sum(t >= since for t in stand_in.starts[name]) / (intervals - settle) for name in hung
    ]
    assert max(hung_per_interval) < 0.6  # scripts/bench_schedule.py's claim, exactly here
    assert sum(hung_per_interval) / HUNG == pytest.approx(1 / 6, abs=0.05)
