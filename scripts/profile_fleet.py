"""Where the exporter's CPU goes at fleet scale: cProfile of its rounds and its endpoints.

Starts `fleet_sim.py`, runs `Exporter.run_round` in this process against it (a warm-up
round first, then `--rounds` profiled back to back), then profiles building the
/metrics body and the /api/v1/signals body the way `batchscope.exporter.serve.app` does. Prints the
top functions by own time for each. A diagnostic for the fleet benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import time
from collections.abc import Callable

from bench_fleet import FULL, FleetPlan, start_simulator

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape.http_client import Connections
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.exposition import render_metrics


def _report(
    title: str, profile: cProfile.Profile, seconds: float, args: argparse.Namespace
) -> None:
    print(f"\n=== {title}: {seconds:.3f} s wall ===")
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


async def _rounds(exporter: Exporter, args: argparse.Namespace) -> None:
    # The same connection pool as Exporter.run_forever.
    async with Connections() as connections:
        await exporter.run_round(connections)
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        for _ in range(args.rounds):
            await exporter.run_round(connections)
        profile.disable()
        _report(f"{args.rounds} round(s)", profile, time.perf_counter() - started, args)


def _profiled(title: str, build: Callable[[], bytes | str], args: argparse.Namespace) -> None:
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    body = build()
    profile.disable()
    _report(f"{title} ({len(body) / 1e6:.2f} MB)", profile, time.perf_counter() - started, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=FULL.targets)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile")
    parser.add_argument("--sort", choices=("tottime", "cumulative"), default="tottime")
    args = parser.parse_args()
    plan = FleetPlan(args.targets, args.rounds, FULL.interval_seconds)
    with contextlib.ExitStack() as stack:
        _, address = start_simulator(plan, stack)
        targets = tuple(
            Target(
                f"t{i}",
                f"http://{address}/t/{i}/metrics",
                engine="vllm",
                cap=256,
                budget_seconds=1.0,
            )
            for i in range(plan.targets)
        )
        exporter = Exporter(Settings(targets=targets, interval_seconds=plan.interval_seconds))
        asyncio.run(_rounds(exporter, args))
    _profiled("/metrics body", lambda: render_metrics(exporter.current()), args)
    _profiled(
        "/api/v1/signals body",
        lambda: api.encode(
            api.signals_response(
                exporter.clock(), exporter.current(), api.evaluation_json(exporter.settings)
            )
        ),
        args,
    )


if __name__ == "__main__":
    main()
