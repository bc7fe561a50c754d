"""Dashboard benchmark: server-side time to build the Live page, and what a refresh sends.

Two fleets, each served by a real exporter app (batchscope.exporter.serve.app.create_app) in its own
process, built by the exporter's own ingest from real vLLM 0.32 payloads; Streamlit's
AppTest runs the Live page against it, with the fetch cache cleared before each run so
each run pays for its fetches (the first run, imports, is not counted):

- 10 targets with one hour of history each (720 points at a 5 s interval): the page's
  fleet table and the selected target's panel with every chart;
- 1,000 targets of mixed caps, budgets and loads: the shown target with an
  hour of history, the others with a few points (the page never reads their history).
  Per refresh: the server's time, and the bytes sent to the browser (every message the
  run sends, serialized as Streamlit sends it over its websocket), against < 1 s and
  < 2 MB; and the JSON the page read from the exporter.

Gates: the 10 targets' page in under 300 ms; at 1,000 targets, a refresh in under 1 s
and under 2 MB to the browser (medians).

    .venv/bin/python scripts/bench_dashboard.py [--quick] [--output FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import benchmark
import streamlit as st
import streamlit.testing.v1.local_script_runner as script_runner
from aiohttp import web
from streamlit.runtime.forward_msg_queue import ForwardMsgQueue
from streamlit.testing.v1 import AppTest

from batchscope.dashboard.client import api_url
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import NotReady, free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/vllm-0.32.0-cpu-load.txt"
# A target's scrapes in turn: an idle server, under load, after the load.
MIXED_FIXTURES = tuple(
    ROOT / f"tests/fixtures/vllm-0.32.0-cpu-{name}.txt" for name in ("idle", "load", "after")
)
LIVE_PAGE = ROOT / "dashboard/views/live.py"
TARGETS = 10
POINTS = 720
INTERVAL_SECONDS = 5.0
RUNS = 9
QUICK_RUNS = 2
TARGET_MS = 300.0
FLEET_TARGETS = 1000
QUICK_FLEET_TARGETS = 100
# The other targets' history: a few evaluations (the page reads only the shown one's).
SHORT_POINTS = 3
FLEET_TARGET_MS = 1000.0
FLEET_TARGET_BYTES = 2_000_000
SHOWN = "server-0000"


@dataclass(frozen=True)
class DashboardResult:
    targets: int
    points: int
    seconds: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1e3

    @property
    def meets_target(self) -> bool:
        return self.median_ms < TARGET_MS


def fleet_with_history(targets: int, points: int) -> Exporter:
    """An exporter whose targets each hold `points` evaluations, the last one now."""
    series = read_series(FIXTURE.read_text(), "vllm")
    settings = Settings(
        targets=tuple(
            Target(
                f"server-{i:02d}",
                f"http://127.0.0.1:9/{i}/metrics",
                engine="vllm",
                cap=256,
                budget_seconds=2.0,
            )
            for i in range(targets)
        ),
        interval_seconds=INTERVAL_SECONDS,
        history_points=points,
    )
    exporter = Exporter(settings)
    start = time.time() - points * INTERVAL_SECONDS
    for state in exporter.states.values():
        for k in range(points):
            t = start + k * INTERVAL_SECONDS
            exporter.ingest(state, Snapshot(state.target.name, t, True, series), t)
    exporter.rounds += 1  # a finished round: the app renders the signals anew
    return exporter


def mixed_fleet(targets: int, points: int) -> Exporter:
    """`targets` targets of mixed caps (8, 64, 256) and budgets (0.2, 2, 10 s), each read
    over the real idle, load and after payloads in turn; SHOWN holds `points` evaluations,
    the others SHORT_POINTS; the last one of each now."""
    payloads = [read_series(path.read_text(), "vllm") for path in MIXED_FIXTURES]
    settings = Settings(
        targets=tuple(
            Target(
                f"server-{i:04d}",
                f"http://127.0.0.1:9/{i}/metrics",
                engine="vllm",
                cap=(8, 64, 256)[i % 3],
                budget_seconds=(0.2, 2.0, 10.0)[i // 3 % 3],
            )
            for i in range(targets)
        ),
        interval_seconds=INTERVAL_SECONDS,
        history_points=points,
    )
    exporter = Exporter(settings)
    now = time.time()
    for i, state in enumerate(exporter.states.values()):
        kept = points if state.target.name == SHOWN else SHORT_POINTS
        for k in range(kept):
            t = now - (kept - 1 - k) * INTERVAL_SECONDS
            series = payloads[(i + k) % len(payloads)]
            exporter.ingest(state, Snapshot(state.target.name, t, True, series), t)
    exporter.rounds += 1
    return exporter


# How each benchmark's fleet is built, by name (the child process builds it).
FLEETS = {"history": fleet_with_history, "mixed": mixed_fleet}


def _serve_fleet(kind: str, targets: int, points: int, port: int) -> None:
    """Build the fleet and serve its exporter app on `port` until killed (a child process)."""
    exporter = FLEETS[kind](targets, points)

    async def serve() -> None:
        runner = web.AppRunner(create_app(exporter), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def serve_fleet(
    targets: int, points: int, kind: str = "history"
) -> tuple[str, multiprocessing.Process]:
    """The fleet's exporter in its own process, as in a deployment; its URL once it answers."""
    # By its module's name: Streamlit's AppTest replaces __main__ while a page runs.
    import bench_dashboard

    port = free_port()
    child = multiprocessing.get_context("spawn").Process(
        target=bench_dashboard._serve_fleet, args=(kind, targets, points, port), daemon=True
    )
    child.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 120, processes=[child])
    except NotReady:
        child.kill()
        raise
    return url, child


