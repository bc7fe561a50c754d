"""Each speed shortcut of the exporter against its plain path, side by side, at fleet size.

Every cost is CPU time per interval of the fleet (1,000 targets, 5 s: `--targets`), with
the shortcut and without it, in alternating repetitions in one run (the order swaps every
repetition), medians and their ratio:

- (a) compiled plans: the fleet's payloads (fleet_sim's variants of the real vLLM 0.32
  payload, one per target) read by `read_series`, whose layouts have their plans, against
  the adapter's unplanned read of the same layout (`samples_of`, then `series_of`);
- (b) id()-keyed series keys, a shortcut this measurement removed: that unplanned read
  with a cache of each labels dict's key by its id (`id_keyed_series_keys`, below) in
  place of `grouping.series_keys`, and with `grouping.series_keys` (`series_key` of each
  sample); with plans, the fleet never reaches it, which is counted too;
- (c) packed history rows: a row per evaluation (`api.history_row`) against the point as
  a dict, in full histories of `--history-points` per target: the appends of an interval,
  and the full collection the GC policy runs every 5 minutes, per interval;
- (d) the /metrics writer: `render_metrics` against prometheus_client's generate_latest
  over `tests.support.reference_exposition.SignalsCollector`, once per interval;
- (e) the HTTP client: every target fetched from fleet_sim.py (gzip), in bursts of a
  tick's scrapes, by `fetch.scrape` over `Connections` and by aiohttp's client (given the
  same ISA-L inflate: `aiohttp.set_zlib_backend`);
- (f) the GC policy and (g) tick batching, in the exporter process itself: `Exporter`
  scraping fleet_sim.py in a child process (rendering /metrics once a round, as for a
  Prometheus), in blocks of a few intervals with every shortcut on, with CPython's
  default GC thresholds, and with `tick_batching=False` (phases off the tick grid, each
  scrape evaluated as it ends), the blocks in turn, each block's CPU per `targets`
  evaluations. (f) compares the collector's own CPU time (`gc.callbacks`), (g) the
  process's. With the policy, the full collection it runs every FULL_COLLECTION_SECONDS
  is timed at the end and added, per interval.
- (h) the payload reader's C pass: `promtext.read_values` on the same payloads as (a), each
  layout's template kept, against the Python path alone (the selection regex and
  `promtext._known_values`).

Every pair is checked: the same series, points, bytes or bodies on both sides. A shortcut
pays when it saves at least PAYS_OF_APPLIED of what it applies to and PAYS_OF_FLEET of the
fleet's CPU (the in-process exporter's, every shortcut on).

    .venv/bin/python scripts/bench_shortcuts.py [--quick] [--targets N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import aiohttp
import psutil
from bench_fleet import FleetPlan, start_simulator
from bench_render import fleet_signals, reference_render
from fleet_sim import FIXTURE, Template
from isal import isal_zlib

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.engines import ADAPTERS, families_read, grouping, read_series, series_of
from batchscope.exporter.ingest import promtext
from batchscope.exporter.scrape import gc_policy
from batchscope.exporter.scrape.fetch import SCRAPE_HEADERS, ScrapeResult, scrape
from batchscope.exporter.scrape.http_client import Connections
from batchscope.exporter.scrape.loop import (
    MAX_CONCURRENT_FAILING_SCRAPES,
    MAX_CONCURRENT_SCRAPES,
    TICK_SECONDS,
    Exporter,
)
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.app import plain_and_gzip
from batchscope.exporter.serve.exposition import render_metrics

ROOT = Path(__file__).resolve().parent.parent
# As the fleet benchmark reads each target: engine vllm, no sample limit, the e2e histogram.
READ = ("vllm", None, "e2e")
PAYS_OF_APPLIED = 0.05
PAYS_OF_FLEET = 0.01
# The fleet's blocks: every shortcut on, and each in-process one off (by the key below).
ALL_ON = "all"
FLEET_MODES = (ALL_ON, "gc_policy", "tick_batching")
# New layouts whose plans are compiled to time a compilation.
COMPILED_LAYOUTS = 20


@dataclass(frozen=True)
class Sizes:
    """How big a run is."""

    targets: int
    repeats: int  # timed pairs of each micro-benchmark (a), (b), (d), (e)
    history_points: int
    history_repeats: int  # histories filled each way for (c)
    interval_seconds: float
    warmup_intervals: int  # the child's first block: plans compiled, windows full
    settle_intervals: int  # the start of every block, not timed
    measure_intervals: int
    fleet_repeats: int  # times each fleet mode has a block


# 13 intervals of warm-up fill the default 60 s window.
FULL = Sizes(1000, 15, 720, 3, 5.0, 13, 1, 4, 3)
# Enough targets and intervals that the default thresholds collect in each block.
QUICK = Sizes(50, 2, 20, 2, 1.0, 2, 1, 2, 1)


def cpu(fn: Callable[[], object]) -> tuple[float, object]:
    """CPU seconds of one call (every thread of the process), and what it returned."""
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def alternate(
    with_it: Callable[[], object], without_it: Callable[[], object], repeats: int
) -> tuple[list[float], list[float]]:
    """CPU seconds of each side per repetition, the order swapped every repetition, after
    one untimed call of each."""
    with_it(), without_it()
    times: tuple[list[float], list[float]] = ([], [])
    for repetition in range(repeats):
        sides = ((0, with_it), (1, without_it))
        for side, fn in sides if repetition % 2 == 0 else sides[::-1]:
            times[side].append(cpu(fn)[0])
    return times


def same(a: object, b: object) -> bool:
    """Equal values, exactly: reprs compared (NaN equals NaN, -0.0 differs from 0.0)."""
    return repr(a) == repr(b)


# ---------------------------------------------------------------- (a) and (b): ingest


def fleet_payloads(targets: int, scrape: int = 0) -> list[str]:
    """One scrape of each target as fleet_sim.py serves it."""
    template = Template(FIXTURE.read_text(encoding="utf-8"))
    rng = random.Random(scrape)
    return [template.render(t, scrape, rng) for t in range(targets)]


def unplanned_read(text: str) -> tuple:
    """`read_series(text, *READ)` the general way: the selective parse's values on the
    known layout, then the adapter over the samples, never a plan."""
    engine, limit, _ = READ
    layout, values = promtext.read_values(text, _families(), limit)
    return series_of([engine], promtext.samples_of(layout, values))


def _families() -> tuple[str, ...]:
    """The families `read_series(text, *READ)` reads."""
    engine, _, histogram = READ
    return tuple(families_read(ADAPTERS[engine], histogram))


def c_pass_values(text: str) -> tuple | None:
    """(h) with: the payload's layout and values as `read_series` gets them
    (`promtext.read_values`: the C pass, on a layout whose template is kept)."""
    return promtext.read_values(text, _families(), READ[1])


def c_pass_reads(text: str) -> bool:
    """Whether the C pass itself reads the payload (it could leave it to Python)."""
    selection = promtext._selection(_families())
    read = promtext._known_lines.read(text, selection.known_names, selection.templates)
    return read is not None and read[1] is not None


def python_values(text: str) -> tuple | None:
    """(h) without: the same by the Python path alone (the selection regex, then the
    layout's values: `promtext._known_values`)."""
    selection = promtext._selection(_families())
    return promtext._known_values(selection, selection.lines.findall("\n" + text), READ[1])


def id_keyed_series_keys(samples, key_labels: tuple[str, ...]) -> list:
    """The removed shortcut (b): `grouping.series_keys` with each labels dict's key cached
    by the dict's id. The parser hands out the same labels dict for a line head on every
    scrape of a server, and nobody mutates one; an entry holds its dict, so no other dict
    can take that id while the entry is there."""
    known = _ID_KEYS.setdefault(key_labels, {})
    keys = []
    for s in samples:
        labels = s.labels
        entry = known.get(id(labels))
        if entry is None or entry[0] is not labels:
            if len(known) >= 200_000:
                known.clear()
            entry = known[id(labels)] = (labels, grouping.series_key(labels, key_labels))
        keys.append(entry[1])
    return keys


_ID_KEYS: dict[tuple[str, ...], dict[int, tuple[dict, tuple]]] = {}


@contextlib.contextmanager
def counted_series_keys() -> Iterator[list[int]]:
    """`grouping.series_keys` counting its calls (the count in the list yielded)."""
    calls = [0]
    real = grouping.series_keys

    def counting(samples, key_labels):
        calls[0] += 1
        return real(samples, key_labels)

    with mock.patch.object(grouping, "series_keys", counting):
        yield calls


def bench_ingest(sizes: Sizes) -> dict[str, dict]:
    """(a) and (b): CPU of reading one payload of each target, each way."""
    payloads = fleet_payloads(sizes.targets)
    print(f"shortcuts: (a) plans, (b) id caches: {len(payloads)} payloads", file=sys.stderr)
    for _ in range(2):  # the second read of a layout compiles its plan
        [read_series(p, *READ) for p in payloads]
    # Layouts never seen: the first read records each, the second compiles its plan.
    template, rng = Template(FIXTURE.read_text(encoding="utf-8")), random.Random(1)
    fresh = [template.render(sizes.targets + i, 0, rng) for i in range(COMPILED_LAYOUTS)]
    [read_series(p, *READ) for p in fresh]
    compiling, _ = cpu(lambda: [read_series(p, *READ) for p in fresh])
    general, _ = cpu(lambda: [unplanned_read(p) for p in fresh])
    compile_seconds = (compiling - general) / COMPILED_LAYOUTS
    planned = [read_series(p, *READ) for p in payloads]
    unplanned = [unplanned_read(p) for p in payloads]
    with counted_series_keys() as planned_calls:
        [read_series(p, *READ) for p in payloads]
    with counted_series_keys() as general_calls:
        [unplanned_read(p) for p in payloads]

    def with_ids() -> list:
        with mock.patch.object(grouping, "series_keys", id_keyed_series_keys):
            return [unplanned_read(p) for p in payloads]

    plans = alternate(
        lambda: [read_series(p, *READ) for p in payloads],
        lambda: [unplanned_read(p) for p in payloads],
        sizes.repeats,
    )
    ids = alternate(with_ids, lambda: [unplanned_read(p) for p in payloads], sizes.repeats)
    c_pass = alternate(
        lambda: [c_pass_values(p) for p in payloads],
        lambda: [python_values(p) for p in payloads],
        sizes.repeats,
    )
    return {
        "c_pass": {
            "times": c_pass,
            "identical": same(
                [c_pass_values(p) for p in payloads], [python_values(p) for p in payloads]
            )
            and all(c_pass_reads(p) for p in payloads),
        },
        "plans": {
            "times": plans,
            "identical": same(planned, unplanned),
            "extra": {"compile_one_layout_seconds": compile_seconds},
        },
        "id_caches": {
            "times": ids,
            "identical": same(with_ids(), unplanned),
            # With plans the fleet reads no payload the general way once warm.
            "reached": planned_calls[0] / max(1, general_calls[0]),
            "extra": {
                "series_keys_calls_planned": planned_calls[0],
                "series_keys_calls_unplanned": general_calls[0],
            },
        },
    }


# ---------------------------------------------------------------- (c): history rows


def plain_series_point(series: SeriesSignals) -> dict:
    """One series' point as a dict, built from its signals: what `api.history_point`
    reads back from a row."""
    static, attained = series.static_utilization, series.slo_attainment
    burning = series.slo.burning if series.slo is not None else ()
    numbers = {name: getattr(series, name) for name in api.FIELD_NUMBERS}
    numbers["static_utilization"] = static.estimate if static is not None else None
    numbers["slo_attainment"] = attained.share.estimate if attained is not None else None
    point = {name: None if v is None or v != v else v for name, v in numbers.items()}
    point["budget_saturated"] = bool(series.budget_saturated)
    point["slo_burning_fast"] = "fast" in burning
    point["slo_burning_slow"] = "slow" in burning
    point["diagnosis"] = series.diagnosis.state
    point["diagnosis_reason"] = series.diagnosis.reason
    return point


def plain_point(signals: TargetSignals) -> dict:
    """The history point of one evaluation as a dict, as the API answers it."""
    series = signals.series if len(signals.series) > 1 else ()
    return {
        "t": signals.t,
        "up": signals.up,
        **plain_series_point(signals.total),
        "series": [{"labels": dict(s.labels), **plain_series_point(s)} for s in series],
    }


def point_bytes(point: object) -> int:
    """A point's own memory: its containers and numbers (each evaluation's are its own),
    not its strings (both ways keep the same ones)."""
    if isinstance(point, dict):
        return sys.getsizeof(point) + sum(point_bytes(v) for v in point.values())
    if isinstance(point, tuple) and not point:
        return 0  # the one empty tuple, shared
    if isinstance(point, list | tuple):
        return sys.getsizeof(point) + sum(point_bytes(v) for v in point)
    if isinstance(point, float | bytes):
        return sys.getsizeof(point)
    return 0


def tracked(point: object) -> int:
    """Objects of a point the garbage collector walks."""
    if isinstance(point, dict):
        return gc.is_tracked(point) + sum(tracked(v) for v in point.values())
    if isinstance(point, list | tuple):
        return gc.is_tracked(point) + sum(tracked(v) for v in point)
    return 0


def bench_history(sizes: Sizes, signals: list[TargetSignals]) -> dict[str, dict]:
    """(c): an interval's appends to full histories and the policy's full collection of
    them, per interval, as rows and as dicts."""
    print(
        f"shortcuts: (c) history rows: {len(signals)} targets x {sizes.history_points} points",
        file=sys.stderr,
    )
    builders = {"with": api.history_row, "without": plain_point}
    amortised = sizes.interval_seconds / gc_policy.FULL_COLLECTION_SECONDS
    times: dict[str, list[float]] = {"with": [], "without": []}
    details: dict[str, dict] = {}
    before = gc.get_threshold()
    # As the exporter's policy: what exists already (modules, the signals) is frozen out of
    # the collections, which then walk the histories and what the appends make.
    gc.collect()
    gc.freeze()
    gc.set_threshold(
        gc_policy.YOUNG_THRESHOLD, gc_policy.MIDDLE_THRESHOLD, gc_policy.NO_AUTOMATIC_FULL
    )
    try:
        for repetition in range(sizes.history_repeats):
            order = list(builders) if repetition % 2 == 0 else list(builders)[::-1]
            for side in order:
                build = builders[side]
                histories = [deque(maxlen=sizes.history_points) for _ in signals]
                for _ in range(sizes.history_points):
                    for history, s in zip(histories, signals, strict=True):
                        history.append(build(s))

                def one_interval(build=build, histories=histories) -> None:
                    for history, s in zip(histories, signals, strict=True):
                        history.append(build(s))

                appends = statistics.median(cpu(one_interval)[0] for _ in range(5))
                full = statistics.median(cpu(gc.collect)[0] for _ in range(2))
                times[side].append(appends + full * amortised)
                point = histories[0][-1]
                details[side] = {
                    "appends_seconds": appends,
                    "full_collection_seconds": full,
                    "point_bytes": point_bytes(point),
                    "tracked_per_point": tracked(point),
                }
                del histories
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    identical = all(api.history_point(api.history_row(s)) == plain_point(s) for s in signals)
    return {
        "history_rows": {
            "times": (times["with"], times["without"]),
            "identical": identical,
            "extra": details,
        }
    }


# ---------------------------------------------------------------- (d): the /metrics writer


def bench_writer(sizes: Sizes, signals: list[TargetSignals]) -> dict[str, dict]:
    """(d): one /metrics body of the targets, each writer."""
    print(f"shortcuts: (d) /metrics writer: {len(signals)} targets", file=sys.stderr)
    times = alternate(
        lambda: render_metrics(signals), lambda: reference_render(signals), sizes.repeats
    )
    identical = render_metrics(signals) == reference_render(signals)
    return {"writer": {"times": times, "identical": identical}}


# ---------------------------------------------------------------- (e): the HTTP client


async def aiohttp_scrape(
    session: aiohttp.ClientSession, target: Target, timeout: float, max_bytes: int
) -> ScrapeResult:
    """`fetch.scrape` by aiohttp's client, as one writes it: the same headers, redirects
    refused, the body read and inflated by aiohttp (its declared length capped)."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async with session.get(
                target.url, headers=SCRAPE_HEADERS, allow_redirects=False
            ) as response:
                if response.status != 200:
                    error = f"HTTP {response.status} {response.reason or ''}".strip()
                    return ScrapeResult(None, error, time.perf_counter() - started)
                if (response.content_length or 0) > max_bytes:
                    error = f"response larger than {max_bytes} bytes"
                    return ScrapeResult(None, error, time.perf_counter() - started)
                body = await response.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        return ScrapeResult(None, f"{type(err).__name__}: {err}", time.perf_counter() - started)
    return ScrapeResult(body.decode("utf-8", errors="replace"), None, time.perf_counter() - started)


def fleet_targets(address: str, targets: int) -> tuple[Target, ...]:
    """The fleet benchmark's targets on fleet_sim.py at `address`."""
    return tuple(
        Target(
            f"t{i}", f"http://{address}/t/{i}/metrics", engine="vllm", cap=256, budget_seconds=1.0
        )
        for i in range(targets)
    )


async def _fetch_clients(sizes: Sizes, address: str) -> dict[str, dict]:
    """(e): CPU of fetching every target once, by each client."""
    targets = fleet_targets(address, sizes.targets)
    settings = Settings(targets=targets)
    timeout, cap = settings.timeout_seconds, settings.max_response_bytes
    # A tick's scrapes at the fleet's size: 1,000 targets at 5 s, 20 a tick.
    burst = max(1, round(sizes.targets * TICK_SECONDS / FULL.interval_seconds))
    aiohttp.set_zlib_backend(isal_zlib)
    connector = aiohttp.TCPConnector(
        limit=MAX_CONCURRENT_SCRAPES + MAX_CONCURRENT_FAILING_SCRAPES, ttl_dns_cache=300
    )
    async with Connections() as connections, aiohttp.ClientSession(connector=connector) as session:
        sides = {
            "with": lambda t: scrape(connections, t, timeout, cap),
            "without": lambda t: aiohttp_scrape(session, t, timeout, cap),
        }

        async def every_target(side: str) -> tuple[float, list[ScrapeResult]]:
            started = time.process_time()
            results: list[ScrapeResult] = []
            for i in range(0, len(targets), burst):
                results += await asyncio.gather(*map(sides[side], targets[i : i + burst]))
            return time.process_time() - started, results

        for _ in range(3):  # connections opened, and every target at its last variant
            for side in sides:
                await every_target(side)
        times: dict[str, list[float]] = {"with": [], "without": []}
        bodies: dict[str, list[str | None]] = {}
        for repetition in range(sizes.repeats):
            for side in sides if repetition % 2 == 0 else list(sides)[::-1]:
                spent, results = await every_target(side)
                times[side].append(spent)
                bodies[side] = [r.text for r in results]
    identical = bodies["with"] == bodies["without"] and None not in bodies["with"]
    return {"http_client": {"times": (times["with"], times["without"]), "identical": identical}}


# ---------------------------------------------------------------- (f) and (g): the fleet


def fleet_child(spec: dict) -> dict:
    """In the child process: the exporter on the fleet, a block of intervals per mode of
    `spec["blocks"]` after a warm-up block. Each block's CPU and collector time are per
    `targets` evaluations (an interval's work, whether or not the block caught up on a
    backlog), with the evaluations an interval and the collections by generation."""
    targets = spec["targets"]
    settings = Settings(
        targets=fleet_targets(spec["address"], targets), interval_seconds=spec["interval_seconds"]
    )
    exporter = Exporter(settings)
    default = gc_policy.configure()  # as the exporter's cli does before it runs
    policy = gc.get_threshold()
    interval = settings.interval_seconds
    collecting = [0.0, 0.0]  # CPU seconds in collections, and when the current one began

    def timed_collection(phase: str, _info: dict) -> None:
        # A collection runs in the thread that triggered it, callbacks included.
        if phase == "start":
            collecting[1] = time.thread_time()
        else:
            collecting[0] += time.thread_time() - collecting[1]

    gc.callbacks.append(timed_collection)

    def readings() -> tuple[float, float, float, int, list[int]]:
        evaluated = sum(len(state.history) for state in exporter.states.values())
        runs = [generation["collections"] for generation in gc.get_stats()]
        return time.process_time(), time.monotonic(), collecting[0], evaluated, runs

    async def render_every_round() -> None:
        seen = exporter.rounds
        while True:
            seen = await exporter.round_after(seen)
            await asyncio.to_thread(plain_and_gzip, render_metrics, exporter.current())

    async def block(mode: str, settle: int, measure: int) -> dict | None:
        exporter.tick_batching = mode != "tick_batching"
        gc.set_threshold(*(default if mode == "gc_policy" else policy))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(exporter.run_forever(stop))]
        tasks.append(asyncio.create_task(render_every_round()))
        await asyncio.sleep(settle * interval)
        before = readings()
        await asyncio.sleep(measure * interval)
        after = readings()
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not measure:
            return None
        (cpu0, wall0, gc0, evaluated0, runs0), (cpu1, wall1, gc1, evaluated1, runs1) = before, after
        rounds = (evaluated1 - evaluated0) / targets  # an interval's work each
        intervals = (wall1 - wall0) / interval
        return {
            "mode": mode,
            "cpu_per_interval": (cpu1 - cpu0) / rounds,
            "gc_per_interval": (gc1 - gc0) / rounds,
            "collections_per_interval": [
                (b - a) / rounds for a, b in zip(runs0, runs1, strict=True)
            ],
            "evaluations_per_interval": (evaluated1 - evaluated0) / intervals,
            "up": sum(1 for s in exporter.current() if s.up),
        }

    async def blocks() -> list[dict]:
        await block(ALL_ON, spec["warmup_intervals"], 0)
        done = []
        for mode in spec["blocks"]:
            print(f"shortcuts: fleet block {len(done) + 1}: {mode}", file=sys.stderr, flush=True)
            done.append(await block(mode, spec["settle_intervals"], spec["measure_intervals"]))
        return done

    done = asyncio.run(blocks())
    gc.set_threshold(*policy)
    full = statistics.median(cpu(gc.collect)[0] for _ in range(2))
    return {"blocks": done, "full_collection_seconds": full}


