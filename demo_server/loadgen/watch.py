"""`--watch METRICS_URL`: the exporter's own scrape-and-evaluate pass, in-process, during
each step of a sweep.

Each step gets an `Exporter` (exporter/scrape/loop.py) of one target whose window is the
step's (warm-up excluded), and `run_round` is called every WATCH_INTERVAL_S: the same
scrape, payload reading and evaluation the exporter runs, not a copy. `WatchedServer`
turns the evaluations into the step's readings (`batching.readings_of_evaluations`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from batchscope.demo_server.loadgen.batching import BatchingReading, readings_of_evaluations
from batchscope.exporter.config.flags import add_target_arguments, target_flag_values
from batchscope.exporter.config.settings import Target, settings_from_values, target_from_values
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter

WATCH_INTERVAL_S = 1.0
# The exporter's settings a step's watch fixes: a scrape a second over the step's window.
WATCH_ORIGIN = "--watch"
# The exporter's target flags --watch takes, as the exporter takes them.
WATCH_TARGET_KEYS = ("engine", "cap", "token_cap", "max_num_batched_tokens", "budget_seconds")


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    """--watch and the exporter's flags that say how to judge the watched server."""
    group = parser.add_argument_group("server signals (the exporter's evaluator, in-process)")
    group.add_argument(
        "--watch",
        metavar="METRICS_URL",
        help="scrape the server's /metrics every second of each step and record its "
        "batching signals in the step's `batching` object",
    )
    add_target_arguments(group, WATCH_TARGET_KEYS)


def watch_target(args: argparse.Namespace) -> Target | None:
    """The watched server as an exporter target, or None without --watch; raises
    ConfigError naming the flag for a bad value."""
    if args.watch is None:
        return None
    values = {"url": (args.watch, WATCH_ORIGIN), **target_flag_values(args, WATCH_TARGET_KEYS)}
    return target_from_values(values)


class StepWatch:
    """The exporter's evaluations of one target over one step's window."""

    def __init__(self, target: Target, window_seconds: float) -> None:
        window = max(window_seconds, WATCH_INTERVAL_S)
        settings = settings_from_values(
            {
                "interval_seconds": (WATCH_INTERVAL_S, WATCH_ORIGIN),
                "window_seconds": (window, WATCH_ORIGIN),
            },
            (target,),
            (),
        )
        self.target = target
        self.exporter = Exporter(settings)
        self.evaluations: list[TargetSignals] = []

    async def run(self, stop: asyncio.Event) -> list[TargetSignals]:
        """Scrape and evaluate every WATCH_INTERVAL_S until `stop` is set; returns the
        evaluations, oldest first (one more at the stop: the step's last second counts)."""
        loop = asyncio.get_running_loop()
        async with client_session() as session:
            due = loop.time()
            while True:
                await self.exporter.run_round(session)
                latest = self.exporter.latest(self.target.name)
                if latest:
                    self.evaluations.append(latest[-1])
                if stop.is_set():
                    return self.evaluations
                due += WATCH_INTERVAL_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))


class WatchedServer:
    """--watch as a step's source of readings: a `StepWatch` over each step."""

    source = WATCH_ORIGIN

    def __init__(self, target: Target) -> None:
        self.target = target

    async def read_step(
        self, window_seconds: float, stop: asyncio.Event
    ) -> list[BatchingReading | None]:
        """The readings of the step's evaluations, from now until `stop` is set."""
        evaluations = await StepWatch(self.target, window_seconds).run(stop)
        return readings_of_evaluations(evaluations)
