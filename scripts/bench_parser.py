"""Parser benchmark: `batchscope.exporter.ingest.promtext` against `prometheus_client.parser` on a real
payload.

Both parse the 53 KB vLLM 0.32 `/metrics` payload in the same process, in interleaved
repetitions (the order swaps every repetition, so neither always runs on a warmer
cache), and the ratio is the ratio of the medians. Every variant also checks that both
sides return the same data.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.engines import read_series, vllm
from batchscope.exporter.engines.grouping import group_by_name
from batchscope.exporter.ingest import promtext

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-0.32.0-cpu-load.txt"
TARGET_RATIO = 10.0
REPETITIONS = 200
QUICK_REPETITIONS = 10
WARMUP = 3


@dataclass(frozen=True)
class Comparison:
    """One variant: timings of both sides (seconds) and whether their outputs agree."""

    variant: str
    reference: str
    fast_seconds: list[float]
    reference_seconds: list[float]
    identical: bool

    @property
    def fast_median(self) -> float:
        return statistics.median(self.fast_seconds)

    @property
    def reference_median(self) -> float:
        return statistics.median(self.reference_seconds)

    @property
    def ratio(self) -> float:
        return self.reference_median / self.fast_median

    def numbers(self) -> dict:
        """What a report shows of it: the medians (seconds), their ratio and the check."""
        return {
            "variant": self.variant,
            "reference": self.reference,
            "repetitions": len(self.fast_seconds),
            "fast_median_seconds": self.fast_median,
            "reference_median_seconds": self.reference_median,
            "ratio": self.ratio,
            "identical": self.identical,
        }


def reference_samples(text: str) -> list:
    """prometheus_client's samples of every family, listed."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def reference_selected(text: str, names: frozenset[str]) -> list:
    """The cheapest way to get some families from prometheus_client: parse all, filter."""
    return [s for s in reference_samples(text) if s.name in names]


def same_samples(a: list, b: list) -> bool:
    """Equal names, labels, values and timestamps, in order; NaN equals NaN."""

    def key(s) -> tuple:
        value = "NaN" if math.isnan(s.value) else s.value
        return s.name, tuple(sorted(s.labels.items())), value, s.timestamp

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b, strict=True))


def compare(
    variant: str,
    reference: str,
    fast: Callable[[], object],
    slow: Callable[[], object],
    repetitions: int,
    identical: bool,
    before: Callable[[], None] | None = None,
) -> Comparison:
    """Time `fast` and `slow` alternately; `before` runs untimed before each call."""

    def timed(fn: Callable[[], object], prepare: Callable[[], None] | None) -> float:
        if prepare is not None:
            prepare()
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    for _ in range(WARMUP):
        timed(fast, before)
        timed(slow, before)
    fast_times: list[float] = []
    slow_times: list[float] = []
    for i in range(repetitions):
        if i % 2:
            slow_times.append(timed(slow, before))
            fast_times.append(timed(fast, before))
        else:
            fast_times.append(timed(fast, before))
            slow_times.append(timed(slow, before))
    return Comparison(variant, reference, fast_times, slow_times, identical)


def run(quick: bool = False) -> tuple[list[Comparison], dict[str, int]]:
    """Every variant, and facts about the payload."""
    text = FIXTURE.read_text(encoding="utf-8")
    families = vllm.FAMILIES
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    clear_cache = promtext.clear_caches
    everything = reference_samples(text)
    names = promtext.wanted_names(families)
    selected = reference_selected(text, names)

    clear_cache()
    selective_same = same_samples(promtext.parse(text, families), selected)
    clear_cache()
    full_same = same_samples(promtext.parse(text), everything)
    # The adapter fed with prometheus_client's samples must build the same snapshots.
    adapter_same = read_series(text, "vllm") == tuple(vllm.to_series(group_by_name(selected)))

    def variant(
        name: str,
        reference: str,
        fast: Callable[[], object],
        slow: Callable[[], object],
        identical: bool,
        cold: bool,
    ) -> Comparison:
        print(f"parser: {name} x{repetitions}", file=sys.stderr, flush=True)
        prepare = clear_cache if cold else None
        return compare(name, reference, fast, slow, repetitions, identical, prepare)

    comparisons = [
        variant(
            "(a) selective read, cold label cache",
            "parse all + filter",
            lambda: promtext.parse(text, families),
            lambda: reference_selected(text, names),
            selective_same,
            cold=True,
        ),
        variant(
            "(b) selective read, warm label cache",
            "parse all + filter",
            lambda: promtext.parse(text, families),
            lambda: reference_selected(text, names),
            selective_same,
            cold=False,
        ),
        variant(
            "(c) full parse, cold label cache",
            "parse all",
            lambda: promtext.parse(text),
            lambda: reference_samples(text),
            full_same,
            cold=True,
        ),
        variant(
            "(d) read_series(text, 'vllm'), warm",
            "parse all + filter + vllm.to_series",
            lambda: read_series(text, "vllm"),
            lambda: vllm.to_series(group_by_name(reference_selected(text, names))),
            adapter_same,
            cold=False,
        ),
        variant(
            "(e) full parse, warm label cache",
            "parse all",
            lambda: promtext.parse(text),
            lambda: reference_samples(text),
            full_same,
            cold=False,
        ),
    ]
    clear_cache()
    payload = {
        "bytes": len(text.encode()),
        "lines": text.count("\n"),
        "samples": len(everything),
        "selected": len(selected),
        "families": len(families),
        "repetitions": repetitions,
    }
    return comparisons, payload


def results(comparisons: list[Comparison], payload: dict[str, int]) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them."""
    return {
        "payload": payload,
        "target_ratio": TARGET_RATIO,
        "variants": [c.numbers() for c in comparisons],
        "identical": all(c.identical for c in comparisons),
    }


def markdown(results: dict) -> str:
    """The report section of `results`: one row per variant, medians in milliseconds."""
    payload = results["payload"]
    lines = [
        "## Parser: `batchscope.exporter.ingest.promtext` vs `prometheus_client.parser`",
        "",
        f"Payload: `{FIXTURE.relative_to(FIXTURE.parents[2])}` ({payload['bytes']} bytes, "
        f"{payload['lines']} lines, {payload['samples']} samples; the vLLM adapter reads "
        f"{payload['families']} families = {payload['selected']} samples). "
        f"{payload['repetitions']} interleaved repetitions per variant, one call each, "
        "same process; medians. prometheus_client has no selective mode, so its side of "
        "(a), (b) and (d) parses everything and keeps the same families "
        "(`promtext.wanted_names`). Cold: the parser's caches of label sets and layouts "
        "(`promtext.clear_caches`) cleared before every "
        "call (outside the timing); warm: kept, as when the exporter scrapes the same "
        "server again. Identical: same names, labels, values and timestamps in the same "
        "order ((d): equal snapshots when the adapter is fed prometheus_client's samples).",
        "",
        f"| variant | promtext median (ms) | prometheus_client median (ms) | prometheus_client "
        f"does | ratio of medians | identical samples | >= {TARGET_RATIO:g}x |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    for c in results["variants"]:
        lines.append(
            f"| {c['variant']} | {c['fast_median_seconds'] * 1e3:.3f} | "
            f"{c['reference_median_seconds'] * 1e3:.3f} | {c['reference']} | "
            f"{c['ratio']:.1f}x | {'yes' if c['identical'] else 'NO'} | "
            f"{'met' if c['ratio'] >= TARGET_RATIO else 'missed'} |"
        )
    lines += ["", f"Identical samples in every variant: {results['identical']}.", ""]
    return "\n".join(lines)
