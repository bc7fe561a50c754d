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

`--fleet COMMIT ...` times instead what a scrape round costs a fleet, per target: each
of `--targets` targets' scrape read and evaluated as the scrape loop does it
(`Exporter.evaluate`: the payload read, the window evaluated, the history row kept),
then the round's /metrics body rendered and gzipped, on this checkout and on each
commit's code (since the exporter's packages: `Exporter.evaluate` of a ScrapeResult),
all in one process, every round run by each in turn (the order rotates every round),
CPU time (process_time): ratios of each to the first and to the one before, as
medians of the rounds' ratios, which a loaded machine leaves standing where it moves
the absolute times. The /metrics bodies must be the same bytes every round. With
`--profile`, cProfile of this checkout's rounds instead.

    .venv/bin/python scripts/bench_evaluation.py --fleet main [HEAD~1 ...] [--rounds 60]
    .venv/bin/python scripts/bench_evaluation.py --fleet --profile [--sort cumulative]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
# This checkout's `exporter`, wherever the environment's install points.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baseline import ROOT, import_at, same_as_baseline  # noqa: E402
from bench_parser import Comparison  # noqa: E402
from fleet_sim import FIXTURE, Template  # noqa: E402

from batchscope.exporter.config import settings as config
from batchscope.exporter.core.snapshot import Snapshot  # noqa: E402
from batchscope.exporter.engines import read_series  # noqa: E402
from batchscope.exporter.scrape import gc_policy  # noqa: E402
from batchscope.exporter.scrape import loop as runtime  # noqa: E402
from batchscope.exporter.serve import app  # noqa: E402

BASELINE = "2137ba4"
TARGET_RATIO = 3.0
INTERVAL_S = 5.0
REPETITIONS = 300
QUICK_REPETITIONS = 20
TARGET_SETTINGS = {"engine": "vllm", "cap": 256.0, "budget_seconds": 1.0}
# As the exporter reads such a target's payload: its engine, no sample limit, its histogram.
READ = ("vllm", None, "e2e")


