"""Schedule benchmark: 1,000 targets, a fifth of them hanging, in the real exporter process.

The exporter (`python -m batchscope.exporter.cli --config FILE`, as deployed) scrapes 1,000 local
targets every 3 s; 200 never answer. Once every target has been evaluated and the hung
ones have failed, each target's requests are counted over five intervals, and the gaps
between a healthy target's evaluations are read from the exporter's history. The
claims: every healthy target is scraped once an interval (at least four times in five
intervals, the edges aside), no gap between two of its evaluations reaches two
intervals, and the hung targets are backed off (fewer than 0.6 scrapes an interval).
What holds whatever the machine's speed (the hung targets' own slots, the back-off
sequence) is tests/exporter/test_schedule.py's.

    .venv/bin/python scripts/bench_schedule.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.live import Exporter, Targets, running_exporter, vllm_payload  # noqa: E402
from tests.support.live import wait_for as wait_for_async  # noqa: E402

# Time for the exporter to evaluate every target once: the hung ones hold slots until
# their first scrape times out.
STARTUP_SECONDS = 120.0
# After that, the hung targets fail and move to their own slots.
SETTLE_INTERVALS = 2
# Healthy: scrapes a target may miss in the measured intervals (one may fall on an edge).
ON_SCHEDULE_MISSING = 1
# No gap between two evaluations of a healthy target reaches this many intervals.
GAP_INTERVALS = 2.0
# Hung: fewer than this many scrapes an interval, backed off.
HUNG_SCRAPES_PER_INTERVAL = 0.6


@dataclass(frozen=True)
class SchedulePlan:
    targets: int
    hung: int
    interval_seconds: float
    measured_intervals: int


FULL = SchedulePlan(targets=1000, hung=200, interval_seconds=3.0, measured_intervals=5)
QUICK = SchedulePlan(targets=100, hung=20, interval_seconds=3.0, measured_intervals=5)


async def _hang(_: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response()


async def _histories(
    exporter: Exporter, session: aiohttp.ClientSession, points: int
) -> dict[str, list[dict]]:
    """Every target's last `points` history points, a page of targets at a time."""
    histories: dict[str, list[dict]] = {}
    page, pages = 0, 1
    while page < pages:
        path = f"/api/v1/history?points={points}&page={page}"
        body = await exporter.get_json(session, path)
        histories.update(body["targets"])
        page, pages = page + 1, body["pages"]
    return histories


async def measure(plan: SchedulePlan, folder: Path) -> dict:
    """Requests per target over the measured intervals, and the healthy targets'
    evaluation times, from one run of the exporter process."""
    hung = [f"hung{i:04d}" for i in range(plan.hung)]
    healthy = [f"ok{i:04d}" for i in range(plan.targets - plan.hung)]
    interval = plan.interval_seconds
    async with Targets() as targets:
        targets.handlers = dict.fromkeys(hung, _hang)
        targets.payloads = {name: vllm_payload(2) for name in healthy}
        entries = "\n".join(
            f'  - {{name: {n}, url: "{targets.url(n)}", engine: vllm, cap: 8}}'
            for n in hung + healthy
        )
        config = (
            f"interval_seconds: {interval}\ntimeout_seconds: {interval}\n"
            f"window_seconds: 60\ntargets:\n{entries}\n"
        )
        async with running_exporter(config, folder) as exporter, aiohttp.ClientSession() as s:
            unseen: list[str] = []

            async def everyone_seen() -> bool:
                histories = await _histories(exporter, s, 1)
                unseen[:] = [n for n in hung + healthy if not histories.get(n)]
                return not unseen

            print(f"schedule: {plan.targets} targets, {plan.hung} hanging", file=sys.stderr)
            try:
                await wait_for_async(
                    everyone_seen, STARTUP_SECONDS, "every target evaluated once", step=1.0
                )
            except AssertionError as err:
                raise RuntimeError(f"{err}: {len(unseen)} never were, {unseen[:5]}") from None
            await asyncio.sleep(SETTLE_INTERVALS * interval)
            before = dict(targets.requests)
            await asyncio.sleep(plan.measured_intervals * interval)
            after = dict(targets.requests)
            points = await _histories(exporter, s, 30)
    scraped = {name: after.get(name, 0) - before.get(name, 0) for name in hung + healthy}
    # The gaps between a healthy target's evaluations over the measured intervals.
    worst_gaps = [
        max(
            b["t"] - a["t"]
            for a, b in itertools.pairwise(points[name][-(plan.measured_intervals + 1) :])
        )
        for name in healthy
    ]
    return {"scraped": scraped, "hung": hung, "healthy": healthy, "worst_gaps": worst_gaps}


