"""A fifth of a fleet hanging: what holds whatever the machine's speed.

A target whose last scrape failed waits for scrape slots of its own, so 200 hung targets
never hold the healthy targets' slots, and a dead target is backed off. The wall-clock
claim (the exporter process scraping 1,000 targets, each healthy one once an interval
while 200 hang) is a benchmark: `scripts/bench.py --only schedule`.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from exporter.config.settings import Settings, Target
from exporter.scrape.http_client import Connections
from exporter.scrape.loop import (
    BACKOFF_AFTER_FAILURES,
    MAX_BACKOFF_INTERVALS,
    MAX_CONCURRENT_FAILING_SCRAPES,
    MAX_CONCURRENT_SCRAPES,
    Exporter,
    ScrapeSlots,
    backoff_intervals,
)
from tests.support.live import Targets, vllm_payload, wait_for

FLEET = 1000
HUNG = 200  # more than the 128 scrape slots: sharing them, they would starve the healthy


def test_a_dead_target_is_backed_off_doubling_up_to_eight_intervals() -> None:
    assert BACKOFF_AFTER_FAILURES == 3 and MAX_BACKOFF_INTERVALS == 8
    assert [backoff_intervals(n) for n in range(8)] == [1, 1, 1, 2, 4, 8, 8, 8]
    assert backoff_intervals(1000) == MAX_BACKOFF_INTERVALS


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
        async with Connections() as connections:
            await exporter.run_round(connections)  # every hung target fails once
            assert all(exporter.states[n].failures == 1 for n in hung)
            assert not any(exporter.states[n].signals.up for n in hung)
            assert all(exporter.states[n].failures == 0 for n in healthy)

            # The next round, the hung targets first: sharing the slots, they would take
            # every one and no healthy target would be scraped until they time out.
            slots = ScrapeSlots()
            scrapes = [
                asyncio.create_task(exporter._scrape_one(connections, slots, exporter.states[n]))
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
