"""Per-scrape evaluation benchmark: `Exporter.ingest` now against the baseline commit.

One scrape of one target costs the exporter an `ingest`: the snapshot enters the window,
every signal of the target is evaluated over the window, and a history point is kept.
This times it on the code of this checkout and on the code of `BASELINE` (its `exporter`
package taken from git and imported beside this one), in the same process, fed the
same snapshots: interleaved repetitions (the order swaps every repetition), medians, and
the ratio of the medians. Every output timed is checked: both sides' TargetSignals must
hold the same values, field by field.

The snapshots are the real vLLM 0.32 payload (`tests/fixtures/vllm-0.32.0-cpu-load.txt`)
as `scripts/fleet_sim.py` varies it, counters growing and gauges moving on every scrape,
read with `read_series` as the exporter reads them, 5 s apart, into the default 60 s window (13
scrapes), with the
fleet benchmark's target settings (engine vllm, cap 256, budget 1 s). Variants: the
payload's one model series, and two model series in one target (the total then merges
them on every scrape).

    .venv/bin/python scripts/bench_evaluation.py [--quick] [--output report.md]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import import_at, same_as_baseline  # noqa: E402
from bench_parser import Comparison  # noqa: E402
from fleet_sim import FIXTURE, Template  # noqa: E402

from exporter.config import settings as config
from exporter.core.snapshot import Snapshot  # noqa: E402
from exporter.engines import read_series  # noqa: E402
from exporter.scrape import loop as runtime  # noqa: E402

BASELINE = "2137ba4"
TARGET_RATIO = 3.0
INTERVAL_S = 5.0
REPETITIONS = 300
QUICK_REPETITIONS = 20
TARGET_SETTINGS = {"engine": "vllm", "cap": 256.0, "budget_seconds": 1.0}
# As the exporter reads such a target's payload: its engine, no sample limit, its histogram.
READ = ("vllm", None, "e2e")


def load_baseline(commit: str) -> tuple[ModuleType, ModuleType]:
    """`exporter.scrape.loop` and `exporter.config.settings` as of `commit`, imported beside this
    checkout's."""
    runtime_then, config_then = import_at(
        commit, "exporter.scrape.loop", "exporter.config.settings"
    )
    return runtime_then, config_then


def fleet_scrapes(targets: list[int], scrapes: int) -> list[Snapshot]:
    """Successive scrapes, INTERVAL_S apart, of one target holding the series of these
    fleet_sim targets (one model each)."""
    template = Template(FIXTURE.read_text(encoding="utf-8"))
    rng = random.Random(0)
    return [
        Snapshot(
            "bench",
            1000.0 + INTERVAL_S * n,
            True,
            tuple(s for i in targets for s in read_series(template.render(i, n, rng), *READ)),
        )
        for n in range(scrapes)
    ]


def exporter_of(runtime_module: ModuleType, config_module: ModuleType) -> tuple[Callable, object]:
    """An `ingest` of one target on that code, and the target's state."""
    target = config_module.Target("bench", "http://127.0.0.1/metrics", **TARGET_SETTINGS)
    exporter = runtime_module.Exporter(config_module.Settings(targets=(target,)))
    return exporter.ingest, exporter.states["bench"]


def compare(
    variant: str, snapshots: list[Snapshot], warmup: int, old_code
) -> tuple[Comparison, int]:
    """Both sides ingest the same scrapes, alternately first; the first `warmup` fill the
    window untimed. `fast_seconds` are this checkout's, `reference_seconds` BASELINE's.
    Also returns the scrapes in the window at the end."""
    new_ingest, new_state = exporter_of(runtime, config)
    old_ingest, old_state = exporter_of(*old_code)
    new_times: list[float] = []
    old_times: list[float] = []
    identical = True
    for n, snapshot in enumerate(snapshots):
        sides = [(new_ingest, new_state, new_times), (old_ingest, old_state, old_times)]
        outputs = {}
        for ingest, state, times in sides if n % 2 else sides[::-1]:
            started = time.perf_counter()
            outputs[id(times)] = ingest(state, snapshot, snapshot.t)
            if n >= warmup:
                times.append(time.perf_counter() - started)
        identical = identical and same_as_baseline(outputs[id(new_times)], outputs[id(old_times)])
    in_window = len(new_state.window.snapshots())
    return Comparison(variant, BASELINE, new_times, old_times, identical), in_window


def run(quick: bool = False) -> list[tuple[Comparison, int]]:
    """Both variants, each with the scrapes in its window."""
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    old_code = load_baseline(BASELINE)
    warmup = int(config.Settings(targets=()).window_seconds / INTERVAL_S) + 3
    comparisons = []
    for variant, targets in (("one model series", [3]), ("two model series", [3, 4])):
        print(f"evaluation: {variant} x{repetitions}", file=sys.stderr, flush=True)
        snapshots = fleet_scrapes(targets, warmup + repetitions)
        comparisons.append(compare(variant, snapshots, warmup, old_code))
    return comparisons


def results(comparisons: list[tuple[Comparison, int]]) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them."""
    return {
        "baseline": BASELINE,
        "target_ratio": TARGET_RATIO,
        "repetitions": len(comparisons[0][0].fast_seconds) if comparisons else 0,
        "variants": [{**c.numbers(), "scrapes_in_window": n} for c, n in comparisons],
        "identical": all(c.identical for c, _ in comparisons),
    }


def markdown(results: dict) -> str:
    """The report section of `results`: one row per variant, medians in microseconds."""
    repetitions = results["repetitions"]
    lines = [
        f"## Evaluation per scrape: `Exporter.ingest` vs {BASELINE}",
        "",
        "One scrape of one target: the snapshot enters the window, every signal of the "
        "target (its series and its total) is evaluated, a history point is kept. "
        f"This checkout against the `exporter` package of {BASELINE} (from git), in one "
        f"process, {repetitions} interleaved repetitions per variant, fed the same "
        "snapshots: the real vLLM 0.32 payload as `fleet_sim.py` varies it (counters "
        "growing, gauges moving), 5 s apart, in the default 60 s window, target settings "
        "as the fleet benchmark's (vllm, cap 256, budget 1 s). Identical: every "
        "TargetSignals timed holds the same values on both sides.",
        "",
        f"| variant | now median (µs) | {BASELINE} median (µs) | ratio of medians | "
        f"identical | >= {TARGET_RATIO:g}x |",
        "|---|---:|---:|---:|---|---|",
    ]
    for c in results["variants"]:
        lines.append(
            f"| {c['variant']} ({c['scrapes_in_window']} scrapes in window) | "
            f"{c['fast_median_seconds'] * 1e6:.0f} | {c['reference_median_seconds'] * 1e6:.0f} | "
            f"{c['ratio']:.1f}x | {'yes' if c['identical'] else 'NO'} | "
            f"{'met' if c['ratio'] >= TARGET_RATIO else 'missed'} |"
        )
    lines += ["", f"Identical in every variant: {results['identical']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few repetitions: a smoke run")
    parser.add_argument("--output", type=Path, help="write the report section here")
    args = parser.parse_args(argv)
    numbers = results(run(args.quick))
    report = markdown(numbers)
    print(report)
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    return 0 if numbers["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