@dataclass(frozen=True)
class FleetResult:
    """The Live page at a fleet's size: per refresh, the server's seconds and the bytes
    sent to the browser; and the bytes of JSON it read from the exporter."""

    targets: int
    points: int
    seconds: list[float]
    browser_bytes: list[int]
    exporter_bytes: dict[str, int]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1e3

    @property
    def median_bytes(self) -> float:
        return statistics.median(self.browser_bytes)


class CountingQueue(ForwardMsgQueue):
    """Streamlit's queue of messages to the browser, adding up their serialized size."""

    sent = 0

    def enqueue(self, msg) -> None:
        CountingQueue.sent += msg.ByteSize()
        super().enqueue(msg)


@dataclass(frozen=True)
class DashboardRun:
    """Both benchmarks: the 10 targets with an hour of history, and the fleet."""

    history: DashboardResult
    fleet: FleetResult


def measure(quick: bool = False) -> DashboardRun:
    runs = QUICK_RUNS if quick else RUNS
    print(f"dashboard: building {TARGETS} targets x {POINTS} points", file=sys.stderr, flush=True)
    url, exporter = serve_fleet(TARGETS, POINTS)
    try:
        history = DashboardResult(TARGETS, POINTS, time_live_page(url, runs, TARGETS))
    finally:
        exporter.kill()
    return DashboardRun(history, run_fleet(QUICK_FLEET_TARGETS if quick else FLEET_TARGETS, runs))


def run_fleet(targets: int, runs: int) -> FleetResult:
    print(f"dashboard: building a mixed fleet of {targets} targets", file=sys.stderr, flush=True)
    url, exporter = serve_fleet(targets, POINTS, "mixed")
    try:
        script_runner.ForwardMsgQueue = CountingQueue
        sizes: list[int] = []
        seconds = time_live_page(url, runs, None, sizes)
        return FleetResult(targets, POINTS, seconds, sizes, exporter_reads(url))
    finally:
        script_runner.ForwardMsgQueue = ForwardMsgQueue
        exporter.kill()


def exporter_reads(url: str) -> dict[str, int]:
    """The bytes of each JSON body a refresh of the page reads (as the dashboard reads
    them: uncompressed) and of the full signals body it no longer reads."""
    bodies = {
        "summary": api_url(url, "/api/v1/signals", view="summary"),
        "target": api_url(url, "/api/v1/signals", target=SHOWN),
        "history": api_url(url, "/api/v1/history", target=SHOWN),
        "full signals (not read)": api_url(url, "/api/v1/signals"),
    }
    sizes = {}
    for name, body_url in bodies.items():
        with urllib.request.urlopen(body_url, timeout=60) as response:
            sizes[name] = len(response.read())
    return sizes