def load_baseline(commit: str) -> tuple[ModuleType, ModuleType]:
    """`batchscope.exporter.scrape.loop` and `batchscope.exporter.config.settings` as of `commit`, imported beside this
    checkout's."""
    runtime_then, config_then = import_at(
        commit, "batchscope.exporter.scrape.loop", "batchscope.exporter.config.settings"
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


# ---------------------------------------------------------------- --fleet: a round's cost

# The modules a fleet round runs, from a commit's code or this checkout's.
ROUND_MODULES = (
    "batchscope.exporter.scrape.loop",
    "batchscope.exporter.config.settings",
    "batchscope.exporter.scrape.fetch",
    "batchscope.exporter.serve.exposition",
)
THIS_CHECKOUT = "this checkout"
# Rounds that fill the window (13 scrapes of the default 60 s) before any is timed.
FLEET_WARMUP_ROUNDS = 14


def fleet_round(modules: Sequence[ModuleType], targets: int) -> Callable:
    """A function of (payloads, round) that reads and evaluates every target's payload as
    the scrape loop does, then renders and gzips /metrics; it returns the CPU seconds of
    the two and the body."""
    loop, settings, fetch_module, exposition_module = modules
    fleet = tuple(
        settings.Target(f"t{i}", f"http://127.0.0.1:9/t/{i}/metrics", **TARGET_SETTINGS)
        for i in range(targets)
    )
    exporter = loop.Exporter(settings.Settings(targets=fleet, interval_seconds=INTERVAL_S))
    states = [exporter.states[f"t{i}"] for i in range(targets)]
    result = fetch_module.ScrapeResult

    def one_round(payloads: list[str], n: int) -> tuple[float, float, bytes]:
        started = time.process_time()
        for state, payload in zip(states, payloads, strict=True):
            exporter.evaluate(state, result(payload, None, 0.01), 1000.0 + INTERVAL_S * n)
        evaluated = time.process_time()
        body = exposition_module.render_metrics(exporter.current())
        app.gzip_body(body)
        return evaluated - started, time.process_time() - evaluated, body

    return one_round


def fleet_payloads(targets: int, rounds: int) -> Iterator[list[str]]:
    """Each round's payloads: fleet_sim's target i at its n-th scrape."""
    template = Template(FIXTURE.read_text(encoding="utf-8"))
    rng = random.Random(0)
    for n in range(rounds):
        yield [template.render(i, n, rng) for i in range(targets)]


def compare_rounds(commits: list[str], targets: int, rounds: int) -> list[str]:
    """The report of this checkout and each commit run round by round in turn."""
    versions: dict[str, Sequence[ModuleType]] = {}
    for commit in commits:
        short = subprocess.run(
            ["git", "rev-parse", "--short", commit], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        versions[f"{commit} ({short})"] = import_at(short, *ROUND_MODULES)
    versions[THIS_CHECKOUT] = [importlib.import_module(name) for name in ROUND_MODULES]
    names = list(versions)
    sides = {name: fleet_round(modules, targets) for name, modules in versions.items()}
    gc_policy.configure()  # as the exporter runs
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    same = True
    for n, payloads in enumerate(fleet_payloads(targets, FLEET_WARMUP_ROUNDS + rounds)):
        turn = n % len(names)
        bodies = set()
        for name in names[turn:] + names[:turn]:
            evaluate, render, body = sides[name](payloads, n)
            bodies.add(body)
            if n >= FLEET_WARMUP_ROUNDS:
                times[name].append((evaluate, render))
        same = same and len(bodies) == 1
    lines = [
        f"{targets} targets, {rounds} rounds; CPU per target, medians; ratios: medians of "
        f"the rounds' (read + evaluate + /metrics); identical /metrics bodies: {same}"
    ]
    for index, name in enumerate(names):
        mine = times[name]
        line = (
            f"{name}: evaluate {statistics.median(t[0] for t in mine) / targets * 1e6:.0f} us, "
            f"/metrics {statistics.median(t[1] for t in mine) / targets * 1e6:.0f} us"
        )
        for against in dict.fromkeys((names[0], names[max(0, index - 1)])):
            if against != name:
                ratios = [sum(a) / sum(b) for a, b in zip(mine, times[against], strict=True)]
                line += f"; {statistics.median(ratios):.3f}x {against}"
        lines.append(line)
    return lines


def profile_rounds(targets: int, rounds: int, sort: str) -> None:
    """cProfile of this checkout's rounds, after the window is full."""
    one_round = fleet_round([importlib.import_module(name) for name in ROUND_MODULES], targets)
    gc_policy.configure()
    profile = cProfile.Profile()
    for n, payloads in enumerate(fleet_payloads(targets, FLEET_WARMUP_ROUNDS + rounds)):
        if n >= FLEET_WARMUP_ROUNDS:
            profile.enable()
        one_round(payloads, n)
        profile.disable()
    pstats.Stats(profile).sort_stats(sort).print_stats(40)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few repetitions: a smoke run")
    parser.add_argument("--output", type=Path, help="write the report section here")
    parser.add_argument(
        "--fleet", nargs="*", metavar="COMMIT", help="a round's cost against these commits'"
    )
    parser.add_argument("--targets", type=int, default=100, help="--fleet: targets a round")
    parser.add_argument("--rounds", type=int, default=60, help="--fleet: rounds timed")
    parser.add_argument("--profile", action="store_true", help="--fleet: cProfile this checkout")
    parser.add_argument("--sort", choices=("tottime", "cumulative"), default="tottime")
    args = parser.parse_args(argv)
    if args.fleet is not None:
        if args.profile:
            profile_rounds(args.targets, args.rounds, args.sort)
        else:
            print("\n".join(compare_rounds(args.fleet, args.targets, args.rounds)))
        return 0
    numbers = results(run(args.quick))
    report = markdown(numbers)
    print(report)
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    return 0 if numbers["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