def run(quick: bool = False) -> dict:
    plan = QUICK if quick else FULL
    load_before = psutil.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        measured = asyncio.run(measure(plan, Path(tmp)))
    return {"plan": plan, "load_before": load_before, **measured}


def results(run_result: dict) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them."""
    plan: SchedulePlan = run_result["plan"]
    scraped = run_result["scraped"]
    healthy = [scraped[name] for name in run_result["healthy"]]
    hung = [scraped[name] for name in run_result["hung"]]
    measured = plan.measured_intervals
    late = sum(1 for n in healthy if n < measured - ON_SCHEDULE_MISSING)
    worst_gap = max(run_result["worst_gaps"])
    hung_mean = statistics.fmean(hung) if hung else 0.0
    return {
        "targets": plan.targets,
        "hung": plan.hung,
        "interval_seconds": plan.interval_seconds,
        "measured_intervals": measured,
        "load_before": list(run_result["load_before"]),
        "healthy_scrapes": {
            "min": min(healthy),
            "median": statistics.median(healthy),
            "max": max(healthy),
        },
        "healthy_late": late,
        "worst_gap_seconds": worst_gap,
        "median_worst_gap_seconds": statistics.median(run_result["worst_gaps"]),
        "hung_scrapes_mean": hung_mean,
        "met": {
            "on_schedule": late == 0,
            "gaps": worst_gap < GAP_INTERVALS * plan.interval_seconds,
            "backed_off": hung_mean < HUNG_SCRAPES_PER_INTERVAL * measured,
        },
    }


def markdown(results: dict) -> str:
    """The report section of `results`."""
    measured, interval = results["measured_intervals"], results["interval_seconds"]
    met = {name: "met" if ok else "missed" for name, ok in results["met"].items()}
    scrapes = results["healthy_scrapes"]
    load = ", ".join(f"{x:.2f}" for x in results["load_before"])
    return "\n".join(
        [
            f"## Schedule: {results['targets']} targets, {results['hung']} of them hanging",
            "",
            f"`scripts/bench_schedule.py`: the exporter process scrapes {results['targets']} "
            f"local targets every {interval:g} s (timeout {interval:g} s); "
            f"{results['hung']} never answer. After every target was evaluated once and "
            f"{SETTLE_INTERVALS} more intervals (the hung ones failed and moved to their own "
            f"slots), each target's requests are counted over {measured} intervals, and "
            "the gaps between a healthy target's evaluations read from the exporter's "
            f"history. Load average before: {load}.",
            "",
            "| measure | value | target |",
            "|---|---:|---|",
            f"| scrapes of a healthy target in {measured} intervals, min / median / max | "
            f"{scrapes['min']} / {scrapes['median']:g} / {scrapes['max']} | "
            f">= {measured - ON_SCHEDULE_MISSING} |",
            f"| healthy targets scraped fewer times | {results['healthy_late']} | "
            f"0: {met['on_schedule']} |",
            "| worst gap between two evaluations of a healthy target | "
            f"{results['worst_gap_seconds']:.2f} s (median target's worst: "
            f"{results['median_worst_gap_seconds']:.2f} s) | "
            f"< {GAP_INTERVALS * interval:g} s: {met['gaps']} |",
            f"| scrapes of a hung target in {measured} intervals, mean | "
            f"{results['hung_scrapes_mean']:.2f} | "
            f"< {HUNG_SCRAPES_PER_INTERVAL * measured:g}: {met['backed_off']} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 targets: a smoke run")
    numbers = results(run(parser.parse_args(argv).quick))
    print(markdown(numbers))
    return 0 if all(numbers["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
