"""Dashboard benchmark: server-side time to build the Live page for a fleet with history.

A real exporter app (exporter.serve.app.create_app), in its own process, serves 10 targets, each
with one hour
of history at a 5 s interval (720 points), built by the exporter's own ingest from a
real vLLM 0.32 payload. Streamlit's AppTest runs the Live page against it: fetching the
signals and every target's history over HTTP, building the frames, the fleet table and
every chart of the selected target. The fetch cache is cleared before each run, so each
run pays for its fetches. The first run (imports) is not counted.

    .venv/bin/python scripts/bench_dashboard.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from aiohttp import web
from streamlit.testing.v1 import AppTest

from exporter.config.settings import Settings, Target
from exporter.core.snapshot import Snapshot
from exporter.engines import read_series
from exporter.scrape.loop import Exporter
from exporter.serve.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import NotReady, free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/vllm-0.32.0-cpu-load.txt"
LIVE_PAGE = ROOT / "dashboard/views/live.py"
TARGETS = 10
POINTS = 720
INTERVAL_SECONDS = 5.0
RUNS = 9
QUICK_RUNS = 2
TARGET_MS = 300.0


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


def _serve_fleet(targets: int, points: int, port: int) -> None:
    """Build the fleet and serve its exporter app on `port` until killed (a child process)."""
    exporter = fleet_with_history(targets, points)

    async def serve() -> None:
        runner = web.AppRunner(create_app(exporter), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def serve_fleet(targets: int, points: int) -> tuple[str, multiprocessing.Process]:
    """The fleet's exporter in its own process, as in a deployment; its URL once it answers."""
    port = free_port()
    child = multiprocessing.get_context("spawn").Process(
        target=_serve_fleet, args=(targets, points, port), daemon=True
    )
    child.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 120, processes=[child])
    except NotReady:
        child.kill()
        raise
    return url, child


def run(quick: bool = False) -> DashboardResult:
    print(f"dashboard: building {TARGETS} targets x {POINTS} points", file=sys.stderr, flush=True)
    url, exporter = serve_fleet(TARGETS, POINTS)
    try:
        return DashboardResult(TARGETS, POINTS, time_live_page(url, QUICK_RUNS if quick else RUNS))
    finally:
        exporter.kill()


def time_live_page(url: str, runs: int) -> list[float]:
    """Seconds per Live page run against the exporter at `url`, after one warm-up run."""
    page = AppTest.from_file(str(LIVE_PAGE), default_timeout=60)
    page.session_state["exporter_url"] = url
    seconds = []
    for i in range(runs + 1):
        st.cache_data.clear()
        started = time.perf_counter()
        page.run()
        elapsed = time.perf_counter() - started
        if page.exception:
            raise RuntimeError(f"the Live page failed: {page.exception[0].message}")
        if len(page.dataframe[0].value) != TARGETS:
            raise RuntimeError("the Live page did not list every target")
        if i:
            seconds.append(elapsed)
        print(f"dashboard: run {i}: {elapsed * 1e3:.0f} ms", file=sys.stderr, flush=True)
    return seconds


def results(result: DashboardResult) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them."""
    values = [s * 1e3 for s in result.seconds]
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
    }


def markdown(results: dict) -> str:
    """The report section of `results`."""
    return "\n".join(
        [
            "## Dashboard",
            "",
            "Server-side time to build the Live page (the fleet table and the selected "
            f"target's panel with its 9 charts) for {results['targets']} targets with "
            f"{results['points']} history points each (one hour at "
            f"{results['interval_seconds']:g} s), "
            "fetched over HTTP from a real exporter app in its own process, with the fetch cache "
            "cleared; "
            "Streamlit's AppTest runs the page, so browser rendering is not included "
            "(`scripts/bench_dashboard.py`).",
            "",
            "| measure | value |",
            "|---|---|",
            f"| runs | {results['runs']} (after one warm-up run) |",
            f"| median (min - max) | {results['median_ms']:.0f} ms ({results['min_ms']:.0f} - "
            f"{results['max_ms']:.0f} ms) |",
            f"| target: under {results['target_ms']:.0f} ms | "
            f"{'met' if results['met'] else 'missed'} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two runs: a smoke test")
    args = parser.parse_args(argv)
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # AppTest's bare-mode warnings
    print(markdown(results(run(args.quick))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
