"""A request for /metrics (or a JSON body) never waits for a render while a body of this
round or the previous one exists; bodies are rendered after a round only for readers."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Coroutine
from typing import Any

import aiohttp
import pytest

from batchscope.exporter.config.settings import Settings
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.app import BodyKind, RoundCache

# Bounds a test that would otherwise hang on a bug; no test asserts a duration.
HANG_GUARD_SECONDS = 20


class Renders:
    """A render per kind that counts its calls (`calls[kind]`) and, while `gate` is clear,
    blocks: a render that takes as long as the test wants."""

    def __init__(self, *kinds: str) -> None:
        self.calls = dict.fromkeys(kinds, 0)
        self.gate = threading.Event()
        self.gate.set()

    def of(self, kind: str):
        def render(_: list[TargetSignals]) -> bytes:
            self.calls[kind] += 1
            body = f"{kind} render {self.calls[kind]}".encode()
            assert self.gate.wait(HANG_GUARD_SECONDS), "the test never opened the gate"
            return body

        return render

    def table(self) -> dict[str, BodyKind]:
        """Each kind kept fresh for 60 s after a request: 12 rounds of 5 s."""
        return {kind: BodyKind(self.of(kind), 60.0) for kind in self.calls}


async def next_round(exporter: Exporter) -> None:
    """One round of an exporter without targets: only `rounds` moves."""
    async with aiohttp.ClientSession() as session:
        await exporter.run_round(session)


async def until(check, what: str) -> None:
    for _ in range(HANG_GUARD_SECONDS * 100):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def at_once(request: Coroutine[Any, Any, bytes]) -> bytes:
    """What a request answers when it answers without ever suspending: it waited on
    nothing (no render, no timer). Fails when it would wait."""
    try:
        request.send(None)
    except StopIteration as answered:
        return answered.value
    request.close()
    pytest.fail("the request waited")


def exporter_without_targets() -> Exporter:
    return Exporter(Settings(targets=(), interval_seconds=5.0))


async def test_a_request_during_a_render_gets_the_previous_rounds_body_at_once() -> None:
    exporter, renders = exporter_without_targets(), Renders("metrics")
    cache = RoundCache(exporter, renders.table())
    assert await cache.body("metrics", compressed=False) == b"metrics render 1"
    await next_round(exporter)
    renders.gate.clear()
    # Round 1's render starts and blocks; both requests answer with round 0's body.
    plain = at_once(cache.body("metrics", False))
    packed = at_once(cache.body("metrics", True))
    assert (plain, gzip.decompress(packed)) == (b"metrics render 1", b"metrics render 1")
    await until(lambda: renders.calls["metrics"] == 2, "round 1's render to start")
    renders.gate.set()
    await until(lambda: cache._bodies["metrics"][0] == 1, "round 1's body")
    assert at_once(cache.body("metrics", False)) == b"metrics render 2"
    assert renders.calls["metrics"] == 2  # one render per round, whatever the requests


async def test_a_body_two_rounds_old_is_not_served_the_request_waits_for_this_rounds() -> None:
    exporter, renders = exporter_without_targets(), Renders("metrics")
    cache = RoundCache(exporter, renders.table())
    assert await cache.body("metrics", False) == b"metrics render 1"
    await next_round(exporter)
    await next_round(exporter)
    renders.gate.clear()
    request = asyncio.create_task(cache.body("metrics", False))
    await until(lambda: renders.calls["metrics"] == 2, "round 2's render to start")
    done, _ = await asyncio.wait({request}, timeout=0.3)
    assert not done  # the render is held by the gate: the request is waiting on it
    renders.gate.set()
    assert await asyncio.wait_for(request, HANG_GUARD_SECONDS) == b"metrics render 2"


async def test_a_client_that_goes_away_does_not_cancel_the_render_others_wait_for() -> None:
    exporter, renders = exporter_without_targets(), Renders("metrics")
    cache = RoundCache(exporter, renders.table())
    renders.gate.clear()
    first = asyncio.create_task(cache.body("metrics", False))
    second = asyncio.create_task(cache.body("metrics", False))
    await until(lambda: renders.calls["metrics"] == 1, "the render to start")
    first.cancel()
    renders.gate.set()
    assert await asyncio.wait_for(second, HANG_GUARD_SECONDS) == b"metrics render 1"
    assert renders.calls["metrics"] == 1


async def test_a_kind_is_kept_fresh_while_read_in_its_last_seconds_of_rounds() -> None:
    exporter, renders = exporter_without_targets(), Renders("metrics", "signals")
    cache = RoundCache(exporter, renders.table(), expected=("metrics",))
    window = 12  # 60 s at 5 s a round
    assert cache.read_recently("metrics") and not cache.read_recently("signals")
    await cache.body("signals", False)
    for _ in range(window):
        await next_round(exporter)
    assert cache.read_recently("metrics") and cache.read_recently("signals")
    await next_round(exporter)
    assert not cache.read_recently("metrics") and not cache.read_recently("signals")
    await cache.body("metrics", False)
    assert cache.read_recently("metrics")


async def test_after_a_round_only_the_kinds_someone_reads_are_rendered() -> None:
    exporter, renders = exporter_without_targets(), Renders("signals", "metrics")
    cache = RoundCache(exporter, renders.table(), expected=("metrics",))
    keeper = asyncio.create_task(cache.keep_fresh())
    await asyncio.sleep(0)  # it starts waiting for the round after round 0
    try:
        await next_round(exporter)
        # keep_fresh goes through the kinds in order: once metrics (second) is rendered,
        # signals (first) had its turn.
        await until(lambda: cache._bodies.get("metrics", (0,))[0] == 1, "round 1's metrics")
        assert renders.calls == {"signals": 0, "metrics": 1}
        await cache.body("signals", False)  # waits: there is no signals body yet
        await next_round(exporter)
        await until(lambda: cache._bodies["metrics"][0] == 2, "round 2's metrics")
        assert renders.calls == {"signals": 2, "metrics": 2}
        assert cache._bodies["signals"][0] == 2
    finally:
        keeper.cancel()


async def test_a_request_before_keep_fresh_renders_the_round_stepped_for_it() -> None:
    """The replica count steps once a round, before that round's first render, whoever
    starts it: a request that comes as the round ends reads this round's count, not the
    last round's."""
    exporter = exporter_without_targets()
    stepped: list[int] = []
    cache = RoundCache(
        exporter,
        {"metrics": BodyKind(lambda _: f"count of round {stepped[-1]}".encode(), 60.0)},
        on_round=lambda: stepped.append(exporter.rounds),
    )
    assert await cache.body("metrics", False) == b"count of round 0"
    await next_round(exporter)
    await next_round(exporter)  # two rounds on: the request waits for this round's render
    assert await cache.body("metrics", False) == b"count of round 2"
    await cache.body("metrics", True)
    assert stepped == [0, 2]  # once a round, and only rounds something was rendered for
