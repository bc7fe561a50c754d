"""A scripted fleet for the dashboard's tests: vLLM-format targets whose numbers the
test chooses, scraped by a real exporter (the embedded one) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web

from batchscope.dashboard.client import signals
from batchscope.dashboard.embedded import EmbeddedExporter
from batchscope.exporter.config.settings import Settings, Target
from tests.support.network import free_port, wait_until
from tests.support.vllm_payload import VllmState, render

# Each scrape of a target first applies its step (requests finishing, say).
Step = Callable[[VllmState], None]


class BackgroundServer:
    """An aiohttp application served from a thread on a free local port."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = free_port()
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        runner = web.AppRunner(self.app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._started.set()
        await self._stop.wait()
        await runner.cleanup()


class ScriptedTargets(BackgroundServer):
    """/NAME/metrics for each scripted state; every scrape first applies the state's step."""

    def __init__(self, scripts: dict[str, tuple[VllmState, Step]]) -> None:
        app = web.Application()
        for name, (state, step) in scripts.items():

            async def handler(_: web.Request, state=state, step=step) -> web.Response:
                step(state)
                return web.Response(text=render(state))

            app.router.add_get(f"/{name}/metrics", handler)
        super().__init__(app)

    def metrics_url(self, name: str) -> str:
        return f"{self.url}/{name}/metrics"


def fast_settings(targets: tuple[Target, ...]) -> Settings:
    """Scrapes every 0.25 s, a 5 s window, saturation held for 0.5 s: states show in ~2 s."""
    return Settings(
        targets=targets,
        interval_seconds=0.25,
        window_seconds=5.0,
        hold_seconds=0.5,
        timeout_seconds=0.5,
    )


def wait_for_states(exporter_url: str, wanted: dict[str, str], seconds: float = 20.0) -> dict:
    """The exporter's signals once every named target shows its wanted diagnosis state."""
    states: dict[str, str] = {}

    def check() -> dict | None:
        doc = signals(exporter_url)
        states.clear()
        states.update({t["target"]: t["total"]["diagnosis"]["state"] for t in doc["targets"]})
        return doc if all(states.get(name) == state for name, state in wanted.items()) else None

    return wait_until(check, seconds, f"the states {wanted}", seen=states, interval=0.2)


def start_exporter(settings: Settings) -> EmbeddedExporter:
    exporter = EmbeddedExporter(settings)
    exporter.start()
    return exporter
