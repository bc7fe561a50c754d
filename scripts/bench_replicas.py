"""The replica count against a fleet of demo servers: the truth table.

Two settings of the demo server on the simulated H200, slowed (`--slowdown`) so that
five instances keep its pace on the machine: cap-bound (16 slots, 64-token answers, a
12 s budget) and KV-bound (32 slots, a 384-token KV cache, 64-token answers:
preemptions; a 20 s budget). For each, one
instance is first overloaded to measure what it finishes a second (the load generator's
throughput); then at three rates, multiples of that, the exporter watching one instance
recommends k, and the same rate runs against k-1, k and k+1 instances
(tests/support/replica_truth.py says how each run goes).

Gates: at k and k+1 no replica's budget saturated and the p99 within the budget (the
most budget used of every rate at most 100%); at k-1 the budget saturated at every rate
with k > 1; the count named the setting's limit at every rate. Checks: no request
failed; the simulated device kept its pace (overruns under 1% of its steps).

    .venv/bin/python scripts/bench_replicas.py               # about 45 minutes
    .venv/bin/python scripts/bench_replicas.py --quick       # cap-bound, two rates
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.replica_truth import (  # noqa: E402
    FleetRun,
    Setting,
    Timing,
    TruthRow,
    cap_bound,
    fleet_run,
    kv_bound,
    truth_row,
)

# Each setting's rates, as multiples of what one instance finishes a second overloaded,
# and the rate that overloads it to measure that.
# Each mid-way between two counts' edges at the headroom these settings read (about 0.94
# cap-bound, 0.89 KV-bound), and far enough past one instance's limit per instance at k-1
# that the queue outgrows the budget within a run.
MULTIPLES = {"cap-bound": (1.45, 2.5, 3.4), "kv-bound": (1.3, 1.6, 2.45)}
QUICK_MULTIPLES = (1.45, 2.5)
CALIBRATION_MULTIPLE = 2.0
NOMINAL = {"cap-bound": 4.5, "kv-bound": 1.5}  # requests/s one instance finishes at --slowdown 40
FULL = Timing(window_seconds=40.0, hold_seconds=10.0, run_seconds=100.0)
QUICK = Timing(window_seconds=30.0, hold_seconds=8.0, run_seconds=60.0)
MAX_OVERRUN_SHARE = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slowdown", type=float, default=40.0, help="the demo servers' --sim-slowdown"
    )
    parser.add_argument(
        "--setting",
        choices=("both", "cap-bound", "kv-bound"),
        default="both",
        help="run one setting's rows only (default: both; --quick: cap-bound)",
    )


def calibrate(setting: Setting, slowdown: float, timing: Timing, workdir: Path) -> FleetRun:
    """One instance overloaded: what it finishes a second is the loadgen's throughput."""
    rate = CALIBRATION_MULTIPLE * NOMINAL[setting.name] * 40.0 / slowdown
    short = dataclasses.replace(timing, run_seconds=min(timing.run_seconds, 40.0))
    return fleet_run(setting, rate, 1, short, workdir / f"{setting.name}-calibration")


def _run_json(run: FleetRun) -> dict:
    return {
        **dataclasses.asdict(run),
        "budget_used": run.budget_used,
        "within_budget": run.within_budget,
    }


def row_json(row: TruthRow, one: float) -> dict:
    return {
        "setting": row.setting.name,
        "limit_expected": row.setting.limit,
        "budget_seconds": row.setting.budget_seconds,
        "rate": row.rate,
        "multiple": row.rate / one,
        "recommended": row.recommended,
        "limit": row.limit,
        "claims": row.holds(),
        "runs": {str(n): _run_json(r) for n, r in sorted(row.runs.items())},
    }


