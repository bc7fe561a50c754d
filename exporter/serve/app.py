"""HTTP edge of the exporter: /metrics for Prometheus and a JSON API for the dashboard.

Targets come from configuration only: the API selects a configured target by name and
never fetches a URL it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from isal import igzip
from prometheus_client import CONTENT_TYPE_LATEST

from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.exposition import render_metrics, render_models
from batchscope.exporter.serve.history import Histories
from batchscope.exporter.serve.replica_plan import ReplicaPlanner

Render = Callable[[list[TargetSignals]], bytes]
# A JSON body of the targets' signals, rendered at a time.
JsonResponse = Callable[[float, list[TargetSignals]], dict[str, Any]]
# /api/v1/signals?view=...: the body each view reads from the round cache.
SIGNALS_VIEWS = {"full": "signals", "summary": "summary"}

log = logging.getLogger("batchscope.exporter")

INDEX = """<!doctype html><title>batchscope exporter</title>
<h1>batchscope exporter</h1>
<ul><li><a href="/metrics">/metrics</a> (Prometheus)</li>
<li><a href="/api/v1/signals">/api/v1/signals</a> (current signals, JSON; ?view=summary,
?target=NAME)</li>
<li><a href="/api/v1/history">/api/v1/history</a> (?target=NAME, bounded history, JSON)</li>
<li><a href="/api/v1/advice">/api/v1/advice</a> (what to change, with the numbers, JSON)</li>
<li><a href="/api/v1/replicas">/api/v1/replicas</a> (replicas each model needs, JSON)</li>
<li><a href="/api/v1/targets">/api/v1/targets</a> (configured targets)</li></ul>
"""


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=api.encode(body), status=status, content_type="application/json")


# ISA-L's gzip (`isal`) at level 1: a fleet's /metrics body is compressed once a round, on
# a fraction of the CPU of zlib's fastest level.
GZIP_LEVEL = 1


def gzip_body(plain: bytes) -> bytes:
    """A body as the exporter serves it to a client that accepts gzip."""
    return igzip.compress(plain, compresslevel=GZIP_LEVEL)


def plain_and_gzip(render: Render, targets: list[TargetSignals]) -> tuple[bytes, bytes]:
    """The body `render` makes of the targets, and its gzip."""
    plain = render(targets)
    return plain, gzip_body(plain)


# Not CPython's 5 ms: a /metrics request waits less for the GIL while bodies render (p99).
SWITCH_INTERVAL_SECONDS = 0.0005


def configure_switch_interval() -> float:
    """Set the process's GIL switch interval to SWITCH_INTERVAL_SECONDS, once, as the
    exporter starts; returns the one it replaced."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    return before


# How long after a request a body is still rendered after every round, so that a reader
# polling at most that often always finds it ready: Prometheus scrapes /metrics at its
# scrape_interval (1 m by default); the dashboard reads the JSON every 5 s, and a
# script that polled it once must not cost a render a round for long.
METRICS_KEPT_FRESH_SECONDS = 60.0
JSON_KEPT_FRESH_SECONDS = 15.0


@dataclass(frozen=True)
class BodyKind:
    """How to render one kind of body, and how long a request keeps it rendered."""

    render: Render
    kept_fresh_seconds: float