def bench_fleet(sizes: Sizes, address: str) -> tuple[dict[str, dict], dict]:
    """(f) and (g) from the child's blocks, and the fleet's CPU with every shortcut on."""
    order = []
    for repetition in range(sizes.fleet_repeats):  # each mode first, middle and last once
        shift = repetition % len(FLEET_MODES)
        order += FLEET_MODES[shift:] + FLEET_MODES[:shift]
    spec = {
        "address": address,
        "targets": sizes.targets,
        "interval_seconds": sizes.interval_seconds,
        "warmup_intervals": sizes.warmup_intervals,
        "settle_intervals": sizes.settle_intervals,
        "measure_intervals": sizes.measure_intervals,
        "blocks": order,
    }
    print(f"shortcuts: (f), (g): the exporter on the fleet, {len(order)} blocks", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, __file__, "--fleet-child", json.dumps(spec)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    child = json.loads(done.stdout)
    # The policy's full collection, every FULL_COLLECTION_SECONDS, wherever the policy is on.
    full = child["full_collection_seconds"]
    full_per_interval = full * sizes.interval_seconds / gc_policy.FULL_COLLECTION_SECONDS

    def of_mode(mode: str, reading: str) -> list[float]:
        return [b[reading] for b in child["blocks"] if b["mode"] == mode]

    with_all = [c + full_per_interval for c in of_mode(ALL_ON, "cpu_per_interval")]
    # Every target up at the end of every block, evaluated about once an interval in it.
    checked = all(
        b["up"] == sizes.targets and b["evaluations_per_interval"] >= 0.8 * sizes.targets
        for b in child["blocks"]
    )
    shortcuts = {
        "gc_policy": {  # the collector's own time: the rest of the process is the same
            "times": (
                [g + full_per_interval for g in of_mode(ALL_ON, "gc_per_interval")],
                of_mode("gc_policy", "gc_per_interval"),
            ),
            "identical": checked,
            "extra": {
                "full_collection_seconds": full,
                "process_cpu_without": statistics.median(of_mode("gc_policy", "cpu_per_interval")),
            },
        },
        "tick_batching": {
            "times": (
                with_all,
                [c + full_per_interval for c in of_mode("tick_batching", "cpu_per_interval")],
            ),
            "identical": checked,
        },
    }
    return shortcuts, {"cpu_per_interval": statistics.median(with_all), "blocks": child["blocks"]}


# ---------------------------------------------------------------- the run


TITLES = {
    "plans": "(a) compiled per-layout adapter plans",
    "id_caches": "(b) id()-keyed series keys (removed)",
    "history_rows": "(c) packed history rows",
    "writer": "(d) the /metrics writer (`render_metrics`)",
    "http_client": "(e) the hand-written HTTP client",
    "gc_policy": "(f) the GC policy",
    "tick_batching": "(g) tick batching of evaluations",
    "c_pass": "(h) the payload reader's C pass (`_known_lines.c`)",
}
APPLIES_TO = {
    "plans": "reading the payloads, one per target",
    "id_caches": "reading the payloads the general way (no plan)",
    "history_rows": "history appends + the 5-minute full collection",
    "writer": "one /metrics body a round",
    "http_client": "fetching every target once (bursts of a tick's scrapes)",
    "gc_policy": "garbage collection in the exporter process",
    "tick_batching": "the exporter process",
    "c_pass": "reading the payloads' values, one per target",
}


def _machine() -> str:
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
            model,
        )
    return f"{len(os.sched_getaffinity(0))}-core {model}"


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def run(quick: bool = False, targets: int | None = None) -> dict:
    """Every shortcut measured with and without it; the numbers of the report."""
    sizes = QUICK if quick else FULL
    if targets is not None:
        sizes = dataclasses.replace(sizes, targets=targets)
    load_before = psutil.getloadavg()
    started = time.monotonic()
    measured = bench_ingest(sizes)
    print(f"shortcuts: evaluating {sizes.targets} targets", file=sys.stderr)
    signals = fleet_signals(sizes.targets)
    measured |= bench_history(sizes, signals)
    measured |= bench_writer(sizes, signals)
    del signals
    gc.collect()
    # Enough variants that the counters still grow through the child's last block.
    blocks = len(FLEET_MODES) * sizes.fleet_repeats
    scrapes = sizes.warmup_intervals + blocks * (sizes.settle_intervals + sizes.measure_intervals)
    with contextlib.ExitStack() as stack:
        print("shortcuts: starting fleet_sim.py", file=sys.stderr)
        _, address = start_simulator(FleetPlan(sizes.targets, scrapes, 5.0), stack)
        fleet_shortcuts, fleet = bench_fleet(sizes, address)
        measured |= fleet_shortcuts
        print("shortcuts: (e) HTTP clients", file=sys.stderr)
        measured |= asyncio.run(_fetch_clients(sizes, address))
    fleet_cpu = fleet["cpu_per_interval"]
    shortcuts = {}
    for key in TITLES:
        entry = measured[key]
        with_times, without_times = entry["times"]
        with_median = statistics.median(with_times)
        without_median = statistics.median(without_times)
        saving = without_median - with_median
        # Where the fleet reaches the shortcut less than once a payload (b), only that share.
        fleet_saving = saving * entry.get("reached", 1.0)
        applied = saving / without_median if without_median else 0.0
        of_fleet = fleet_saving / fleet_cpu
        shortcuts[key] = {
            "title": TITLES[key],
            "applies_to": APPLIES_TO[key],
            "with_seconds": with_times,
            "without_seconds": without_times,
            "with_median_seconds": with_median,
            "without_median_seconds": without_median,
            "ratio": without_median / with_median if with_median else math.inf,
            "saving_of_applied": applied,
            "reached": entry.get("reached", 1.0),
            "saving_of_fleet": of_fleet,
            "pays": applied >= PAYS_OF_APPLIED and of_fleet >= PAYS_OF_FLEET,
            "identical": entry["identical"],
            "extra": entry.get("extra", {}),
        }
    return {
        "targets": sizes.targets,
        "interval_seconds": sizes.interval_seconds,
        "repeats": sizes.repeats,
        "history_points": sizes.history_points,
        "history_repeats": sizes.history_repeats,
        "fleet_repeats": sizes.fleet_repeats,
        "measure_intervals": sizes.measure_intervals,
        "fleet_cpu_per_interval": fleet_cpu,
        "fleet_blocks": fleet["blocks"],
        "shortcuts": shortcuts,
        "load_before": list(load_before),
        "seconds": time.monotonic() - started,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "machine": _machine(),
        "python": platform.python_version(),
        "pays_of_applied": PAYS_OF_APPLIED,
        "pays_of_fleet": PAYS_OF_FLEET,
    }


