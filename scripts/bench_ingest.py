"""Ingest benchmark: `read_series` now against the same function at an older commit.

The exporter turns every scraped payload into series with `read_series(text, engine,
sample_limit, histogram)`. This times that call on the real vLLM 0.32 payloads (every
vLLM fixture) and on `fleet_sim.py`'s variants of the load payload (each target its
own model name, counters that grow and gauges that move on every scrape), against the
code of BASELINE_COMMIT, both in this process: the baseline's `exporter` package is
extracted with `git archive` and imported before this checkout's. Repetitions are
interleaved (the order swaps every repetition) and the ratio is the ratio of the
medians. Every input timed is also checked: both sides must return equal series,
field by field (repr of every value, so NaN equals NaN and -0.0 differs from 0.0).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from baseline import import_at, same_as_baseline
from bench_parser import Comparison, compare
from fleet_sim import Template

from batchscope.exporter.engines import clear_caches, read_series

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures"
LOAD = FIXTURES / "vllm-0.32.0-cpu-load.txt"
# The last commit before the ingest path was reworked for the fleet (issue 12).
BASELINE_COMMIT = "2137ba4"
TARGET_RATIO = 3.0
REPETITIONS = 200
QUICK_REPETITIONS = 10
FLEET_TARGETS = 40
FLEET_SCRAPES = 3
# The exporter's default `histogram` for a target: it reads e2e and no other latency.
HISTOGRAM = "e2e"

ReadSeries = Callable[..., tuple]


def load_baseline(commit: str) -> tuple[ReadSeries, ModuleType]:
    """`read_series` and `promtext` of `commit`, imported beside this checkout's modules."""
    engines, old_promtext = import_at(
        commit, "batchscope.exporter.engines", "batchscope.exporter.ingest.promtext"
    )
    return engines.read_series, old_promtext


def attempt(read: ReadSeries, text: str, histogram: str | None) -> tuple | ValueError:
    """What `read` makes of a vLLM payload: its series, or the error it raised."""
    try:
        return read(text, "vllm", None, histogram)
    except ValueError as err:  # every error read_series raises is one
        return err


def attempt_text(read: ReadSeries, text: str, histogram: str | None) -> object:
    """`attempt`, with an error as its class name and message (the two commits' error
    classes differ): what `same_as_baseline` compares."""
    result = attempt(read, text, histogram)
    if isinstance(result, ValueError):
        return f"{type(result).__name__}: {result}"
    return result


def fixture_payloads() -> dict[str, str]:
    """Every vLLM fixture, by file name."""
    return {
        path.name: path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("vllm-*.txt"))
    }


def fleet_payloads(targets: int = FLEET_TARGETS, scrapes: int = FLEET_SCRAPES) -> list[str]:
    """`scrapes` successive payloads of each of `targets` simulated servers, as
    fleet_sim.py serves them (scrape-major: one round over the targets, then the next)."""
    template = Template(LOAD.read_text(encoding="utf-8"))
    rng = random.Random(0)
    return [template.render(t, n, rng) for n in range(scrapes) for t in range(targets)]


def run(quick: bool = False) -> tuple[list[Comparison], dict]:
    """Each variant timed against the baseline, and the repetitions and payloads per
    variant (a repetition reads each of its payloads once)."""
    old_read_series, old_promtext = load_baseline(BASELINE_COMMIT)
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    fixtures = fixture_payloads()
    fleet = fleet_payloads()
    load = fixtures[LOAD.name]

    def same(texts: list[str], histogram: str | None) -> bool:
        return all(
            same_as_baseline(
                attempt_text(read_series, t, histogram), attempt_text(old_read_series, t, histogram)
            )
            for t in texts
        )

    def clear_both_caches() -> None:
        clear_caches()
        old_promtext._LABEL_CACHE.clear()

    def variant(name: str, texts: list[str], histogram: str | None, cold: bool) -> Comparison:
        print(f"ingest: {name} x{repetitions}", file=sys.stderr, flush=True)
        identical = same(texts, histogram)
        return compare(
            name,
            f"{BASELINE_COMMIT} read_series",
            lambda: [attempt(read_series, t, histogram) for t in texts],
            lambda: [attempt(old_read_series, t, histogram) for t in texts],
            repetitions,
            identical,
            clear_both_caches if cold else None,
        )

    comparisons = [
        variant("(a) load payload, histogram e2e, warm", [load], HISTOGRAM, cold=False),
        variant(
            f"(b) fleet_sim: {len(fleet)} payloads of {FLEET_TARGETS} targets, warm",
            fleet,
            HISTOGRAM,
            cold=False,
        ),
        variant("(c) load payload, every latency histogram, warm", [load], None, cold=False),
        variant("(d) load payload, histogram e2e, cold caches", [load], HISTOGRAM, cold=True),
        variant(
            f"(e) every vLLM fixture ({len(fixtures)}), histogram e2e, warm",
            list(fixtures.values()),
            HISTOGRAM,
            cold=False,
        ),
    ]
    per_variant = [1, len(fleet), 1, 1, len(fixtures)]
    return comparisons, {"repetitions": repetitions, "payloads": per_variant}


def results(comparisons: list[Comparison], facts: dict) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them: each
    variant's medians are per repetition, which reads its `payloads` once each."""
    return {
        "baseline": BASELINE_COMMIT,
        "target_ratio": TARGET_RATIO,
        "repetitions": facts["repetitions"],
        "variants": [
            {**c.numbers(), "payloads": payloads}
            for c, payloads in zip(comparisons, facts["payloads"], strict=True)
        ],
        "identical": all(c.identical for c in comparisons),
    }


def markdown(results: dict) -> str:
    """The report section of `results`: one row per variant, medians per payload in
    microseconds."""
    lines = [
        f"## Ingest: `read_series` against commit {BASELINE_COMMIT}",
        "",
        "`read_series(text, 'vllm', None, histogram)`: a scraped payload to the series "
        "a Snapshot holds (promtext's selective parse, grouping, the vLLM adapter; on a "
        "layout seen before, the selective parse's values and the adapter's compiled "
        "plan). "
        f"The baseline is the same call at commit {BASELINE_COMMIT}, imported in the "
        f"same process. {results['repetitions']} interleaved repetitions per variant, "
        "medians; a repetition reads every payload of the variant once, and the "
        "times below are per payload. Warm: the parser's caches kept, as when the "
        "exporter scrapes the same servers again (from the second repetition on, each "
        "payload's layout has its plan); cold: cleared before every "
        "repetition (outside the timing), so no layout is known and none has a plan. fleet_sim "
        "payloads: each target serves its "
        "own model name, with counters that grow and gauges that move on every scrape. "
        "Identical: equal series, field by field, on every payload of the variant.",
        "",
        f"| variant | now (us per payload) | {BASELINE_COMMIT} (us per payload) | "
        f"ratio of medians | identical series | >= {TARGET_RATIO:g}x |",
        "|---|---:|---:|---:|---|---|",
    ]
    for c in results["variants"]:
        lines.append(
            f"| {c['variant']} | {c['fast_median_seconds'] / c['payloads'] * 1e6:.1f} | "
            f"{c['reference_median_seconds'] / c['payloads'] * 1e6:.1f} | {c['ratio']:.1f}x | "
            f"{'yes' if c['identical'] else 'NO'} | "
            f"{'met' if c['ratio'] >= TARGET_RATIO else 'missed'} |"
        )
    lines += ["", f"Identical series in every variant: {results['identical']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(results(*run("--quick" in sys.argv))))
