"""A scripted scenario through the real exporter loop and HTTP scrapes, on a fake clock.

A local HTTP server plays a vLLM server through idle, load, memory pressure,
90 s of latency-budget saturation, recovery and a restart that resets its counters.
Every 5 s of fake time the exporter scrapes it for real and the test checks the signals.
"""

from __future__ import annotations

import pytest
from aiohttp import web

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.api_json import history_point, series_json
from batchscope.exporter.serve.history import Histories
from tests.support.vllm_payload import VllmState, render

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


INTERVAL = 5.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def server():
    state = {"vllm": VllmState()}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(state["vllm"]))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield state, f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


async def test_scripted_scenario_every_signal_and_saturation_times(server) -> None:
    state, url = server
    clock = Clock()
    settings = Settings(
        targets=(Target(name="llm", url=url, engine="vllm", cap=8, budget_seconds=1.0),),
        interval_seconds=INTERVAL,
        window_seconds=30.0,
        hold_seconds=60.0,
        saturation_threshold=0.95,
    )
    exporter = Exporter(settings, clock=clock)
    timeline: list[tuple[float, dict]] = []

    async with client_session() as session:

        async def step(seconds: float, change) -> None:
            """Advance fake time one interval at a time, changing the server each step."""
            for _ in range(int(seconds / INTERVAL)):
                clock.t += INTERVAL
                change(state["vllm"])
                await exporter.run_round(session)
                [signals] = exporter.current()
                timeline.append((clock.t - 1000.0, series_json(signals.total)))

        def idle(s: VllmState) -> None:
            s.running, s.waiting, s.kv_usage = 0, 0, 0.0

        def load(s: VllmState) -> None:  # 10 requests of 200 tokens finish every 5 s in 0.4 s
            s.running, s.waiting, s.kv_usage = 8, 4, 0.4
            s.finish(10, 0.4, 200)

        def memory(s: VllmState) -> None:
            s.running, s.waiting, s.kv_usage = 3, 20, 1.0
            s.preemptions += 5
            s.finish(2, 0.45, 200)

        def saturated(s: VllmState) -> None:  # latency 1.2 s against a 1.0 s budget
            s.running, s.waiting, s.kv_usage = 8, 30, 0.5
            s.finish(10, 1.2, 200)

        await step(20, idle)  # t = 5..20
        at = dict(timeline)
        assert at[20]["diagnosis"]["state"] == "idle"
        assert at[20]["running_vs_cap"] == 0.0 and at[20]["latency_seconds"] is None
        assert at[20]["requests_per_second"] == 0.0

        await step(30, load)  # t = 25..50
        at = dict(timeline)
        assert at[50]["running"] == 8 and at[50]["waiting"] == 4
        assert at[50]["running_vs_cap"] == 1.0
        assert at[50]["requests_per_second"] == pytest.approx(2.0)  # 10 per 5 s
        # all latencies in (0.3, 0.5]: p99 = 0.3 + 0.2 * 0.99 = 0.498
        assert at[50]["latency_seconds"] == pytest.approx(0.498)
        assert at[50]["budget_utilization"] == pytest.approx(0.498)
        assert at[50]["diagnosis"]["state"] == "healthy"
        # 200-token outputs all in (100, 200]: a static batch of them wastes little
        assert (
            0.5 <= at[50]["static_utilization"]["lower"] <= at[50]["static_utilization"]["estimate"]
        )
        assert at[50]["preemptions_per_second"] == 0.0

        await step(30, memory)  # t = 55..80
        at = dict(timeline)
        assert at[80]["running_vs_cap"] == 0.375
        assert at[80]["kv_cache_usage"] == 1.0
        assert at[80]["preemptions_per_second"] == pytest.approx(1.0)  # 5 per 5 s
        assert at[80]["diagnosis"]["state"] == "memory_bound"

        await step(90, saturated)  # t = 85..170: 90 s of saturation
        await step(40, load)  # t = 175..210: recovery
        at = dict(timeline)
        above = [
            t for t, s in timeline if s["budget_utilization"] and s["budget_utilization"] >= 0.95
        ]
        assert above[0] == 85  # first slow requests finish in the 80..85 interval
        flagged = [t for t, s in timeline if s["budget_saturated"]]
        # onset: 60 s (the hold) after utilisation first reached the threshold
        assert flagged[0] == 85 + 60
        assert at[145]["diagnosis"]["state"] == "budget_saturated"
        assert at[140]["budget_saturated_seconds"] == 55.0 and not at[140]["budget_saturated"]
        # release: once the 30 s window holds no slow request (the last finished by t=170)
        assert flagged[-1] == 195
        assert flagged == list(range(145, 200, 5))
        assert at[200]["diagnosis"]["state"] == "healthy"
        assert at[200]["budget_saturated_seconds"] == 0.0

        # restart: counters start again from zero
        def restart(s: VllmState) -> None:
            fresh = VllmState(running=8, waiting=2, kv_usage=0.3, preemptions=1)
            fresh.finish(3, 0.4, 200)
            state["vllm"] = fresh

        await step(5, restart)  # t = 215
        await step(10, load)  # t = 220..225
        at = dict(timeline)
        assert at[215]["preemptions_per_second"] >= 0.0
        assert at[215]["requests_per_second"] >= 0.0
        # window 195..225 (7 scrapes, the first is the baseline): 3 load steps before the
        # restart (30 requests), the restarted server's 3, then 2 load steps (20): 53 in 30 s
        assert at[225]["requests_per_second"] == pytest.approx(53 / 30)
        assert at[225]["preemptions_per_second"] == pytest.approx(1 / 30)
        assert at[225]["diagnosis"]["state"] == "preempting"


async def test_exporter_serves_history_bounded_per_target(server) -> None:
    state, url = server
    clock = Clock()
    settings = Settings(
        targets=(Target(name="llm", url=url, engine="vllm", cap=8),), history_points=5
    )
    exporter = Exporter(settings, clock=clock)
    histories = Histories(exporter)
    async with client_session() as session:
        for _ in range(8):
            clock.t += INTERVAL
            await exporter.run_round(session)
    points = [history_point(row) for row in histories.rows("llm")]
    assert len(points) == 5
    assert [p["t"] for p in points] == [1000.0 + 5 * i for i in range(4, 9)]
    assert histories.rows("nope") is None
