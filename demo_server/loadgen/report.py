"""A load run's result and its outputs: the record, the table, the files, the progress.

`RunResult` holds what one rate (under one setting) gave and turns it into the record
of the result file (`vllm bench serve`'s field names where the meaning is the same),
with the latency percentiles and whether the generator kept its schedule; against a
fleet, with what each base URL was sent and answered (`ReplicaResult`, the `by_url` object).
`format_table`, `write_results` (JSON and CSV), `write_plots` (plotly) and the progress
reporters (plain lines, or a rich bar on a terminal) show those results. The fields a record
holds are the result format's (`batchscope.dashboard.load_format`), which the dashboard
reads.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from batchscope.dashboard.load_format import (
    BATCHING_COLUMNS,
    RECORD_FIELDS,
    percentile,
    setting_label,
)

# A run whose sends left this much later than scheduled (p99) fell behind its schedule.
BEHIND_SCHEDULE_MS = 10.0
CHROMIUM = "/usr/bin/chromium"


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def is_success(status: int | str) -> bool:
    """An HTTP 2xx; a request that timed out or lost its connection has a word instead."""
    return isinstance(status, int) and 200 <= status < 300


@dataclass
class ReplicaResult:
    """What one base URL of a fleet was sent in a step and how it answered: counts by
    outcome, the most requests it had outstanding at once, latencies in ms."""

    url: str
    sent: int = 0
    ok: int = 0
    errors_by_status: dict[str, int] = field(default_factory=dict)
    max_outstanding: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    def fail(self, status: str) -> None:
        self.errors_by_status[status] = self.errors_by_status.get(status, 0) + 1

    def record(self, seconds: float) -> dict[str, Any]:
        """Its part of the run's `by_url` object (REPLICA_FIELDS), over the run's `seconds`."""
        return {
            "sent": self.sent,
            "completed": self.ok,
            "failed": sum(self.errors_by_status.values()),
            "errors_by_status": dict(sorted(self.errors_by_status.items())),
            "request_throughput": self.ok / seconds if seconds else None,
            "mean_e2el_ms": mean(self.latencies_ms),
            "p50_e2el_ms": percentile(self.latencies_ms, 50),
            "p99_e2el_ms": percentile(self.latencies_ms, 99),
            "max_outstanding": self.max_outstanding,
        }


@dataclass
class RunResult:
    """What one rate (under one setting) gave: counts, throughput, latency in ms.

    `errors` counts failures other than 429 (`rejected_429`); `errors_by_status` counts
    every failure by HTTP status, `timeout` or `connection`. `send_lags_ms`: how late
    each request left against its schedule.
    """

    setting: dict[str, float | int]
    rate_per_s: float
    duration_s: float
    sent: int = 0
    ok: int = 0
    errors: int = 0
    rejected_429: int = 0
    dropped: int = 0
    elapsed_s: float = 0.0
    throughput_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    arrivals: str = "poisson"
    endpoint: str = "embeddings"
    output_tokens: int = 0
    errors_by_status: dict[str, int] = field(default_factory=dict)
    # The over-saturation rule's verdict (`oversaturation`) and, when it ended the step,
    # when (s after the start); the server's `batching` object under --watch.
    over_saturated: bool = False
    saturation_reason: str | None = None
    stopped_at_s: float | None = None
    batching: dict[str, Any] | None = None
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    ttfts_ms: list[float] = field(default_factory=list, repr=False)
    send_lags_ms: list[float] = field(default_factory=list, repr=False)
    # Per base URL, in the fleet's order; a `by_url` object only for more than one.
    replicas: list[ReplicaResult] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """The result as plain JSON-ready data, without the per-request lists."""
        data = asdict(self)
        for per_request in ("latencies_ms", "ttfts_ms", "send_lags_ms", "replicas"):
            del data[per_request]
        return {**data, **self._by_url(self.measured_seconds())}

    def fail(self, status: str) -> None:
        self.errors_by_status[status] = self.errors_by_status.get(status, 0) + 1
        if status == "429":
            self.rejected_429 += 1
        else:
            self.errors += 1

    def answered(self, replica: ReplicaResult, status: int | str, latency_ms: float) -> None:
        """Count one request's outcome (an HTTP status, `timeout` or `connection`), in the
        run and in the replica it went to."""
        if is_success(status):
            self.ok += 1
            self.latencies_ms.append(latency_ms)
            replica.ok += 1
            replica.latencies_ms.append(latency_ms)
            return
        self.fail(str(status))
        replica.fail(str(status))

    def measured_seconds(self) -> float:
        """The seconds the run's rates are over: its duration, or the time it ran when it
        was ended early (or ran longer)."""
        return max(self.elapsed_s, self.duration_s if self.stopped_at_s is None else 0.0)

    def _by_url(self, seconds: float) -> dict[str, Any]:
        if len(self.replicas) < 2:
            return {}
        return {"by_url": {r.url: r.record(seconds) for r in self.replicas}}

    def record(self, slo_ms: float | None) -> dict[str, Any]:
        """The run as the result file holds it: `vllm bench serve`'s names where the
        meaning is the same (throughputs per second of the run, latencies in ms), and
        `batching` where the server was watched, `by_url` where a fleet was loaded.
        `slo_attainment`: the share of arrivals (sent or dropped) answered within the SLO.
        A step ended early is measured over the time it ran."""
        seconds = self.measured_seconds()
        within_slo = (
            sum(1 for ms in self.latencies_ms if ms <= slo_ms) if slo_ms is not None else None
        )
        p99_lag = percentile(self.send_lags_ms, 99)
        arrivals = self.sent + self.dropped
        return {
            "setting": dict(self.setting),
            "rate": self.rate_per_s,
            "arrivals": self.arrivals,
            "duration": self.duration_s,
            "sent": self.sent,
            "completed": self.ok,
            "failed": self.errors + self.rejected_429,
            "dropped": self.dropped,
            "errors_by_status": dict(sorted(self.errors_by_status.items())),
            "request_throughput": self.ok / seconds,
            "output_throughput": (
                self.output_tokens / seconds if self.endpoint == "completions" else None
            ),
            "total_output_tokens": self.output_tokens,
            "mean_e2el_ms": mean(self.latencies_ms),
            "p50_e2el_ms": percentile(self.latencies_ms, 50),
            "p90_e2el_ms": percentile(self.latencies_ms, 90),
            "p99_e2el_ms": percentile(self.latencies_ms, 99),
            "mean_ttft_ms": mean(self.ttfts_ms),
            "p50_ttft_ms": percentile(self.ttfts_ms, 50),
            "p99_ttft_ms": percentile(self.ttfts_ms, 99),
            "slo_ms": slo_ms,
            "goodput": within_slo / seconds if within_slo is not None and seconds else None,
            "slo_attainment": within_slo / arrivals
            if within_slo is not None and arrivals
            else None,
            "p99_send_lag_ms": p99_lag,
            "max_send_lag_ms": max(self.send_lags_ms, default=None),
            "behind_schedule": p99_lag is not None and p99_lag > BEHIND_SCHEDULE_MS,
            "over_saturated": self.over_saturated,
            "stopped_at_s": self.stopped_at_s,
            **({"batching": self.batching} if self.batching is not None else {}),
            **self._by_url(seconds),
        }


def behind_schedule_note(record: dict[str, Any]) -> str:
    return (
        f"BEHIND SCHEDULE: sends left up to {record['max_send_lag_ms']:.0f} ms late "
        f"(p99 {record['p99_send_lag_ms']:.0f} ms): the load generator, not the server, "
        "limited this run's offered load"
    )


class PlainProgress:
    """Progress as plain lines on a stream (a log, a pipe, a CI console)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def start_run(self, label: str, expected: int) -> None:
        print(label, file=self.stream, flush=True)

    def request_done(self) -> None:
        pass

    def end_run(self, result: RunResult) -> None:
        record = result.record(None)
        print(
            f"    ok={result.ok} errors={result.errors} 429={result.rejected_429} "
            f"p50={_ms(result.p50_ms)} ms p99={_ms(result.p99_ms)} ms",
            file=self.stream,
            flush=True,
        )
        if record["behind_schedule"]:
            print(f"    {behind_schedule_note(record)}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class RichProgress(PlainProgress):
    """A progress bar per run on a terminal (rich), and the same result lines."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        super().__init__(stream)
        self._bar = Progress(
            "{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=False,
        )
        self._bar.start()
        self._task: Any = None

    def start_run(self, label: str, expected: int) -> None:
        self._task = self._bar.add_task(label, total=expected)

    def request_done(self) -> None:
        self._bar.advance(self._task)

    def end_run(self, result: RunResult) -> None:
        self._bar.console.file.flush()
        super().end_run(result)

    def close(self) -> None:
        self._bar.stop()


def format_table(results: Sequence[RunResult]) -> str:
    """The results as a fixed-width text table, one row per run."""
    header = (
        "setting",
        "rate/s",
        "sent",
        "ok",
        "errors",
        "429",
        "dropped",
        "thr/s",
        "p50 ms",
        "p99 ms",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                setting_label(r.setting) or "-",
                f"{r.rate_per_s:g}",
                str(r.sent),
                str(r.ok),
                str(r.errors),
                str(r.rejected_429),
                str(r.dropped),
                f"{r.throughput_per_s:.1f}",
                _ms(r.p50_ms),
                _ms(r.p99_ms),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def write_results(
    path: Path, records: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> tuple[Path, Path]:
    """The result file (JSON: `meta` fields and `runs`) and a CSV of the runs beside it
    (same stem); returns both paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "runs": list(records)}, indent=2) + "\n", encoding="utf-8")
    csv_path = path.with_suffix(".csv")
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=(*RECORD_FIELDS, *BATCHING_COLUMNS))
        writer.writeheader()
        for record in records:
            batching = record.get("batching") or {}
            writer.writerow(
                {
                    **{name: record[name] for name in RECORD_FIELDS},
                    "setting": setting_label(record["setting"]),
                    "errors_by_status": json.dumps(record["errors_by_status"]),
                    **{name: batching.get(name) for name in BATCHING_COLUMNS},
                }
            )
    return path, csv_path


