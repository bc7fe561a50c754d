"""The exporter's own scrape loop and JSON API, run in a background thread of this process.

`batchscope-dashboard --target URL` uses it so a user with nothing but a vLLM server
needs one command: the same Exporter and create_app as `batchscope-exporter`.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from batchscope.exporter.config.settings import Settings
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.app import create_app

START_TIMEOUT_SECONDS = 30.0


class EmbeddedExporter:
    """An Exporter plus its HTTP server on `host:port` (port 0: any free port)."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 0) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="batchscope-exporter", daemon=True)

    def start(self) -> str:
        """Start scraping and serving; returns the API's base URL once it listens."""
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_SECONDS):
            raise RuntimeError("the embedded exporter did not start")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported to start()'s caller, not lost in a thread
            self._error = err
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        exporter = Exporter(self.settings)
        runner = web.AppRunner(create_app(exporter), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._ready.set()
            await exporter.run_forever(self._stop)
        finally:
            await runner.cleanup()
