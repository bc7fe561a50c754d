"""What every benchmark script shares: its command line, its gates, its outputs.

A benchmark is a script `scripts/bench_NAME.py` whose `main` hands `run` and `markdown`
to `main` below. `run(args)` measures and returns plain data (what `--json` writes),
with `gates`, each a figure against the bound the page claims for it, and `checks`,
what makes the measurement valid (both sides gave the same output, every target was
up). `markdown(results)` is the benchmark's section of docs/benchmarks.md. The exit code
is 0 when every gate and check holds, 1 when one does not: `make bench` fails then.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Results = dict[str, Any]


def gate(value: float | None, bound: float, unit: str, *, at_most: bool = True) -> dict:
    """A figure against its bound: met when it is measured and on the right side."""
    measured = value is not None and not math.isnan(value)
    met = measured and (value <= bound if at_most else value >= bound)
    return {"value": value, "bound": bound, "unit": unit, "at_most": at_most, "met": met}


def missed(results: Results) -> list[str]:
    """The gates and checks of `results` that do not hold, by name."""
    gates = [name for name, g in results.get("gates", {}).items() if not g["met"]]
    return gates + [name for name, ok in results.get("checks", {}).items() if not ok]


def _figure(value: float, unit: str) -> str:
    number = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{number}{unit}" if unit in ("", "x", "%") else f"{number} {unit}"


def gate_rows(results: Results) -> list[str]:
    """The claims table of a section: each gate's figure, its bound and whether it holds."""
    rows = ["| claim | figure | bound | met |", "|---|---|---|---|"]
    for name, g in results["gates"].items():
        value = "not measured" if g["value"] is None else _figure(g["value"], g["unit"])
        bound = f"{'<=' if g['at_most'] else '>='} {_figure(g['bound'], g['unit'])}"
        rows.append(f"| {name} | {value} | {bound} | {'yes' if g['met'] else '**no**'} |")
    return rows


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value at or above `share` of them."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def median_ratio(without: Sequence[float], with_: Sequence[float]) -> float:
    """The ratio of the medians: what a side costs against the other."""
    return statistics.median(without) / statistics.median(with_)


def parser(
    doc: str, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.ArgumentParser:
    """`--quick`, `--output`, `--json`, and the benchmark's own flags."""
    found = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    found.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run, not a measurement"
    )
    found.add_argument("--output", type=Path, help="write the markdown section here")
    found.add_argument("--json", type=Path, help="write the results (gates included) here")
    if add_arguments is not None:
        add_arguments(found)
    return found


def main(
    doc: str,
    run: Callable[[argparse.Namespace], Results],
    markdown: Callable[[Results], str],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
) -> int:
    """Parse the command line, run, write the section and the results; 1 when a gate or
    a check is missed."""
    args = parser(doc, add_arguments).parse_args(argv)
    results = run(args)
    text = markdown(results)
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(text)
    failed = missed(results)
    if failed:
        print("missed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0