class RoundCache:
    """The bodies of each scrape round, each rendered at most once, off the event loop.

    At a round's first render the targets' signals are taken once; every body of that
    round (/metrics, /api/v1/signals, plain and gzip) is rendered from that same list, so
    they agree with each other. A request never waits for a render when a complete body
    of this round or the previous one exists: it gets the newest at once, at most one
    round old, and starts this round's render if none runs. It waits only when no body
    that recent exists (at start, or when nobody read it for a while). `keep_fresh`
    renders, after each round, each kind read in its last `kept_fresh_seconds` (the
    `expected` kinds count as read at start): no reader, no render.
    """

    def __init__(
        self,
        exporter: Exporter,
        kinds: dict[str, BodyKind],
        expected: tuple[str, ...] = (),
        on_round: Callable[[], object] | None = None,
    ) -> None:
        self.exporter = exporter
        self.kinds = kinds
        # Called once a round, before its renders (the replica count steps here).
        self.on_round = on_round
        self._stepped: int | None = None
        self._targets: tuple[int, list[TargetSignals]] | None = None
        # kind -> (round, (plain, gzip)) of its newest complete body
        self._bodies: dict[str, tuple[int, tuple[bytes, bytes]]] = {}
        # kind -> (round, the render of that round's body)
        self._renders: dict[str, tuple[int, asyncio.Task[tuple[bytes, bytes]]]] = {}
        # kind -> the round in which it was last requested
        self._read: dict[str, int] = dict.fromkeys(expected, exporter.rounds)

    def _render_of(self, kind: str) -> asyncio.Task[tuple[bytes, bytes]]:
        """This round's render of `kind`: the one started, or a new one."""
        rounds = self.exporter.rounds
        started = self._renders.get(kind)
        if started is not None and started[0] == rounds:
            return started[1]
        if self._targets is None or self._targets[0] != rounds:
            self._targets = (rounds, self.exporter.current())
        self.step_round()
        task = asyncio.create_task(self._render(kind, rounds, self._targets[1]))
        self._renders[kind] = (rounds, task)
        return task

    async def _render(
        self, kind: str, rounds: int, targets: list[TargetSignals]
    ) -> tuple[bytes, bytes]:
        bodies = await asyncio.to_thread(plain_and_gzip, self.kinds[kind].render, targets)
        newest = self._bodies.get(kind)
        if newest is None or newest[0] < rounds:
            self._bodies[kind] = (rounds, bodies)
        return bodies

    async def body(self, kind: str, compressed: bool) -> bytes:
        """The `kind` body, gzip-compressed when asked: the newest complete one when it is
        of this round or the previous one, otherwise this round's once rendered."""
        rounds = self.exporter.rounds
        self._read[kind] = rounds
        newest = self._bodies.get(kind)
        if newest is not None and newest[0] == rounds:
            return newest[1][compressed]
        task = self._render_of(kind)
        if newest is not None and newest[0] >= rounds - 1:
            return newest[1][compressed]
        # Shielded: a client that goes away must not cancel the render others wait for.
        return (await asyncio.shield(task))[compressed]

    def step_round(self) -> None:
        """`on_round`, once a round, before any of that round's renders (whether a
        request or `keep_fresh` starts the first)."""
        rounds = self.exporter.rounds
        if self.on_round is None or self._stepped == rounds:
            return
        self._stepped = rounds
        try:
            self.on_round()
        except Exception:  # a failed step must not end the rounds' renders
            log.exception("stepping the replica count failed")

    def read_recently(self, kind: str) -> bool:
        """Whether `kind` was requested (or expected) in its last `kept_fresh_seconds`."""
        read = self._read.get(kind)
        seconds = self.kinds[kind].kept_fresh_seconds
        window = math.ceil(seconds / self.exporter.settings.interval_seconds)
        return read is not None and self.exporter.rounds - read <= window

    async def keep_fresh(self) -> None:
        """After every round, render each kind read recently, so that requests find it
        ready."""
        seen = self.exporter.rounds
        while True:
            seen = await self.exporter.round_after(seen)
            self.step_round()
            for kind in self.kinds:
                if self.read_recently(kind):
                    try:
                        await self._render_of(kind)
                    except Exception:  # a failed render must not end the next rounds' renders
                        log.exception("rendering %s failed", kind)


def _accepts_gzip(request: web.Request) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "")


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