def _verdict(key: str, row: dict, results: dict) -> str:
    applied, of_fleet = row["saving_of_applied"], row["saving_of_fleet"]
    if row["pays"]:
        return f"yes: saves {applied:.0%} of it, {of_fleet:.1%} of the fleet's CPU"
    if row["reached"] < 1.0:
        return (
            f"no, removed: {applied:.0%} of a general-path read, but reached "
            f"{row['extra']['series_keys_calls_planned']} times an interval at the fleet "
            "(every payload planned)"
        )
    why = []
    if applied < results["pays_of_applied"]:
        why.append(f"saves {applied:.1%} of it (< {results['pays_of_applied']:.0%})")
    if of_fleet < results["pays_of_fleet"]:
        why.append(f"{of_fleet:.1%} of the fleet's CPU (< {results['pays_of_fleet']:.0%})")
    if key == "history_rows":  # what it was written for: memory, not CPU
        why.append(f"but it holds {_history_mib(results):.0f} MiB less")
    return "no: " + ", ".join(why)


def _history_mib(results: dict) -> float:
    """How much more memory the fleet's full histories take as dicts than as rows."""
    history = results["shortcuts"]["history_rows"]["extra"]
    more = history["without"]["point_bytes"] - history["with"]["point_bytes"]
    return results["targets"] * results["history_points"] * more / 2**20


