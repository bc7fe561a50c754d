"""A load test as one self-contained HTML file (`batchscope-loadgen --report`): the Load
tests page's charts and table, the knee sentences and the capacity, with plotly's
JavaScript inlined, so it opens anywhere without the app or a network.

The report of a result file written earlier (`--output`, or `vllm bench serve`'s own):

    python -m batchscope.dashboard.load_report RESULT.json --report REPORT.html
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.io

from batchscope.dashboard import charts
from batchscope.dashboard.load_format import BATCHING_COLUMNS
from batchscope.dashboard.load_results import (
    ResultError,
    knees,
    load_result,
    result_records,
    run_from_record,
    runs_frame,
)

TABLE_COLUMNS = ("setting", "rate_per_s", "throughput_per_s", "p50_ms", "p99_ms", "goodput_per_s")


def report_html(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], title: str) -> str:
    """The HTML of the report on `records` (result records) with the result file's `meta`
    (`slo_ms`, `capacity`)."""
    runs = [run_from_record(dict(r), title) for r in records]
    slo_ms = meta.get("slo_ms")
    frame = runs_frame(runs, slo_ms if slo_ms is not None else math.inf)
    found = knees(runs, slo_ms)
    capacity = meta.get("capacity") or {}
    capacity_rates = {"": capacity["rate"]} if capacity.get("rate") is not None else {}
    latency = charts.latency_vs_rate_chart(
        frame, slo_ms, {k.setting: k.rate for k in found}, capacity_rates
    )
    throughput = charts.throughput_vs_rate_chart(frame)
    for figure in (latency, throughput):
        # The page's tight margins rely on Streamlit's frame; a bare page needs room for ticks.
        figure.update_layout(margin={"l": 70, "r": 20, "t": 60, "b": 50}, height=420)
    sentences = [f"{k.setting + ': ' if k.setting else ''}{k.sentence}" for k in found]
    if capacity.get("words"):
        sentences.append(capacity["words"])
    if not sentences:
        sentences.append("no knee: every step kept its latency and its throughput growing")
    columns = [c for c in (*TABLE_COLUMNS, *BATCHING_COLUMNS) if frame[c].notna().any()]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title></head><body style='font-family:sans-serif'>",
        f"<h1>Load test: {html.escape(title)}</h1>",
        *(f"<p><b>{html.escape(s)}</b></p>" for s in sentences),
        plotly.io.to_html(latency, include_plotlyjs=True, full_html=False),
        plotly.io.to_html(throughput, include_plotlyjs=False, full_html=False),
        frame[columns].to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(path: Path, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> Path:
    """Write the report of `records` to `path`; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(records, meta, path.stem), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Write the report of a result file; 0 on success, 2 (with the reason on stderr) for a
    file that cannot be read or holds no run."""
    parser = argparse.ArgumentParser(
        prog="python -m batchscope.dashboard.load_report",
        description="The self-contained HTML report of a load-test result file "
        "(batchscope-loadgen --output, or vllm bench serve --save-result).",
    )
    parser.add_argument("result", type=Path, help="the result file (JSON)")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE.html",
        help="where to write the report (default: the result file's name with .html)",
    )
    args = parser.parse_args(argv)
    out = args.report or args.result.with_suffix(".html")
    try:
        text = args.result.read_text(encoding="utf-8")
        load_result(text, str(args.result))  # a clear error for a file with no run
    except (OSError, ResultError) as error:
        print(f"load_report: {error}", file=sys.stderr)
        return 2
    doc = json.loads(text)
    meta = doc if isinstance(doc, dict) else {}
    print(f"wrote {write_report(out, result_records(doc), meta)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