def write_plots(path: Path, records: Sequence[dict[str, Any]]) -> list[str]:
    """Plotly charts of the runs: latency (p50, p99) vs rate per setting, throughput
    and goodput vs rate. Writes `path` (.html) and, when a headless Chromium renders it,
    the same as .png; returns notes on what was written or skipped."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("latency vs offered rate", "throughput vs offered rate", "goodput"),
    )
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_setting.setdefault(setting_label(record["setting"]) or "-", []).append(record)
    for label, runs in by_setting.items():
        runs = sorted(runs, key=lambda r: r["rate"])
        rates = [r["rate"] for r in runs]
        for q, dash in (("p50", "dot"), ("p99", "solid")):
            figure.add_trace(
                go.Scatter(
                    x=rates,
                    y=[r[f"{q}_e2el_ms"] for r in runs],
                    name=f"{label} {q}",
                    line={"dash": dash},
                    legendgroup=label,
                ),
                row=1,
                col=1,
            )
        figure.add_trace(
            go.Scatter(
                x=rates,
                y=[r["request_throughput"] for r in runs],
                name=f"{label} completed/s",
                legendgroup=label,
            ),
            row=1,
            col=2,
        )
        figure.add_trace(
            go.Scatter(
                x=rates,
                y=[r["goodput"] for r in runs],
                name=f"{label} goodput/s",
                legendgroup=label,
            ),
            row=1,
            col=3,
        )
    figure.update_xaxes(title_text="offered rate (req/s)")
    figure.update_yaxes(title_text="latency (ms)", row=1, col=1)
    figure.update_yaxes(title_text="req/s", row=1, col=2)
    figure.update_yaxes(title_text="req/s within the SLO", row=1, col=3)
    figure.update_layout(width=1500, height=500, title="batchscope-loadgen")
    figure.write_html(path, include_plotlyjs=True)
    notes = [f"wrote {path}"]
    png = path.with_suffix(".png")
    # kaleido renders through a headless Chrome; Debian's chromium serves where present.
    if "BROWSER_PATH" not in os.environ and os.path.exists(CHROMIUM):
        os.environ["BROWSER_PATH"] = CHROMIUM
    try:
        figure.write_image(png)
        notes.append(f"wrote {png}")
    except Exception as error:  # kaleido missing, or no browser it can start
        notes.append(f"PNG skipped ({type(error).__name__}: {str(error)[:200]})")
    return notes


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
