"""Load test results (batchscope-loadgen and `vllm bench serve --save-result`) as runs.

Both tools' field names are read: loadgen's (`--json`: `rate_per_s`, `throughput_per_s`,
`p50_ms`, `p99_ms`; `--output` files: `rate`, then vLLM's names) and vLLM's
(`request_rate`, `request_throughput`, `median_e2el_ms`, `p99_e2el_ms`, per-request
`latencies` in seconds). A loadgen step run with `--watch` carries a `batching` object
(the server's signals over the step); a file without it opens the same, with those
columns empty. The knee of each setting is found here with the page's SLO (the result
format's rule, `load_format`, which the loadgen applies too); a `--find-capacity` file's
capacity is read from the file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import pandas as pd

from batchscope.dashboard.load_format import BATCHING_COLUMNS, Knee, find_knee, percentile

_PERCENTILE_FIELD = re.compile(r"^p(\d+(?:\.\d+)?)_(?:e2el_)?ms$")


class ResultError(Exception):
    """A file that is not a load test result this page reads; the message says why."""


@dataclass(frozen=True, slots=True)
class Run:
    """One rate under one setting: throughput and end-to-end latency (ms)."""

    source: str
    setting: str
    rate_per_s: float | None
    throughput_per_s: float | None
    percentiles_ms: dict[float, float]
    latencies_ms: tuple[float, ...] | None = None
    # The server's batching signals over the step (`batchscope-loadgen --watch`).
    batching: dict | None = None

    @property
    def p50_ms(self) -> float | None:
        return self.percentiles_ms.get(50.0)

    @property
    def p99_ms(self) -> float | None:
        return self.percentiles_ms.get(99.0)


def _cell_number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        value = math.inf if value == "inf" else value
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if not math.isnan(number) else None


def _first(record: dict, *names: str) -> float | None:
    for name in names:
        value = _cell_number(record.get(name))
        if value is not None:
            return value
    return None


def _setting(record: dict, source: str) -> str:
    setting = record.get("setting")
    if isinstance(setting, dict) and setting:
        return ", ".join(f"{k}={v}" for k, v in sorted(setting.items()))
    if isinstance(setting, str) and setting:
        return setting
    parts = [str(record[k]) for k in ("label",) if record.get(k)]
    if record.get("max_concurrency") is not None:
        parts.append(f"max_concurrency={record['max_concurrency']}")
    return ", ".join(parts) or source


def run_from_record(record: dict, source: str) -> Run:
    """One run from one result record of either tool."""
    percentiles: dict[float, float] = {}
    for key, value in record.items():
        match = _PERCENTILE_FIELD.match(key)
        number = _cell_number(value)
        if match and number is not None:
            percentiles[float(match.group(1))] = number
    median = _first(record, "median_e2el_ms")
    if median is not None:
        percentiles.setdefault(50.0, median)
    latencies = None
    raw = record.get("latencies_ms")
    scale = 1.0
    if not isinstance(raw, list):
        raw, scale = record.get("latencies"), 1000.0  # vLLM: seconds
    if isinstance(raw, list):
        values = [_cell_number(v) for v in raw]
        latencies = tuple(sorted(v * scale for v in values if v is not None))
        if latencies:
            for q in (50.0, 99.0):
                percentiles.setdefault(q, percentile(latencies, q))
    return Run(
        source=source,
        setting=_setting(record, source),
        rate_per_s=_first(record, "rate_per_s", "rate", "request_rate"),
        throughput_per_s=_first(record, "throughput_per_s", "request_throughput"),
        percentiles_ms=dict(sorted(percentiles.items())),
        latencies_ms=latencies or None,
        batching=record["batching"] if isinstance(record.get("batching"), dict) else None,
    )


def result_records(doc: object) -> list[dict]:
    """The run records of a parsed result file: its `runs` (or `results`) list, the list
    itself, or the one record it is."""
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, dict)]
    if isinstance(doc, dict):
        for key in ("runs", "results"):
            if isinstance(doc.get(key), list):
                return result_records(doc[key])
        return [doc]
    return []


def load_result(text: str, source: str) -> list[Run]:
    """The runs in one result file; ResultError when it holds none."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ResultError(f"{source}: not JSON ({err})") from None
    runs = [run_from_record(r, source) for r in result_records(doc)]
    runs = [r for r in runs if r.throughput_per_s is not None or r.percentiles_ms]
    if not runs:
        raise ResultError(
            f"{source}: no run found; expected batchscope-loadgen --json output or a "
            "`vllm bench serve --save-result` file"
        )
    return runs


def good_share(run: Run, slo_ms: float) -> tuple[float, float]:
    """Bounds on the share of requests answered within `slo_ms` (equal when exact).

    Exact from per-request latencies; otherwise bounded by the nearest known
    percentiles (p99 <= SLO means at least 99% were in time).
    """
    if run.latencies_ms:
        good = sum(1 for v in run.latencies_ms if v <= slo_ms) / len(run.latencies_ms)
        return good, good
    lower, upper = 0.0, 1.0
    for q, value in run.percentiles_ms.items():
        if value <= slo_ms:
            lower = max(lower, q / 100)
        else:
            upper = min(upper, q / 100)
    return lower, upper


@dataclass(frozen=True, slots=True)
class CapacityMark:
    """A `--find-capacity` result: the rate found and its bracket (high None: never failed)."""

    source: str
    rate: float
    low: float
    high: float | None


def load_capacity(text: str, source: str) -> CapacityMark | None:
    """The capacity a `--find-capacity` result file holds, or None (any other file)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    found = doc.get("capacity") if isinstance(doc, dict) else None
    if not isinstance(found, dict):
        return None
    rate, low = _cell_number(found.get("rate")), _cell_number(found.get("low"))
    if rate is None or low is None:
        return None
    return CapacityMark(source, rate, low, _cell_number(found.get("high")))


def knees(runs: list[Run], slo_ms: float | None) -> list[Knee]:
    """Each setting's knee by the loadgen's rule (`find_knee`), at `slo_ms`."""
    by_setting: dict[str, list[dict]] = {}
    for run in runs:
        if run.rate_per_s is None or run.throughput_per_s is None:
            continue
        by_setting.setdefault(run.setting, []).append(
            {
                "rate": run.rate_per_s,
                "request_throughput": run.throughput_per_s,
                "p99_e2el_ms": run.p99_ms,
                "batching": run.batching,
            }
        )
    found = (find_knee(steps, slo_ms, setting) for setting, steps in sorted(by_setting.items()))
    return [knee for knee in found if knee is not None]


def runs_frame(runs: list[Run], slo_ms: float) -> pd.DataFrame:
    """One row per run with goodput bounds at the SLO (requests/s answered in time)."""
    rows = []
    for run in runs:
        lower, upper = good_share(run, slo_ms)
        throughput = run.throughput_per_s
        rows.append(
            {
                "setting": run.setting,
                "source": run.source,
                "rate_per_s": run.rate_per_s,
                "throughput_per_s": throughput,
                "p50_ms": run.p50_ms,
                "p99_ms": run.p99_ms,
                "goodput_per_s": None if throughput is None else throughput * lower,
                "goodput_upper_per_s": None if throughput is None else throughput * upper,
                "goodput_exact": lower == upper,
                **{name: (run.batching or {}).get(name) for name in BATCHING_COLUMNS},
            }
        )
    frame = pd.DataFrame(rows)
    return frame.sort_values(["setting", "rate_per_s"], ignore_index=True) if rows else frame