def markdown(results: dict) -> str:
    """The report section: the table, then what each row measured."""
    targets, interval = results["targets"], results["interval_seconds"]
    load = ", ".join(f"{x:.2f}" for x in results["load_before"])
    rows = results["shortcuts"]
    history = rows["history_rows"]["extra"]
    plans = rows["plans"]["extra"]
    fleet = rows["gc_policy"]["extra"]
    lines = [
        f"## Each shortcut, with and without ({targets:,} targets)",
        "",
        "`scripts/bench_shortcuts.py`: every speed shortcut against its plain path in one "
        f"run, as CPU time per {interval:g} s interval of {targets:,} targets: "
        f"{results['repeats']} alternating repetitions of each micro-benchmark (the order "
        f"swapped every repetition; {results['history_repeats']} for (c)) and "
        f"{results['fleet_repeats']} blocks of {results['measure_intervals']} intervals per "
        "mode of the exporter on the fleet, each block's CPU per "
        f"{targets:,} evaluations (an interval's work); medians. A shortcut pays when it saves at least "
        f"{results['pays_of_applied']:.0%} of what it applies to and "
        f"{results['pays_of_fleet']:.0%} of the fleet's CPU "
        f"({results['fleet_cpu_per_interval']:.3f} CPU-s an interval: `Exporter` in one "
        "process on fleet_sim.py with every shortcut on, /metrics rendered and gzipped "
        "once a round). Identical: both sides gave the same series, points, bytes or "
        "bodies (the fleet's blocks: every target up, evaluated about once an interval).",
        "",
        "| shortcut | applies to | with (ms) | without (ms) | ratio | identical "
        "| keeps its code? |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for key, row in rows.items():
        lines.append(
            f"| {row['title']} | {row['applies_to']} | {row['with_median_seconds'] * 1e3:.1f} | "
            f"{row['without_median_seconds'] * 1e3:.1f} | {row['ratio']:.2f}x | "
            f"{'yes' if row['identical'] else 'NO'} | {_verdict(key, row, results)} |"
        )
    points = targets * results["history_points"]
    lines += [
        "",
        "What each row measured:",
        "",
        "- (a) `read_series(text, 'vllm', None, 'e2e')` on one fleet_sim payload per "
        "target, every layout with its plan, against the same layout read the general way "
        "(`promtext.read_values`, `samples_of`, `series_of`). Compiling a plan costs "
        f"{plans['compile_one_layout_seconds'] * 1e3:.1f} ms once per layout (two reads "
        "of a new layout).",
        "- (b) that general-path read with the removed cache (keys by the labels dict's "
        "id, `id_keyed_series_keys` in this script) in place of `grouping.series_keys`, "
        "and with `grouping.series_keys` (`series_key` of each sample). Calls of "
        f"`series_keys` an interval: {rows['id_caches']['extra']['series_keys_calls_unplanned']} "
        f"on the general path, {rows['id_caches']['extra']['series_keys_calls_planned']} "
        "with plans: only a payload no plan can read (an adapter in UNPLANNED, a "
        "non-finite value, a layout's first two scrapes) reaches it.",
        f"- (c) {points:,} points held ({results['history_points']} a target) under the "
        "GC policy's thresholds: an interval's appends "
        f"({history['with']['appends_seconds'] * 1e3:.1f} ms as rows, "
        f"{history['without']['appends_seconds'] * 1e3:.1f} ms as dicts) plus a full "
        f"collection ({history['with']['full_collection_seconds'] * 1e3:.0f} ms, "
        f"{history['without']['full_collection_seconds'] * 1e3:.0f} ms) every "
        f"{gc_policy.FULL_COLLECTION_SECONDS:g} s. Memory a point (containers and numbers): "
        f"{history['with']['point_bytes']} bytes as a row, "
        f"{history['without']['point_bytes']} as a dict, "
        f"{_history_mib(results):.0f} MiB more for the fleet; objects the collector walks a point: "
        f"{history['with']['tracked_per_point']} and {history['without']['tracked_per_point']}.",
        "- (d) one /metrics body of the targets' signals (3 scrapes each, as the render "
        "section) by `render_metrics` and by generate_latest over `SignalsCollector`.",
        "- (e) every target fetched once, gzip, keep-alive, by `fetch.scrape` over "
        "`Connections` and by an `aiohttp.ClientSession` (2137ba4's connector; aiohttp "
        "inflates with ISA-L too, `aiohttp.set_zlib_backend`, and caps only the declared "
        "length, so its side does a little less). CPU of the fetching process only.",
        "- (f) the collector's own CPU time (`gc.callbacks`, in the thread collecting): "
        "CPython's default thresholds (700, 10, 10; the objects of the start still "
        "frozen, as the policy left them) against the policy, whose full collection "
        f"({fleet['full_collection_seconds'] * 1e3:.0f} ms at the end) is added once per "
        f"{gc_policy.FULL_COLLECTION_SECONDS:g} s (the process's CPU with the default "
        f"thresholds: {fleet['process_cpu_without']:.3f} CPU-s an interval). "
        "(g) the process's CPU with `Exporter(tick_batching=False)` (phases off the tick "
        "grid, each scrape evaluated as it ends) against the default.",
        "- (h) `promtext.read_values` on one fleet_sim payload per target, each layout's "
        "template kept, which the C pass reads (`exporter/ingest/_known_lines.c`: the "
        "lines found, their heads held to the template, the values read), against the "
        "Python path alone (the selection regex, `_known_values`): the same layouts and "
        "values. (a) counts it on both sides.",
        "",
        "| block | shortcut off | CPU-s an interval | collector CPU-s | collections "
        "(generations 0/1/2) | evaluations an interval | up |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for i, b in enumerate(results["fleet_blocks"], 1):
        mode = "none" if b["mode"] == ALL_ON else b["mode"]
        runs = "/".join(f"{n:.1f}" for n in b["collections_per_interval"])
        lines.append(
            f"| {i} | {mode} | {b['cpu_per_interval']:.3f} | {b['gc_per_interval']:.3f} | "
            f"{runs} | {b['evaluations_per_interval']:.0f} | {b['up']} |"
        )
    lines += [
        "",
        f"Command: `.venv/bin/python scripts/bench.py --only shortcuts`. Date: "
        f"{results['date']}, commit {results['commit']}, {results['machine']}, Python "
        f"{results['python']}; {results['seconds'] / 60:.1f} minutes. Load average before "
        f"the run: {load}; the machine is shared with other work, which the medians of "
        "alternating repetitions and CPU time (not wall time) keep out of the comparisons "
        "but not out of the absolute numbers.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 targets: a smoke run")
    parser.add_argument("--targets", type=int, help=f"targets (default {FULL.targets})")
    parser.add_argument("--output", type=Path, help="write the report section here too")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--fleet-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fleet_child is not None:
        print(json.dumps(fleet_child(json.loads(args.fleet_child))))
        return 0
    numbers = run(args.quick, args.targets)
    report = markdown(numbers)
    print(report)
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    return 0 if all(row["identical"] for row in numbers["shortcuts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