def gates(rows: list[dict]) -> dict:
    """The table's claims as gates (module docstring)."""
    around = [
        r["runs"][str(r["recommended"] + d)]
        for r in rows
        if r["recommended"] is not None
        for d in (0, 1)
    ]
    used = [run["budget_used"] for run in around]
    worst = None if not used or None in used else 100 * max(used)
    saturated_below = [
        r["runs"][str(r["recommended"] - 1)]["saturated"]
        for r in rows
        if r["recommended"] is not None and r["recommended"] > 1
    ]
    named = [r["limit"] == r["limit_expected"] for r in rows]
    unsaturated = all(not run["saturated"] for run in around) and len(around) == 2 * len(rows)
    return {
        "budget used at k and k+1 (the most of every rate)": benchmark.gate(
            worst if unsaturated else None, 100.0, "%"
        ),
        "rates whose budget saturated at k-1": benchmark.gate(
            100 * sum(saturated_below) / len(saturated_below) if saturated_below else None,
            100.0,
            "%",
            at_most=False,
        ),
        "rates whose count named the setting's limit": benchmark.gate(
            100 * sum(named) / len(named) if named else None, 100.0, "%", at_most=False
        ),
    }


def run(args: argparse.Namespace) -> benchmark.Results:
    timing = QUICK if args.quick else FULL
    settings = [cap_bound(args.slowdown)] + ([] if args.quick else [kv_bound(args.slowdown)])
    if args.setting != "both":
        settings = [
            s for s in (cap_bound(args.slowdown), kv_bound(args.slowdown)) if s.name == args.setting
        ]
    rows, calibrations = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        workdir = Path(tmp)
        for setting in settings:
            calibration = calibrate(setting, args.slowdown, timing, workdir)
            one = calibration.throughput
            if not one:
                # A table at a guessed rate would gate nothing it measured.
                raise SystemExit(f"{setting.name}: the calibration run finished nothing")
            calibrations[setting.name] = {"finished_per_second": one, "rate": calibration.rate}
            multiples = QUICK_MULTIPLES if args.quick else MULTIPLES[setting.name]
            for multiple in multiples:
                row = truth_row(setting, round(multiple * one, 2), timing, workdir)
                rows.append(row_json(row, one))
    every = [run for r in rows for run in r["runs"].values()]
    overrun = max((run["overruns"] / run["steps"] for run in every if run["steps"]), default=0)
    return {
        "settings": {"slowdown": args.slowdown, "timing": dataclasses.asdict(timing)},
        "calibrations": calibrations,
        "rows": rows,
        "gates": gates(rows),
        "checks": {
            "no request failed": all(run["failed"] == 0 for run in every),
            f"overruns under {MAX_OVERRUN_SHARE:.0%} of the steps": overrun < MAX_OVERRUN_SHARE,
        },
    }


def _cell(run: dict | None) -> str:
    if run is None:
        return "—"
    p99 = "—" if run["p99_seconds"] is None else f"{run['p99_seconds']:.1f} s"
    used = "—" if run["budget_used"] is None else f"{100 * run['budget_used']:.0f}%"
    return f"{p99}, {used}" + (", **saturated**" if run["saturated"] else "")


def markdown(r: benchmark.Results) -> str:
    timing = r["settings"]["timing"]
    lines = [
        "## Replica count against a fleet of demo servers",
        "",
        "The demo server on `sim:h200` at `--sim-slowdown "
        f"{r['settings']['slowdown']:g}`, continuous batching; the exporter every "
        f"{timing['interval_seconds']:g} s over a {timing['window_seconds']:g} s window, "
        f"{timing['hold_seconds']:g} s hold; the load generator's Poisson arrivals round "
        f"robin for {timing['run_seconds']:g} s a run. Each rate's k is read at one "
        "instance, then the rate runs at k-1, k and k+1 instances. A cell: the p99, the "
        "budget used, and whether any replica's budget saturated.",
        "",
        *benchmark.gate_rows(r),
    ]
    for name, calibration in r["calibrations"].items():
        rows = [row for row in r["rows"] if row["setting"] == name]
        budget = rows[0]["budget_seconds"] if rows else 0
        lines += [
            "",
            f"**{name}** (budget {budget:g} s; one instance finishes "
            f"{calibration['finished_per_second']:.2f} requests/s overloaded):",
            "",
            "| rate (req/s) | x one | binding limit | k | at k-1 | at k | at k+1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            k = row["recommended"]
            runs = row["runs"]
            cells = [_cell(runs.get(str(k + d))) if k is not None else "—" for d in (-1, 0, 1)]
            lines.append(
                f"| {row['rate']:g} | {row['multiple']:.2f} | {row['limit']} | {k} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(benchmark.main(__doc__, run, markdown, add_arguments))