class _Handlers:
    """The exporter's endpoints over one running Exporter and its round cache of bodies."""

    def __init__(self, exporter: Exporter, histories: Histories) -> None:
        self.exporter = exporter
        self.histories = histories
        self.evaluation = api.evaluation_json(exporter.settings)
        self.replicas = ReplicaPlanner(exporter.settings)
        # Off, as a sidecar or a shard: no count, so N exporters never publish N.
        self.counting = exporter.settings.counts_replicas
        self.bodies = RoundCache(
            exporter,
            {
                "metrics": BodyKind(self._metrics_body, METRICS_KEPT_FRESH_SECONDS),
                "signals": self._json_body(self._with_evaluation(api.signals_response)),
                "summary": self._json_body(self._with_evaluation(api.summary_response)),
                "advice": self._json_body(api.advice_response),
                "replicas": self._json_body(self._replicas_body),
            },
            expected=("metrics",),
            on_round=self.step_replicas if self.counting else None,
        )
        # An exporter that evaluated before its app was made has counts to show at once.
        self.bodies.step_round()

    def step_replicas(self) -> None:
        """The models' replica counts after the round just ended."""
        exporter = self.exporter
        self.replicas.step(exporter.current(), exporter.targets(), exporter.clock())

    def _metrics_body(self, targets: list[TargetSignals]) -> bytes:
        models = render_models(self.replicas.latest) if self.counting else b""
        return render_metrics(targets) + models

    def _replicas_body(self, generated_at: float, _: list[TargetSignals]) -> dict[str, Any]:
        return api.replicas_response(
            generated_at, self.replicas.latest, self.replicas.settings, self.counting
        )

    def _with_evaluation(self, response: Callable[..., dict[str, Any]]) -> JsonResponse:
        return lambda generated_at, targets: response(generated_at, targets, self.evaluation)

    def _json_body(self, response: JsonResponse) -> BodyKind:
        return BodyKind(
            lambda targets: api.encode(response(self.exporter.clock(), targets)),
            JSON_KEPT_FRESH_SECONDS,
        )

    async def _cached(self, request: web.Request, kind: str, content_type: str) -> web.Response:
        compressed = _accepts_gzip(request)
        headers = {"Content-Type": content_type}
        if compressed:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=await self.bodies.body(kind, compressed), headers=headers)

    async def metrics(self, request: web.Request) -> web.Response:
        return await self._cached(request, "metrics", CONTENT_TYPE_LATEST)

    async def signals(self, request: web.Request) -> web.Response:
        """Every target's signals; `?view=summary`: each target's row of a fleet overview;
        `?target=NAME`: that configured target's signals alone."""
        name = request.query.get("target")
        if name is not None:
            return self._one_target(name)
        view = request.query.get("view", "full")
        if view not in SIGNALS_VIEWS:
            message = f"view must be one of {', '.join(SIGNALS_VIEWS)} (got {view!r})"
            return _json(api.error_response(message), status=400)
        return await self._cached(request, SIGNALS_VIEWS[view], "application/json")

    def _one_target(self, name: str) -> web.Response:
        """One target's latest signals, rendered now: a few kilobytes whatever the fleet."""
        latest = self.exporter.latest(name)
        if latest is None:
            return _json(api.error_response(f"no configured target named {name!r}"), status=404)
        return _json(api.signals_response(self.exporter.clock(), latest, self.evaluation))

    async def advice(self, request: web.Request) -> web.Response:
        return await self._cached(request, "advice", "application/json")

    async def replica_counts(self, request: web.Request) -> web.Response:
        return await self._cached(request, "replicas", "application/json")

    async def history(self, request: web.Request) -> web.Response:
        name = request.query.get("target")
        if name is None:
            return await self._fleet_history(request)
        rows = self.histories.rows(name)
        if rows is None:
            return _json(api.error_response(f"no configured target named {name!r}"), status=404)
        body = await asyncio.to_thread(lambda: api.encode(api.history_response(name, rows)))
        return web.Response(body=body, content_type="application/json")

    async def _fleet_history(self, request: web.Request) -> web.Response:
        """One page of every target's history (`?page=K&points=N`)."""
        try:
            page, points = api.history_page_request(
                request.query, self.exporter.settings.history_points
            )
        except api.BadRequest as err:
            return _json(api.error_response(str(err)), status=400)
        page_count = api.pages(len(self.exporter.states))
        if page >= page_count:
            message = f"page must be below {page_count} (pages of this fleet)"
            return _json(api.error_response(message), status=400)
        histories = self.histories.page(page, api.HISTORY_PAGE_TARGETS, points)
        # Turning rows into points and encoding them is the cost: done off the event
        # loop (the rows are copied on it, and never change), scrapes go on meanwhile.
        body = await asyncio.to_thread(
            lambda: api.encode(api.all_histories_response(histories, page, page_count, points))
        )
        return web.Response(body=body, content_type="application/json")

    async def targets(self, _: web.Request) -> web.Response:
        settings = self.exporter.settings
        return _json(
            api.targets_response(
                self.exporter.targets(), settings.interval_seconds, settings.window_seconds
            )
        )

    async def index(self, _: web.Request) -> web.Response:
        return web.Response(text=INDEX, content_type="text/html")

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def render_every_round(self, _: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self.bodies.keep_fresh())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/", self.index),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.get("/api/v1/signals", self.signals),
            web.get("/api/v1/advice", self.advice),
            web.get("/api/v1/replicas", self.replica_counts),
            web.get("/api/v1/history", self.history),
            web.get("/api/v1/targets", self.targets),
        ]


def create_app(
    exporter: Exporter, token: str | None = None, histories: Histories | None = None
) -> web.Application:
    """The exporter's web application over a running Exporter; `token`, when given, is
    required as `Authorization: Bearer TOKEN` on every path but /health. `histories`:
    what /api/v1/history reads (default: every target's, kept from now on)."""
    if histories is None:
        histories = Histories(exporter)
    handlers = _Handlers(exporter, histories)
    app = web.Application(middlewares=[guard(token)])
    app.cleanup_ctx.append(handlers.render_every_round)
    app.add_routes(handlers.routes())
    return app
