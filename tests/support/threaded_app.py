"""An aiohttp application served on 127.0.0.1 from a background thread, for tests that
drive it with blocking clients (the load generator's own loop, urllib)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web


@contextlib.contextmanager
def serve_in_thread(app: web.Application, **runner_options: object) -> Iterator[str]:
    """Serve `app` on a free 127.0.0.1 port until the block ends; yields its base URL."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, **runner_options)
    address: list[str] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        host, port = runner.addresses[0][:2]
        address.append(f"http://{host}:{port}")
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield address[0]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
