"""Scrapes start on a tick grid and the scrapes of a tick are evaluated together at its
end (exporter/scrape/loop.py, TICK_SECONDS): each still at the time it ended, as its
plain twin (each scrape evaluated as it ends) evaluates it, and one target's failure or
removal never costs the others their evaluation."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape import loop as runtime
from batchscope.exporter.scrape.fetch import ScrapeResult, client_session
from batchscope.exporter.scrape.loop import MIN_TICKS, TICK_SECONDS, Exporter, ScrapeSlots, phase
from tests.support.live import Targets, vllm_payload
from tests.support.virtual_time import loop_clock, run_virtual


def test_phases_sit_on_the_tick_grid_and_spread_over_the_interval() -> None:
    interval = 5.0
    offsets = [phase(f"t{i}", interval) * interval for i in range(1000)]
    assert all(0.0 <= offset < interval for offset in offsets)
    ticks = [offset / TICK_SECONDS for offset in offsets]
    assert max(abs(t - round(t)) for t in ticks) < 1e-9
    per_tick = Counter(round(t) for t in ticks)
    # 50 ticks in 5 s, 20 targets each on average: every tick used, none crowded
    assert len(per_tick) == 50 and max(per_tick.values()) <= 40
    assert phase("t1", interval) == phase("t1", interval)  # a target keeps its rhythm
    # an interval of few ticks is not rounded to them: 1,000 targets, 1,000 instants
    short = {phase(f"t{i}", (MIN_TICKS - 1) * TICK_SECONDS) for i in range(1000)}
    assert len(short) == 1000 and all(0.0 <= p < 1.0 for p in short)


@pytest.mark.integration
async def test_a_ticks_scrapes_are_evaluated_together_each_at_the_time_it_ended(
    caplog, monkeypatch
) -> None:
    # A long tick: on a loaded machine the four scrapes still end within it.
    monkeypatch.setattr(runtime, "TICK_SECONDS", 1.0)
    ended: list[float] = []

    def clock() -> float:
        ended.append(1000.0 + len(ended))
        return ended[-1]

    async with Targets() as targets:
        names = ["a", "b", "c", "gone"]
        targets.payloads = {name: vllm_payload(running=3) for name in names}
        exporter = Exporter(
            Settings(targets=tuple(Target(n, targets.url(n), engine="vllm", cap=8) for n in names)),
            clock=clock,
        )
        real_evaluate = exporter.evaluate

        def evaluate(state, result, now):
            if state.target.name == "b":
                raise RuntimeError("a bug in b's evaluation")
            return real_evaluate(state, result, now)

        exporter.evaluate = evaluate
        slots = ScrapeSlots()
        async with client_session() as session:
            await asyncio.gather(
                *(
                    exporter._scrape_one(session, slots, exporter.states[n], batched=True)
                    for n in names
                )
            )
            # every scrape has ended; none is evaluated before the tick's end
            assert len(ended) == 4
            assert all(exporter.states[n].signals is None for n in names)
            ended_at = {state.target.name: t for state, _, t in exporter._pending}
            gone = exporter.states.pop("gone")
            with caplog.at_level(logging.ERROR, logger="batchscope.exporter"):
                await asyncio.sleep(2 * runtime.TICK_SECONDS)

    assert sorted(ended_at.values()) == ended  # each scrape read the clock as it ended
    for name in ("a", "c"):  # each evaluated at the time its own scrape ended
        signals = exporter.states[name].signals
        assert signals is not None and signals.up and signals.total.running == 3.0
        assert signals.t == ended_at[name]
    assert len(ended) == 4  # the batch read no clock of its own
    assert exporter.states["b"].signals is None and gone.signals is None
    assert "target b: evaluation failed" in caplog.text


@pytest.mark.integration
async def test_scrapes_ended_before_a_stop_are_evaluated_not_dropped(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "TICK_SECONDS", 60.0)  # no batch would come due by itself
    async with Targets() as targets:
        targets.payloads = {"a": vllm_payload(running=5)}
        exporter = Exporter(
            Settings(
                targets=(Target("a", targets.url("a"), engine="vllm", cap=8),),
                interval_seconds=1.0,
                timeout_seconds=0.5,
            )
        )
        stop = asyncio.Event()
        task = asyncio.create_task(exporter.run_forever(stop))
        for _ in range(200):
            if exporter._pending:
                break
            await asyncio.sleep(0.01)
        assert exporter._pending and exporter.states["a"].signals is None
        stop.set()
        await task
    assert exporter._pending == []
    assert exporter.states["a"].signals.total.running == 5.0


# Per target, its scrapes: (virtual seconds the scrape takes, running, finished requests).
fleet_scrapes = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.03, 0.07, 0.1, 0.25]), st.integers(0, 9), st.integers(0, 50)
        ),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(fleet_scrapes)
def test_batched_evaluation_is_each_scrape_evaluated_as_it_ended(scrapes) -> None:
    # Tick batching moves when an evaluation runs, never what it computes: the plain twin
    # (each scrape evaluated as it ends) gives every target the same signals.
    names = [f"t{i}" for i in range(len(scrapes))]

    def signals_of(batched: bool) -> list[str]:
        async def main() -> list[str]:
            taken = {name: iter(s) for name, s in zip(names, scrapes, strict=True)}

            async def scrape_target(session, target, timeout, max_bytes) -> ScrapeResult:
                seconds, running, finished = next(taken[target.name])
                await asyncio.sleep(seconds)
                return ScrapeResult(vllm_payload(running, 1, finished), None, seconds)

            targets = tuple(
                Target(n, f"http://127.0.0.1:9/{n}", engine="vllm", cap=8) for n in names
            )
            exporter = Exporter(
                Settings(targets=targets), clock=loop_clock(), scrape_target=scrape_target
            )
            slots = ScrapeSlots()
            for round_scrapes in itertools.zip_longest(*scrapes):
                await asyncio.gather(
                    *(
                        exporter._scrape_one(None, slots, exporter.states[n], batched=batched)
                        for n, scrape in zip(names, round_scrapes, strict=True)
                        if scrape is not None
                    )
                )
                await asyncio.sleep(1.0)  # past the tick: every batch evaluated
            return [repr(exporter.states[n].signals) for n in names]

        return run_virtual(main())

    assert signals_of(batched=True) == signals_of(batched=False)
