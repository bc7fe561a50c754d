"""HTTP edge of the exporter: /metrics for Prometheus and a JSON API for the dashboard.

Targets come from configuration only: the API selects a configured target by name and
never fetches a URL it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporter import api
from exporter.collector import SignalsCollector
from exporter.runtime import Exporter

INDEX = """<!doctype html><title>batchscope exporter</title>
<h1>batchscope exporter</h1>
<ul><li><a href="/metrics">/metrics</a> (Prometheus)</li>
<li><a href="/api/v1/signals">/api/v1/signals</a> (current signals, JSON)</li>
<li><a href="/api/v1/history">/api/v1/history</a> (?target=NAME, bounded history, JSON)</li>
<li><a href="/api/v1/advice">/api/v1/advice</a> (what to change, with the numbers, JSON)</li>
<li><a href="/api/v1/targets">/api/v1/targets</a> (configured targets)</li></ul>
"""


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=api.encode(body), status=status, content_type="application/json")


def _per_round(exporter: Exporter, render: Callable[[], bytes]) -> Callable[[], Awaitable[bytes]]:
    """`render` run at most once per scrape round, off the event loop.

    Rendering 1000 targets takes a few hundred ms of CPU: done in a thread, scrapes
    keep going meanwhile, and every request of the same round gets the same bytes.
    """
    lock = asyncio.Lock()
    cache: dict[str, Any] = {"round": None, "body": b""}

    async def get() -> bytes:
        async with lock:
            rounds = exporter.rounds
            if cache["round"] != rounds:
                cache["body"] = await asyncio.to_thread(render)
                cache["round"] = rounds
            return cache["body"]

    return get


def create_app(exporter: Exporter) -> web.Application:
    """The exporter's web application over a running Exporter."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(exporter.current))
    metrics_body = _per_round(exporter, lambda: generate_latest(registry))
    signals_body = _per_round(
        exporter, lambda: api.encode(api.signals_response(exporter.clock(), exporter.current()))
    )

    advice_body = _per_round(
        exporter, lambda: api.encode(api.advice_response(exporter.clock(), exporter.current()))
    )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=await metrics_body(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def signals(_: web.Request) -> web.Response:
        return web.Response(body=await signals_body(), content_type="application/json")

    async def advice(_: web.Request) -> web.Response:
        return web.Response(body=await advice_body(), content_type="application/json")

    async def history(request: web.Request) -> web.Response:
        name = request.query.get("target")
        if name is None:
            return _json(api.all_histories_response(exporter.histories()))
        points = exporter.history(name)
        if points is None:
            return _json(api.error_response(f"no configured target named {name!r}"), status=404)
        return _json(api.history_response(name, points))

    async def targets(_: web.Request) -> web.Response:
        return _json(
            api.targets_response(
                exporter.targets(),
                exporter.settings.interval_seconds,
                exporter.settings.window_seconds,
            )
        )

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=INDEX, content_type="text/html")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/signals", signals)
    app.router.add_get("/api/v1/advice", advice)
    app.router.add_get("/api/v1/history", history)
    app.router.add_get("/api/v1/targets", targets)
    return app
