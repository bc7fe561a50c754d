"""The exporter's in-process fast paths against their plain definitions, at fleet size.

- The /metrics writer: 1,000 targets' signals (`--targets`), each after three scrapes of
  `fleet_sim.py`'s moving variants of the real vLLM 0.32 payload evaluated as the scrape
  loop does (`Exporter.evaluate`), rendered by `render_metrics`, what the exporter
  serves, and by prometheus_client's `generate_latest` over the reference Collector
  (tests/support/reference_exposition.py). Interleaved repetitions in this process (the
  order swaps every time), CPU time, medians; the two bodies must be the same bytes.
- The packed history: an hour of rows (720 at 5 s) of four distinct fleet targets,
  whose diagnosis reasons change at almost every point (the gauges move at every
  scrape), kept for 1,000 targets in the exporter's `History` and, as its plain
  definition, as the dict the API serves for each point (`api.history_point`) in a
  deque; the memory each holds (tracemalloc: what was allocated while filling and is
  still alive) and the objects the garbage collector must walk. The plain form is
  filled for 100 targets and scaled. Both must give the same points.

Tick batching and uvloop are measured in the exporter process on the fleet
(`bench_fleet.py`): their gain is CPU of a whole process, not of one function.

    .venv/bin/python scripts/bench_fastpaths.py [--quick] [--targets N]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path

import benchmark
from fleet_sim import FIXTURE, Template
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.exposition import render_metrics
from batchscope.exporter.serve.history import Histories, History

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.reference_exposition import SignalsCollector  # noqa: E402

INTERVAL_SECONDS = 5.0
SCRAPES = 3  # enough for rates, latency quantiles and advice
DISTINCT_HOURS = 4
PLAIN_TARGETS = 100
MIB = 2**20


def _exporter(targets: int, points: int) -> Exporter:
    configured = tuple(
        Target(
            f"t{i}",
            f"http://127.0.0.1:9/t/{i}/metrics",
            engine="vllm",
            cap=256,
            budget_seconds=1.0,
            labels=(("team", f"team-{i % 7}"),),
        )
        for i in range(targets)
    )
    return Exporter(
        Settings(targets=configured, interval_seconds=INTERVAL_SECONDS, history_points=points)
    )


def evaluated(targets: int, scrapes: int, first: int = 0) -> tuple[Exporter, Histories]:
    """An exporter of `targets` targets (fleet_sim's `first`, `first` + 1, ...), each
    after `scrapes` of its payloads, INTERVAL_SECONDS apart, and its histories."""
    template = Template(FIXTURE.read_text(encoding="utf-8"))
    rng = random.Random(0)
    exporter = _exporter(targets, max(scrapes, 1))
    histories = Histories(exporter)
    for scrape in range(scrapes):
        now = 1000.0 + INTERVAL_SECONDS * scrape
        for i, state in enumerate(exporter.states.values()):
            payload = template.render(first + i, scrape, rng)
            exporter.evaluate(state, ScrapeResult(payload, None, 0.01), now)
    return exporter, histories


def reference_render(targets: list[TargetSignals]) -> bytes:
    """prometheus_client's generate_latest of a registry holding the reference Collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(lambda: targets))
    return generate_latest(registry)


def _cpu(fn: Callable[[], bytes]) -> tuple[float, bytes]:
    started = time.process_time()
    body = fn()
    return time.process_time() - started, body


def writer(targets: int, repetitions: int) -> dict:
    """render_metrics against generate_latest, interleaved, CPU seconds, bytes compared."""
    print(f"fastpaths: evaluating {targets} targets", file=sys.stderr, flush=True)
    signals = evaluated(targets, SCRAPES)[0].current()
    sides = {"render_metrics": render_metrics, "generate_latest": reference_render}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    identical, body = True, b""
    for repetition in range(repetitions + 1):  # the first warms up, uncounted
        order = list(sides) if repetition % 2 else list(reversed(sides))
        bodies = {}
        for name in order:
            spent, bodies[name] = _cpu(lambda name=name: sides[name](signals))
            if repetition:
                seconds[name].append(spent)
        body = bodies["render_metrics"]
        identical = identical and len(set(bodies.values())) == 1
    return {
        "targets": targets,
        "repetitions": repetitions,
        "bytes": len(body),
        "samples": sum(1 for line in body.splitlines() if not line.startswith(b"#")),
        "seconds": seconds,
        "ratio": benchmark.median_ratio(seconds["generate_latest"], seconds["render_metrics"]),
        "identical": identical,
    }


def _held(fill: Callable[[], object]) -> tuple[int, int, object]:
    """Bytes allocated by `fill()` and alive after it, the objects the collector gained,
    and what it returned."""
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    kept = fill()
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, len(gc.get_objects()) - objects, kept


def history(targets: int, points: int) -> dict:
    """The served History against a deque of the API's point dicts, for `targets`."""
    print(f"fastpaths: {DISTINCT_HOURS} targets x {points} scrapes", file=sys.stderr, flush=True)
    hours = [evaluated(1, points, first=k)[1].rows("t0") for k in range(DISTINCT_HOURS)]

    def packed(count: int) -> list[History]:
        kept = []
        for i in range(count):
            kept.append(History(points))
            for row in hours[i % DISTINCT_HOURS]:
                kept[-1].append(row)
        return kept

    def plain(count: int) -> list[deque]:
        return [
            deque((api.history_point(row) for row in hours[i % DISTINCT_HOURS]), maxlen=points)
            for i in range(count)
        ]

    packed_bytes, packed_objects, served = _held(lambda: packed(targets))
    plain_count = min(PLAIN_TARGETS, targets)
    plain_bytes, plain_objects, defined = _held(lambda: plain(plain_count))
    scale = targets / plain_count
    same = all(
        repr([api.history_point(row) for row in served[i]]) == repr(list(defined[i]))
        for i in range(min(DISTINCT_HOURS, plain_count))
    )
    return {
        "targets": targets,
        "points": points,
        "reasons_distinct": len({row[4] for row in hours[0]}),
        "packed_bytes": packed_bytes,
        "packed_objects": packed_objects,
        "plain_targets": plain_count,
        "plain_bytes": plain_bytes * scale,
        "plain_objects": plain_objects * scale,
        "ratio": plain_bytes * scale / packed_bytes,
        "identical": same,
    }


def run(args: argparse.Namespace) -> benchmark.Results:
    targets = args.targets or (100 if args.quick else 1000)
    written = writer(targets, 3 if args.quick else 15)
    kept = history(targets, 120 if args.quick else 720)
    return {
        "writer": written,
        "history": kept,
        "gates": {},
        "checks": {
            "render_metrics and generate_latest: the same bytes": written["identical"],
            "History and the API's points: the same points": kept["identical"],
        },
    }


def markdown(r: benchmark.Results) -> str:
    w, h = r["writer"], r["history"]
    fast, plain = (statistics.median(w["seconds"][n]) * 1e3 for n in w["seconds"])
    per_point = h["targets"] * h["points"]
    return (
        "\n".join(
            [
                f"## Fast paths in one process ({w['targets']:,} targets)",
                "",
                "Each fast path against its plain definition, side by side in one process "
                "(`scripts/bench_fastpaths.py`); tick batching and uvloop are in the fleet "
                "section, measured in the exporter process.",
                "",
                "| fast path | served | plain definition | plain / served | same output |",
                "|---|---:|---:|---:|---|",
                f"| /metrics writer: `render_metrics` vs prometheus_client `generate_latest`, "
                f"one body ({w['bytes'] / 1e6:.1f} MB, {w['samples']:,} samples), median CPU of "
                f"{w['repetitions']} | {fast:.1f} ms | {plain:.1f} ms | {w['ratio']:.1f}x | "
                f"{'yes' if w['identical'] else '**no**'} |",
                f"| history: `History` vs a deque of `api.history_point` dicts, {h['points']} "
                f"points a target | {h['packed_bytes'] / MIB:.1f} MiB | "
                f"{h['plain_bytes'] / MIB:.1f} MiB | {h['ratio']:.1f}x | "
                f"{'yes' if h['identical'] else '**no**'} |",
                f"| history: bytes a point | {h['packed_bytes'] / per_point:,.0f} B | "
                f"{h['plain_bytes'] / per_point:,.0f} B | | |",
                f"| history: objects the garbage collector walks | {h['packed_objects']:,.0f} | "
                f"{h['plain_objects']:,.0f} | | |",
                "",
                f"The history's rows: {h['reasons_distinct']} distinct diagnosis reasons in a "
                f"target's {h['points']} points; the plain form filled for {h['plain_targets']} "
                "targets and scaled.",
            ]
        )
        + "\n"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", type=int, help="targets (default 1000; quick 100)")


if __name__ == "__main__":
    sys.exit(benchmark.main(__doc__, run, markdown, add_arguments))
