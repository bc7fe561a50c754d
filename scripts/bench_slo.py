"""SLO benchmark: what an objective costs the exporter, in memory and per scrape.

Memory: one series' `SloHistory` (exporter/core/slo.py) fed a latency histogram every
5 s for 3.5 days, past the longest burn window (3 days) and a 3-day compliance period:
its checkpoints (the bound is 6 windows x 32) and the bytes it holds at the end, by
tracemalloc (the objects allocated while it was filled that are still alive).

Per scrape: `Exporter.ingest` of one target with `slo_objective` set and without, side by
side in one process on the same scrapes (bench_evaluation.py's: the real vLLM 0.32
payload as fleet_sim.py varies it, 5 s apart, budget 1 s), interleaved, medians. The
objective adds the history's count at each scrape and the burn rates at each evaluation.
Checked: with the objective's status set aside, both sides' signals are equal.

    .venv/bin/python scripts/bench_slo.py   (or scripts/bench.py --only slo)
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_evaluation import INTERVAL_S, TARGET_SETTINGS, fleet_scrapes  # noqa: E402
from bench_parser import Comparison  # noqa: E402

from batchscope.exporter.config.settings import Settings, Target  # noqa: E402
from batchscope.exporter.core.evaluate import TargetSignals  # noqa: E402
from batchscope.exporter.core.histogram import Histogram  # noqa: E402
from batchscope.exporter.core.slo import RESOLUTION, SloHistory, history_windows  # noqa: E402
from batchscope.exporter.engines.vllm import REQUEST_LATENCY_BUCKETS  # noqa: E402
from batchscope.exporter.scrape.loop import Exporter  # noqa: E402

HISTORY_DAYS = 3.5
PERIOD_SECONDS = 3 * 86400.0
REPETITIONS = 300
QUICK_REPETITIONS = 20
OBJECTIVE = 0.99


def history_memory(days: float) -> dict:
    """Checkpoints and bytes of one series' SLO history after `days` of scrapes."""
    bounds = (*REQUEST_LATENCY_BUCKETS, float("inf"))
    windows = history_windows(1.0, PERIOD_SECONDS)
    gc.collect()
    tracemalloc.start()
    history = SloHistory(windows)
    most = 0
    scrapes = int(days * 86400 / INTERVAL_S)
    for n in range(scrapes):
        requests = 10.0 * INTERVAL_S * n
        counts = tuple(requests * min(1.0, b / 2.5) for b in bounds)
        history.observe(INTERVAL_S * n, Histogram(bounds, counts, 0.0, requests), 2.0)
        most = max(most, history.checkpoints())
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "days": days,
        "scrapes": scrapes,
        "windows": len(windows),
        "bound": len(windows) * (RESOLUTION + 2),
        "most_checkpoints": most,
        "bytes": held,
    }


def _without_slo(signals: TargetSignals) -> TargetSignals:
    def plain(series):
        return dataclasses.replace(series, slo=None)

    return dataclasses.replace(
        signals, series=tuple(plain(s) for s in signals.series), total=plain(signals.total)
    )


def ingest_cost(repetitions: int) -> Comparison:
    """Per-scrape ingest with an objective (`fast_seconds`) and without (`reference_seconds`)."""
    sides = []
    for objective in (OBJECTIVE, None):
        target = Target(
            "bench", "http://127.0.0.1/metrics", **TARGET_SETTINGS, slo_objective=objective
        )
        exporter = Exporter(Settings(targets=(target,)))
        sides.append((exporter.ingest, exporter.states["bench"], []))
    warmup = int(Settings(targets=()).window_seconds / INTERVAL_S) + 3
    identical = True
    for n, snapshot in enumerate(fleet_scrapes([3], warmup + repetitions)):
        outputs = []
        for ingest, state, times in sides if n % 2 else sides[::-1]:
            started = time.perf_counter()
            outputs.append(ingest(state, snapshot, snapshot.t))
            if n >= warmup:
                times.append(time.perf_counter() - started)
        with_slo, without = outputs if n % 2 else outputs[::-1]
        identical = identical and _without_slo(with_slo) == without
    (_, _, with_times), (_, _, without_times) = sides
    return Comparison("one model series", "no objective", with_times, without_times, identical)


def run(quick: bool = False) -> dict:
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    days = 1.0 if quick else HISTORY_DAYS
    print(f"slo: a history of {days:g} days at {INTERVAL_S:g} s", file=sys.stderr, flush=True)
    memory = history_memory(days)
    print(f"slo: ingest with and without an objective x{repetitions}", file=sys.stderr, flush=True)
    return {"memory": memory, "ingest": ingest_cost(repetitions)}


def results(measured: dict) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them."""
    return {"memory": measured["memory"], "ingest": measured["ingest"].numbers()}


def markdown(results: dict) -> str:
    memory, ingest = results["memory"], results["ingest"]
    return "\n".join(
        [
            "## SLO: what an objective costs (memory, per scrape)",
            "",
            f"One series' `SloHistory` fed a histogram every {INTERVAL_S:g} s for "
            f"{memory['days']:g} days ({memory['scrapes']} scrapes; burn windows up to 3 days "
            f"and a 3-day period): at most {memory['most_checkpoints']} checkpoints at once "
            f"(bound {memory['bound']}: {memory['windows']} windows x {RESOLUTION + 2}), "
            f"{memory['bytes'] / 1024:.1f} KiB held at the end (tracemalloc): "
            f"{memory['bytes'] * 1000 / 2**20:.0f} MiB for 1,000 one-series targets.",
            "",
            f"`Exporter.ingest` of one target (the fleet benchmark's vLLM payload, {INTERVAL_S:g} s "
            f"apart, budget 1 s), {ingest['repetitions']} interleaved repetitions, medians: "
            f"{ingest['fast_median_seconds'] * 1e6:.0f} µs with `slo_objective: {OBJECTIVE}`, "
            f"{ingest['reference_median_seconds'] * 1e6:.0f} µs without "
            f"({1 / ingest['ratio']:.2f}x). Signals equal with the objective's status set "
            f"aside: {'yes' if ingest['identical'] else 'NO'}.",
            "",
        ]
    )


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--output", type=Path, help="write the report section here")
    args = parser.parse_args()
    text = markdown(results(run(args.quick)))
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
