"""History memory: 1,000 one-series targets after a synthesized hour (720 points each).

The rows are real: four targets (DISTINCT) each ingest 720 scrapes, 5 s apart, of the real vLLM
0.32 payload as fleet_sim.py varies it (its running, waiting and KV usage drawn anew at
every scrape, so the numbers said in each diagnosis reason change at almost every
point: the worst case for keeping a reason once per change of its words), and every
evaluation's row is kept (`api.history_row`, as the exporter keeps it). An exporter of
1,000 such targets then ingests a window's worth of scrapes each, and each target's
history is filled with one distinct target's hour of rows.

Measured, in this process of its own: the bytes the 1,000 histories hold (tracemalloc:
what was allocated while they were filled and is still alive), per target and per
point; the same for the rows kept as they were before (a deque of row tuples, each
with its own reason string), on 100 targets; the process's RSS at the end; and how long
a full collection of the process takes then (the exporter runs one every 5 minutes,
exporter/scrape/gc_policy.py: the pause a `/metrics` request could wait behind).
Targets: history <= 120 MiB, RSS < 300 MiB.

    .venv/bin/python scripts/bench_history.py   (or scripts/bench.py --only history)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_evaluation import INTERVAL_S, TARGET_SETTINGS, fleet_scrapes  # noqa: E402

from batchscope.exporter.config.settings import Settings, Target  # noqa: E402
from batchscope.exporter.core.snapshot import Snapshot  # noqa: E402
from batchscope.exporter.scrape import gc_policy  # noqa: E402
from batchscope.exporter.scrape.loop import Exporter  # noqa: E402
from batchscope.exporter.serve.api_json import HistoryRow  # noqa: E402
from batchscope.exporter.serve.history import History  # noqa: E402

TARGETS = 1000
POINTS = 720
DISTINCT = 4
BEFORE_TARGETS = 100
HISTORY_TARGET_MIB = 120
RSS_TARGET_MIB = 300
MIB = 2**20
FULL_COLLECTIONS = 5


def hour_of_rows(target: int, points: int) -> list[HistoryRow]:
    """The history rows of one fleet_sim target over `points` scrapes."""
    settings = Settings(targets=(Target("bench", "http://h/metrics", **TARGET_SETTINGS),))
    exporter = Exporter(settings)
    state = exporter.states["bench"]
    state.history = History(points)
    for snapshot in fleet_scrapes([target], points):
        exporter.ingest(state, snapshot, snapshot.t)
    return list(state.history)


def fleet(targets: int) -> Exporter:
    """An exporter of `targets` vLLM targets, each with a full window of scrapes."""
    settings = Settings(
        targets=tuple(
            Target(f"t{i}", f"http://h/t/{i}/metrics", **TARGET_SETTINGS) for i in range(targets)
        ),
        history_points=POINTS,
    )
    exporter = Exporter(settings)
    snapshots = fleet_scrapes(list(range(8)), int(settings.window_seconds / INTERVAL_S) + 1)
    for i, state in enumerate(exporter.states.values()):
        for snapshot in snapshots:
            one = snapshot.series[i % 8 : i % 8 + 1]
            exporter.ingest(state, Snapshot(state.target.name, snapshot.t, True, one), snapshot.t)
    return exporter


def held_while(fill) -> int:
    """Bytes allocated by `fill()` and still alive after it (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    kept = fill()
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept
    return held


def as_before(rows: list[HistoryRow], targets: int) -> list[deque]:
    """The rows kept as before: a deque of tuples a target, each row its own objects."""
    histories = []
    for _ in range(targets):
        history: deque = deque(maxlen=POINTS)
        for t, up, packed, state, reason, series in rows:
            copy = (t + 0.0, up, bytes(bytearray(packed)), state, reason.encode().decode(), series)
            history.append(copy)
        histories.append(history)
    return histories


def run(quick: bool = False) -> dict:
    targets = 100 if quick else TARGETS
    points = 120 if quick else POINTS
    gc_policy.configure()  # as the exporter starts: what is loaded so far frozen
    print(f"history: {DISTINCT} targets x {points} scrapes", file=sys.stderr, flush=True)
    hours = [hour_of_rows(k, points) for k in range(DISTINCT)]
    print(f"history: {targets} targets' windows and histories", file=sys.stderr, flush=True)
    exporter = fleet(targets)
    states = list(exporter.states.values())

    def fill() -> None:
        for i, state in enumerate(states):
            history = state.history
            for row in hours[i % DISTINCT]:
                history.append(row)

    held = held_while(fill)
    changes = sum(state.history.changes_kept() for state in states)
    before_targets = min(BEFORE_TARGETS, targets)
    before = held_while(lambda: as_before(hours[0], before_targets))
    gc.collect()
    rss = psutil.Process().memory_info().rss
    pauses = []
    for _ in range(FULL_COLLECTIONS):
        started = time.perf_counter()
        gc.collect()
        pauses.append(time.perf_counter() - started)
    return {
        "full_collection_seconds": statistics.median(pauses),
        "tracked_objects": len(gc.get_objects()),
        "targets": targets,
        "points": points,
        "held_bytes": held,
        "changes": changes,
        "before_targets": before_targets,
        "before_bytes": before,
        "rss_bytes": rss,
        "reasons_distinct": len({row[4] for row in hours[0]}),
    }


def markdown(r: dict) -> tuple[str, bool]:
    rows = r["targets"] * r["points"]
    held_mib = r["held_bytes"] / MIB
    before_per_point = r["before_bytes"] / (r["before_targets"] * r["points"])
    met_history = held_mib <= HISTORY_TARGET_MIB
    met_rss = r["rss_bytes"] / MIB < RSS_TARGET_MIB
    text = (
        f"## History memory ({r['targets']} one-series targets, {r['points']} points each)\n\n"
        f"{__doc__.split(chr(10) + chr(10))[1]}\n\n"
        f"Reasons: {r['reasons_distinct']} distinct of a target's {r['points']} points; the "
        f"{r['targets']} histories keep {r['changes']} changes of wording in all.\n\n"
        "| measure | value | target | met |\n|---|---|---|---|\n"
        f"| history, {r['targets']} targets | {held_mib:.1f} MiB | <= {HISTORY_TARGET_MIB} MiB "
        f"| {'yes' if met_history else 'no'} |\n"
        f"| per target | {r['held_bytes'] / r['targets'] / 1024:.1f} KiB | | |\n"
        f"| per point | {r['held_bytes'] / rows:.0f} B | | |\n"
        f"| per point, rows kept as a deque of tuples ({r['before_targets']} targets) | "
        f"{before_per_point:.0f} B | | |\n"
        f"| process RSS at the end | {r['rss_bytes'] / MIB:.0f} MiB | < {RSS_TARGET_MIB} MiB "
        f"| {'yes' if met_rss else 'no'} |\n"
        f"| a full collection (`gc.collect()`), median of {FULL_COLLECTIONS} | "
        f"{r['full_collection_seconds'] * 1e3:.0f} ms over {r['tracked_objects']} objects "
        "the collector walks | | |\n\n"
        f"Interval {INTERVAL_S:.0f} s. Command: `.venv/bin/python scripts/bench_history.py` "
        "(or `scripts/bench.py --only history`).\n"
    )
    return text, met_history and met_rss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    text, met = markdown(run(args.quick))
    args.output.write_text(text, encoding="utf-8")
    print(text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
