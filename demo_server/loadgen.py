"""Open-loop load generator for the demo server, vLLM, or any OpenAI-style endpoint.

`batchscope-loadgen --base-url URL --endpoint embeddings --rates 10,50,100 --duration 30
--output results.json` sends arrivals at each rate for `duration` seconds and reports,
per rate, throughput, latency percentiles, time to first token (completions, streamed),
errors by status and goodput within `--slo-ms`. `--set max_wait_ms=5,10,20` (or
`--sweep-max-wait 5,10,20`) repeats the sweep for each value, applied through the demo
server's `POST /admin/config`, so no restart is needed.

The result file holds `runs`, one per rate and setting, with the field names of
`vllm bench serve` where the meaning is the same (`request_throughput`,
`output_throughput`, `p50_e2el_ms`, `p90_e2el_ms`, `p99_e2el_ms`, `mean_ttft_ms`,
`p99_ttft_ms`, `completed`, `failed`), plus `rate`, `setting`, `errors_by_status` and
`goodput`; a CSV of the same rows lies beside it. `--plot` draws them with plotly.

Open loop: a request is sent at its scheduled time whether or not earlier ones have
answered, and its latency is measured from that scheduled time, so a slow server
shows up as latency instead of silently lowering the offered load. When the generator
itself cannot keep its schedule (the client is the bottleneck), the run says so
(`behind_schedule`, `p99_send_lag_ms`) rather than reporting a lower load as the one
asked for. Only the given URL is contacted; every run is bounded in requests
(`MAX_REQUESTS_PER_RUN`) and in time (`duration` plus the request timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from exporter.length_log import FileReport, InputError, read_lengths

ENDPOINTS = {"embeddings": "/v1/embeddings", "completions": "/v1/completions"}
ADMIN_PATH = "/admin/config"
MAX_REQUESTS_PER_RUN = 100_000
ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")
# A run whose sends left this much later than scheduled (p99) fell behind its schedule.
BEHIND_SCHEDULE_MS = 10.0
DEFAULT_MODEL = "batchscope-demo"
CHROMIUM = "/usr/bin/chromium"
WORDS = (
    "batch", "queue", "latency", "budget", "token", "model", "server", "request", "wait",
    "throughput", "tail", "median", "cache", "slot", "step", "encoder", "decoder", "vector",
)  # fmt: skip
# The fields of a run in the result file and CSV, in order.
RECORD_FIELDS = (
    "setting", "rate", "arrivals", "duration", "sent", "completed", "failed", "dropped",
    "errors_by_status", "request_throughput", "output_throughput", "total_output_tokens",
    "mean_e2el_ms", "p50_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "mean_ttft_ms",
    "p50_ttft_ms", "p99_ttft_ms", "slo_ms", "goodput", "p99_send_lag_ms",
    "max_send_lag_ms", "behind_schedule",
)  # fmt: skip


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`, interpolating linearly between the
    two nearest ranks (as numpy's default does); None when there are no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def arrival_times(
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
    process: str = "poisson",
    burstiness: float = 1.0,
) -> list[float]:
    """Arrival offsets (seconds from the start) within `duration_s`, at most
    MAX_REQUESTS_PER_RUN of them, at a mean of `rate_per_s`.

    `poisson`: exponential gaps. `gamma`: gamma gaps of shape `burstiness` (as `vllm bench
    serve --burstiness`): 1 is Poisson, below 1 burstier, above 1 more regular.
    `constant`: one every 1 / rate seconds.
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate must be above 0, got {rate_per_s}")
    if process not in ARRIVAL_PROCESSES:
        raise ValueError(f"arrivals must be one of {ARRIVAL_PROCESSES}, got {process!r}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be above 0, got {burstiness}")

    def gap() -> float:
        if process == "poisson":
            return rng.expovariate(rate_per_s)
        if process == "gamma":
            return rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
        return 1.0 / rate_per_s

    times: list[float] = []
    at = gap()
    while at < duration_s and len(times) < MAX_REQUESTS_PER_RUN:
        times.append(at)
        at += gap()
    return times