def time_live_page(
    url: str, runs: int, targets: int | None, sizes: list[int] | None = None
) -> list[float]:
    """Seconds per Live page run against the exporter at `url`, after one warm-up run;
    the page shows SHOWN (or the worst target, without history of its own); `targets`:
    rows the table must list. `sizes`: given, each run's bytes to the browser go there."""
    page = AppTest.from_file(str(LIVE_PAGE), default_timeout=120)
    page.session_state["exporter_url"] = url
    if targets is None:
        page.session_state["live_target"] = SHOWN
    seconds = []
    for i in range(runs + 1):
        st.cache_data.clear()
        CountingQueue.sent = 0
        started = time.perf_counter()
        page.run()
        elapsed = time.perf_counter() - started
        if page.exception:
            raise RuntimeError(f"the Live page failed: {page.exception[0].message}")
        if targets is not None and len(page.dataframe[0].value) != targets:
            raise RuntimeError("the Live page did not list every target")
        if targets is None and page.selectbox(key="live_target").value != SHOWN:
            raise RuntimeError(f"the Live page did not show {SHOWN}")
        if i:
            seconds.append(elapsed)
            if sizes is not None:
                sizes.append(CountingQueue.sent)
        print(f"dashboard: run {i}: {elapsed * 1e3:.0f} ms", file=sys.stderr, flush=True)
    return seconds


def results(run: DashboardRun) -> dict:
    """The figures and gates, as `--json` writes them."""
    result, fleet = run.history, run.fleet
    values = [s * 1e3 for s in result.seconds]
    fleet_ms = [s * 1e3 for s in fleet.seconds]
    return {
        "targets": result.targets,
        "points": result.points,
        "interval_seconds": INTERVAL_SECONDS,
        "runs": len(values),
        "run_ms": values,
        "median_ms": result.median_ms,
        "min_ms": min(values),
        "max_ms": max(values),
        "target_ms": TARGET_MS,
        "met": result.meets_target,
        "fleet": {
            "targets": fleet.targets,
            "shown_points": fleet.points,
            "other_points": SHORT_POINTS,
            "runs": len(fleet_ms),
            "run_ms": fleet_ms,
            "median_ms": fleet.median_ms,
            "browser_bytes": fleet.browser_bytes,
            "median_browser_bytes": fleet.median_bytes,
            "exporter_bytes": fleet.exporter_bytes,
            "target_ms": FLEET_TARGET_MS,
            "target_bytes": FLEET_TARGET_BYTES,
            "met": fleet.median_ms < FLEET_TARGET_MS and fleet.median_bytes < FLEET_TARGET_BYTES,
        },
        "gates": {
            f"Live page, {result.targets} targets: median time": benchmark.gate(
                result.median_ms, TARGET_MS, "ms"
            ),
            f"Live page, {fleet.targets:,} targets: median time a refresh": benchmark.gate(
                fleet.median_ms, FLEET_TARGET_MS, "ms"
            ),
            f"Live page, {fleet.targets:,} targets: median bytes to the browser": benchmark.gate(
                fleet.median_bytes / 1e3, FLEET_TARGET_BYTES / 1e3, "kB"
            ),
        },
    }


def _kb(n: float) -> str:
    return f"{n / 1e3:,.0f} kB"


def markdown(results: dict) -> str:
    """The report section of `results`."""
    fleet = results["fleet"]
    reads = ", ".join(f"{name} {_kb(size)}" for name, size in fleet["exporter_bytes"].items())
    return (
        "\n".join(
            [
                "## Dashboard: the Live page's time and size",
                "",
                "Server-side time to build the Live page (the fleet table and the shown target's "
                "panel with its charts), fetched over HTTP from a real exporter app in its own "
                "process, the fetch cache cleared before each run; Streamlit's AppTest runs the "
                "page, so the browser's rendering is not included. Two fleets: "
                f"{results['targets']} targets with {results['points']} history points each (an "
                f"hour at {results['interval_seconds']:g} s); {fleet['targets']:,} targets of mixed "
                f"caps, budgets and loads, the shown one with {fleet['shown_points']} points. "
                "Bytes to the browser: every message of a refresh, serialized as Streamlit sends "
                f"it. Medians of {results['runs']} runs after a warm-up.",
                "",
                *benchmark.gate_rows(results),
                "",
                f"Runs, {results['targets']} targets: {results['min_ms']:.0f} - "
                f"{results['max_ms']:.0f} ms; {fleet['targets']:,} targets: "
                f"{min(fleet['run_ms']):.0f} - {max(fleet['run_ms']):.0f} ms. JSON a refresh "
                f"reads from the exporter: {reads}.",
            ]
        )
        + "\n"
    )


def run(args: argparse.Namespace) -> dict:
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # AppTest's bare-mode warnings
    return results(measure(args.quick))


if __name__ == "__main__":
    sys.exit(benchmark.main(__doc__, run, markdown))
