"""HTTP edge of the exporter: /metrics for Prometheus and a JSON API for the dashboard.

Targets come from configuration only: the API selects a configured target by name and
never fetches a URL it is given.
"""

from __future__ import annotations

import asyncio
import hmac
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


def cross_origin(request: web.Request) -> bool:
    """A browser request made by a page of another origin (a script reading the API)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return True
    return (
        request.headers.get("Sec-Fetch-Site") == "cross-site"
        and request.headers.get("Sec-Fetch-Mode") != "navigate"
    )


def guard(token: str | None) -> Callable:
    """Middleware: the bearer token on every path but /health when one is set, and no
    cross-origin browser request to the JSON API (another site's page must not read it)."""
    expected = f"Bearer {token}".encode() if token is not None else None

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
        if expected is not None and request.path != "/health":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _json(api.error_response("a bearer token is required"), status=401)
        if request.path.startswith("/api/") and cross_origin(request):
            return _json(api.error_response("cross-origin requests are refused"), status=403)
        return await handler(request)

    return check


def create_app(exporter: Exporter, token: str | None = None) -> web.Application:
    """The exporter's web application over a running Exporter; `token`, when given, is
    required as `Authorization: Bearer TOKEN` on every path but /health."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(exporter.current))
    metrics_body = _per_round(exporter, lambda: generate_latest(registry))
    signals_body = _per_round(
        exporter, lambda: api.encode(api.signals_response(exporter.clock(), exporter.current()))
    )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=await metrics_body(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def signals(_: web.Request) -> web.Response:
        return web.Response(body=await signals_body(), content_type="application/json")

    async def history(request: web.Request) -> web.Response:
        name = request.query.get("target")
        if name is None:
            try:
                page, points = api.history_page_request(
                    request.query, exporter.settings.history_points
                )
            except api.BadRequest as err:
                return _json(api.error_response(str(err)), status=400)
            page_count = api.pages(len(exporter.states))
            if page >= page_count:
                message = f"page must be below {page_count} (pages of this fleet)"
                return _json(api.error_response(message), status=400)
            histories = exporter.histories(page, api.HISTORY_PAGE_TARGETS, points)
            # Encoding is the cost: done off the event loop, scrapes go on meanwhile.
            body = await asyncio.to_thread(
                api.encode, api.all_histories_response(histories, page, page_count, points)
            )
            return web.Response(body=body, content_type="application/json")
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

    app = web.Application(middlewares=[guard(token)])
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/signals", signals)
    app.router.add_get("/api/v1/history", history)
    app.router.add_get("/api/v1/targets", targets)
    return app