def lognormal_lengths(
    count: int, median: float, sigma: float, maximum: int, rng: random.Random
) -> list[int]:
    """`count` output lengths from a log-normal of this median and sigma, in 1..maximum."""
    mu = math.log(median)
    return [min(maximum, max(1, round(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def lengths_from_file(path: str) -> list[int]:
    """Every length in a file batchscope-static-util reads (plain numbers, CSV, JSON lines,
    a vLLM bench result with per-request data, the demo server's request log). Raises
    InputError naming the file when it holds none."""
    report = FileReport(path)
    with open(path, encoding="utf-8") as stream:
        lengths = [n for chunk in read_lengths(stream, report, None) for n in chunk if n > 0]
    if not lengths:
        raise InputError(f"{path}: no output lengths ({report.bad_lines} lines unreadable)")
    return lengths


def parse_setting(text: str) -> tuple[str, list[float | int]]:
    """`name=v1,v2,...` as (name, values); integers stay integers."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise ValueError(f"a setting looks like max_wait_ms=5,10,20, got {text!r}")
    return name.strip(), [_number(v) for v in values.split(",")]


def _number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


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
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    ttfts_ms: list[float] = field(default_factory=list, repr=False)
    send_lags_ms: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """The result as plain JSON-ready data, without the per-request lists."""
        data = asdict(self)
        for per_request in ("latencies_ms", "ttfts_ms", "send_lags_ms"):
            del data[per_request]
        return data

    def fail(self, status: str) -> None:
        self.errors_by_status[status] = self.errors_by_status.get(status, 0) + 1
        if status == "429":
            self.rejected_429 += 1
        else:
            self.errors += 1

    def record(self, slo_ms: float | None) -> dict[str, Any]:
        """The run as the result file holds it: `vllm bench serve`'s names where the
        meaning is the same (throughputs per second of the run, latencies in ms)."""
        seconds = max(self.elapsed_s, self.duration_s)
        within_slo = (
            sum(1 for ms in self.latencies_ms if ms <= slo_ms) if slo_ms is not None else None
        )
        p99_lag = percentile(self.send_lags_ms, 99)
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
            "goodput": within_slo / seconds if within_slo is not None else None,
            "p99_send_lag_ms": p99_lag,
            "max_send_lag_ms": max(self.send_lags_ms, default=None),
            "behind_schedule": p99_lag is not None and p99_lag > BEHIND_SCHEDULE_MS,
        }


def make_payload(
    endpoint: str, rng: random.Random, max_tokens: Sequence[int], model: str = DEFAULT_MODEL
) -> dict[str, Any]:
    """One request body: a few random words; completions also get `max_tokens` drawn
    from the given choices and `ignore_eos`, so output lengths are what was asked."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
    if endpoint == "embeddings":
        return {"model": model, "input": text}
    return {
        "model": model,
        "prompt": text,
        "max_tokens": rng.choice(max_tokens),
        "ignore_eos": True,
    }


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
            "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(file=stream), transient=False,
        )  # fmt: skip
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


def behind_schedule_note(record: dict[str, Any]) -> str:
    return (
        f"BEHIND SCHEDULE: sends left up to {record['max_send_lag_ms']:.0f} ms late "
        f"(p99 {record['p99_send_lag_ms']:.0f} ms): the load generator, not the server, "
        "limited this run's offered load"
    )


async def run_rate(
    session: aiohttp.ClientSession,
    url: str,
    endpoint: str,
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    max_tokens: Sequence[int] = (16,),
    output_lengths: Sequence[int] | None = None,
    arrivals: str = "poisson",
    burstiness: float = 1.0,
    model: str = DEFAULT_MODEL,
    concurrency_limit: int | None = None,
    setting: dict[str, float | int] | None = None,
    progress: PlainProgress | None = None,
) -> RunResult:
    """Offer load at `rate_per_s` for `duration_s` and measure what came back.

    Completions stream, so the first chunk gives the time to first token and the usage
    chunk the output tokens. `output_lengths`, when given, are the requests' max_tokens
    in order (cycled); else each is drawn from `max_tokens`. An arrival that finds
    `concurrency_limit` requests in flight is not sent and is counted `dropped`; the run
    ends when every sent request has answered or timed out.
    """
    rng = random.Random(seed)
    schedule = arrival_times(rate_per_s, duration_s, rng, arrivals, burstiness)
    payloads = [make_payload(endpoint, rng, max_tokens, model) for _ in schedule]
    if endpoint == "completions":
        for payload, length in zip(payloads, itertools.cycle(output_lengths or [None])):
            if length is not None:
                payload["max_tokens"] = length
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
    result = RunResult(setting or {}, rate_per_s, duration_s, arrivals=arrivals, endpoint=endpoint)
    target = url.rstrip("/") + ENDPOINTS[endpoint]
    in_flight: set[asyncio.Task[None]] = set()

    async def one(scheduled_at: float, payload: dict[str, Any]) -> None:
        try:
            async with session.post(target, json=payload) as response:
                status = response.status
                if status == 200 and payload.get("stream"):
                    await _read_stream(response, scheduled_at, result)
                else:
                    await response.read()
        except TimeoutError:
            result.fail("timeout")
            return
        except aiohttp.ClientError:
            result.fail("connection")
            return
        finally:
            if progress is not None:
                progress.request_done()
        if 200 <= status < 300:
            result.ok += 1
            result.latencies_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
        else:
            result.fail(str(status))

    start = time.perf_counter()
    for offset, payload in zip(schedule, payloads, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if concurrency_limit is not None and len(in_flight) >= concurrency_limit:
            result.dropped += 1
            continue
        result.send_lags_ms.append((time.perf_counter() - start - offset) * 1000.0)
        task = asyncio.create_task(one(start + offset, payload))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        result.sent += 1
    if in_flight:
        await asyncio.gather(*in_flight)
    result.elapsed_s = time.perf_counter() - start
    result.throughput_per_s = result.ok / max(result.elapsed_s, duration_s)
    result.p50_ms = percentile(result.latencies_ms, 50)
    result.p99_ms = percentile(result.latencies_ms, 99)
    return result


async def _read_stream(
    response: aiohttp.ClientResponse, scheduled_at: float, result: RunResult
) -> None:
    """Read an OpenAI completion stream: the first text chunk's time is the TTFT; the
    usage chunk's completion_tokens (else the text chunks counted) the output tokens."""
    chunks = 0
    usage_tokens = None
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        body = json.loads(line[5:])
        if body.get("usage") and body["usage"].get("completion_tokens") is not None:
            usage_tokens = body["usage"]["completion_tokens"]
        if any(choice.get("text") for choice in body.get("choices") or ()):
            if chunks == 0:
                result.ttfts_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
            chunks += 1
    result.output_tokens += usage_tokens if usage_tokens is not None else chunks


async def apply_setting(
    session: aiohttp.ClientSession, url: str, setting: dict[str, float | int]
) -> None:
    """POST the setting to the server's admin endpoint; raises on a non-2xx answer."""
    async with session.post(url.rstrip("/") + ADMIN_PATH, json=setting) as response:
        body = await response.text()
        if response.status >= 300:
            raise RuntimeError(f"{ADMIN_PATH} answered {response.status}: {body[:200]}")


async def sweep(
    url: str,
    endpoint: str,
    rates: Sequence[float],
    duration_s: float,
    *,
    settings: Sequence[tuple[str, list[float | int]]] = (),
    seed: int = 0,
    max_tokens: Sequence[int] = (16,),
    output_lengths: Sequence[int] | None = None,
    arrivals: str = "poisson",
    burstiness: float = 1.0,
    model: str = DEFAULT_MODEL,
    concurrency_limit: int | None = None,
    timeout_s: float = 30.0,
    progress: TextIO | None = None,
) -> list[RunResult]:
    """Every combination of the settings' values, each followed by every rate in turn.

    Progress goes to `progress` (a text stream) when given: a bar on a terminal, plain
    lines otherwise.
    """
    names = [name for name, _ in settings]
    combinations = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(values for _, values in settings))
    ]
    total = len(combinations) * len(rates)
    reporter: PlainProgress | None = None
    if progress is not None:
        reporter = RichProgress(progress) if progress.isatty() else PlainProgress(progress)
    results: list[RunResult] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency_limit or 0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            for setting in combinations:
                if setting:
                    await apply_setting(session, url, setting)
                for rate in rates:
                    if reporter is not None:
                        label = _setting_label(setting) or "-"
                        reporter.start_run(
                            f"[{len(results) + 1}/{total}] {label} rate={rate:g}/s "
                            f"for {duration_s:g} s",
                            round(rate * duration_s),
                        )
                    result = await run_rate(
                        session,
                        url,
                        endpoint,
                        rate,
                        duration_s,
                        seed=seed + len(results),
                        max_tokens=max_tokens,
                        output_lengths=output_lengths,
                        arrivals=arrivals,
                        burstiness=burstiness,
                        model=model,
                        concurrency_limit=concurrency_limit,
                        setting=setting,
                        progress=reporter,
                    )
                    results.append(result)
                    if reporter is not None:
                        reporter.end_run(result)
    finally:
        if reporter is not None:
            reporter.close()
    return results


def _setting_label(setting: dict[str, float | int]) -> str:
    return " ".join(f"{name}={value:g}" for name, value in setting.items())


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
                _setting_label(r.setting) or "-",
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
        writer = csv.DictWriter(f, fieldnames=RECORD_FIELDS)
        writer.writeheader()
        for record in records:
            writer.writerow(
                {
                    **record,
                    "setting": _setting_label(record["setting"]),
                    "errors_by_status": json.dumps(record["errors_by_status"]),
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
        by_setting.setdefault(_setting_label(record["setting"]) or "-", []).append(record)
    for label, runs in by_setting.items():
        runs = sorted(runs, key=lambda r: r["rate"])
        rates = [r["rate"] for r in runs]
        for q, dash in (("p50", "dot"), ("p99", "solid")):
            figure.add_trace(
                go.Scatter(x=rates, y=[r[f"{q}_e2el_ms"] for r in runs], name=f"{label} {q}",
                           line={"dash": dash}, legendgroup=label),
                row=1, col=1,
            )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=rates, y=[r["request_throughput"] for r in runs],
                       name=f"{label} completed/s", legendgroup=label),
            row=1, col=2,
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=rates, y=[r["goodput"] for r in runs], name=f"{label} goodput/s",
                       legendgroup=label),
            row=1, col=3,
        )  # fmt: skip
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


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _lognormal_spec(text: str) -> tuple[float, float, int]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"looks like MEDIAN:SIGMA[:MAX], got {text!r}")
    median, sigma = float(parts[0]), float(parts[1])
    maximum = int(parts[2]) if len(parts) == 3 else 2048
    if median <= 0 or sigma < 0 or maximum < 1:
        raise argparse.ArgumentTypeError(f"median > 0, sigma >= 0, max >= 1; got {text!r}")
    return median, sigma, maximum


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope-loadgen",
        description="Open-loop load against an OpenAI-style server (the demo server, vLLM): "
        "latency percentiles, TTFT, errors and goodput per rate.",
    )
    parser.add_argument(
        "--base-url", "--url", dest="url", default="http://127.0.0.1:8000", help="server base URL"
    )
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="embeddings")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name sent in each request")
    parser.add_argument(
        "--rates",
        type=_floats,
        default=[10.0, 50.0, 100.0, 200.0],
        help="requests per second, comma-separated",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--arrivals", choices=ARRIVAL_PROCESSES, default="poisson")
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma arrivals: shape of the gaps; 1 is Poisson, below 1 burstier",
    )
    parser.add_argument(
        "--concurrency-limit",
        type=int,
        default=None,
        help="at most this many requests in flight; more arrivals are dropped",
    )
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument(
        "--max-tokens",
        type=_ints,
        default=[16],
        help="completions: output length, or a comma list drawn at random",
    )
    lengths.add_argument(
        "--output-len-dist",
        type=_lognormal_spec,
        metavar="MEDIAN:SIGMA[:MAX]",
        help="completions: log-normal output lengths",
    )
    lengths.add_argument(
        "--output-len-file",
        metavar="PATH",
        help="completions: output lengths in order (cycled), from any file "
        "batchscope-static-util reads",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="NAME=V1,V2",
        help="sweep a server setting via POST /admin/config (repeatable)",
    )
    parser.add_argument(
        "--sweep-max-wait",
        type=_floats,
        metavar="MS1,MS2",
        help="shorthand for --set max_wait_ms=MS1,MS2",
    )
    parser.add_argument("--slo-ms", type=float, default=None, help="goodput: answers within this")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="result file (JSON); a CSV lands beside it")
    parser.add_argument(
        "--plot", action="store_true", help="with --output: plotly charts as .html (and .png)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, print the table (or JSON) to stdout, write the files; 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if any(rate <= 0 for rate in args.rates) or args.duration <= 0 or args.burstiness <= 0:
        print("rates, duration and burstiness must be above 0", file=sys.stderr)
        return 2
    if args.plot and args.output is None:
        parser.error("--plot needs --output")
    settings = list(args.settings)
    if args.sweep_max_wait:
        settings.append(("max_wait_ms", [_number(f"{v:g}") for v in args.sweep_max_wait]))
    output_lengths = None
    if args.output_len_file:
        try:
            output_lengths = lengths_from_file(args.output_len_file)
        except (OSError, InputError) as error:
            print(f"--output-len-file: {error}", file=sys.stderr)
            return 2
    elif args.output_len_dist:
        median, sigma, maximum = args.output_len_dist
        output_lengths = lognormal_lengths(
            MAX_REQUESTS_PER_RUN, median, sigma, maximum, random.Random(args.seed)
        )
    results = asyncio.run(
        sweep(
            args.url,
            args.endpoint,
            args.rates,
            args.duration,
            settings=settings,
            seed=args.seed,
            max_tokens=args.max_tokens,
            output_lengths=output_lengths,
            arrivals=args.arrivals,
            burstiness=args.burstiness,
            model=args.model,
            concurrency_limit=args.concurrency_limit,
            timeout_s=args.timeout,
            progress=sys.stderr,
        )
    )
    if args.json:
        print(json.dumps([r.summary() for r in results], indent=2))
    else:
        print(format_table(results))
    records = [r.record(args.slo_ms) for r in results]
    for record in records:
        if record["behind_schedule"]:
            print(f"rate {record['rate']:g}/s: {behind_schedule_note(record)}", file=sys.stderr)
    if args.output is not None:
        meta = {
            "base_url": args.url,
            "endpoint": args.endpoint,
            "arrivals": args.arrivals,
            "burstiness": args.burstiness,
            "slo_ms": args.slo_ms,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        for written in write_results(args.output, records, meta):
            print(f"wrote {written}", file=sys.stderr)
        if args.plot:
            for note in write_plots(args.output.with_suffix(".html"), records):
                print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
