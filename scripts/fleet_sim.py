"""A fleet of simulated vLLM 0.32 servers on one port, for the exporter's fleet benchmark.

Serves `/t/{i}/metrics` for targets 0..N-1 with the real 53 KB vLLM 0.32 load payload
(`tests/fixtures/vllm-0.32.0-cpu-load.txt`), varied per target and per request: each
target serves its own model name, its counters and histograms grow by a per-target
step on every request, and its scheduler gauges (running, waiting, KV usage) move.
Like vLLM (prometheus_client's ASGI app), it gzips the body when the client accepts it.

Each body is rendered when asked for (about 0.4 ms with its gzip), so counters keep
growing for as long as a run lasts, an hour's soak included: 1,000 targets every 5 s
cost the simulator about a tenth of a core, the same whoever scrapes them.

Prints `listening on HOST:PORT` on stdout once it serves; stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import signal
import sys
from pathlib import Path

from aiohttp import web

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-0.32.0-cpu-load.txt"
FIXTURE_MODEL = 'model_name="/tmp/tinyllama"'
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Sample suffixes of values that only grow: counters and histogram parts.
GROWING_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
# Gauges that move between requests: a real server's batch fills and drains.
MOVING_GAUGES = {
    "vllm:num_requests_running": lambda rng: float(rng.randint(0, 256)),
    "vllm:num_requests_waiting": lambda rng: float(rng.randint(0, 64)),
    "vllm:kv_cache_usage_perc": lambda rng: rng.uniform(0.05, 0.99),
}


class Template:
    """The fixture split into text pieces and the sample values that change."""

    def __init__(self, text: str) -> None:
        self.pieces: list[str] = []  # pieces[k] precedes the k-th changing value
        self.kinds: list[str] = []  # "grow" or a MOVING_GAUGES name
        self.bases: list[float] = []
        static: list[str] = []
        for line in text.splitlines(keepends=True):
            kind = _kind(line)
            if kind is None:
                static.append(line)
                continue
            head, _, value = line.rstrip("\n").rpartition(" ")
            static.append(head + " ")
            self.pieces.append("".join(static))
            self.kinds.append(kind)
            self.bases.append(float(value))
            static = ["\n"]
        self.tail = "".join(static)

    def render(self, target: int, request: int, rng: random.Random) -> str:
        """The payload of `target`'s `request`-th scrape (0-based)."""
        # Integer steps keep histogram buckets whole numbers and cumulative.
        growth = (1 + target % 7) * (request + 1)
        parts: list[str] = []
        for piece, kind, base in zip(self.pieces, self.kinds, self.bases, strict=True):
            value = base * growth if kind == "grow" else MOVING_GAUGES[kind](rng)
            parts.append(piece)
            parts.append(repr(value))
        parts.append(self.tail)
        return "".join(parts).replace(FIXTURE_MODEL, f'model_name="fleet/model-{target}"')


def _kind(line: str) -> str | None:
    """How a sample line's value changes between requests; None when it does not."""
    if not line.startswith("vllm:"):
        return None
    name = line[: line.find("{")] if "{" in line else line.split(" ", 1)[0]
    if name in MOVING_GAUGES:
        return name
    return "grow" if name.endswith(GROWING_SUFFIXES) else None


# gzip level of the bodies: vLLM's prometheus_client compresses at 6; 1 keeps the
# simulator's share of the cores small, and the exporter inflates either the same way.
GZIP_LEVEL = 1


def create_app(template: Template, targets: int, seed: int = 0) -> web.Application:
    """The fleet's web application: `/t/{i}/metrics` serves target i's next scrape."""
    served = [0] * targets
    rng = random.Random(seed)

    async def metrics(request: web.Request) -> web.Response:
        try:
            target = int(request.match_info["target"])
        except ValueError:
            raise web.HTTPNotFound() from None
        if not 0 <= target < targets:
            raise web.HTTPNotFound()
        body = template.render(target, served[target], rng).encode()
        served[target] += 1
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(
                body=gzip.compress(body, GZIP_LEVEL),
                headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"},
            )
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/t/{target}/metrics", metrics)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, announcing the bound address on stdout."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024).start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"listening on {bound_host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=1000, help="simulated servers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--fixture", type=Path, default=FIXTURE, help="payload to vary")
    args = parser.parse_args(argv)
    template = Template(args.fixture.read_text(encoding="utf-8"))
    asyncio.run(serve(create_app(template, args.targets), args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
