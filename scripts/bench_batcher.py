"""Benchmark: the embedding batcher, fixed (seed 000) against adaptive (seed 001).

Three parts, each run side by side in one process so the shared machine's noise falls
on both sides alike:

1. Seed 001's table on `sim:h200` with a 70 ms p99 budget: fixed 8 items / 15 ms
   against adaptive (budget 70 ms, max batch 128). In-process, the batcher in front of
   the simulated device alone (each batch sleeps the H200 encoder's measured cost for its
   size), swept over offered rates to find each side's peak; then both at 10% of the
   adaptive peak. Over HTTP, the demo server (`--device sim:h200`, the real encoder paced
   to the curve) under `batchscope-loadgen` at 40 req/s: on this machine the HTTP layer
   saturates long before the simulated device, so the peak is found in-process.
   The simulated device's busy fraction is its execution seconds over the run's seconds.
   The p99 targets are verdicts on the shared machine's tail, so they are taken from
   interleaved repetitions (fixed, adaptive, fixed, ...; each pair on the same arrival
   schedule): in-process the median of the pairs' ratios; over HTTP at 40 req/s, where
   one run holds a few hundred requests, the p99 of all repetitions' requests pooled.
2. Seed 000's sweep: p50 and p99 against the offered rate for several `max_wait` values
   (fixed policy, max batch 32), on the CPU (the real encoder, one torch thread) and on
   `sim:h200`, as one chart.
3. Overhead: in-process requests per second with a model that returns at once, this
   batcher (fixed, 32 / 5 ms, metrics on) against seed 000's plain asyncio `Batcher`,
   closed loop (all requests submitted at once), interleaved repetitions, medians.

Latency is measured from each request's scheduled arrival (open loop), so a driver or
event loop that falls behind shows as latency, never as a lower offered load.

    .venv/bin/python scripts/bench_batcher.py --output /tmp/batcher.md [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from batchscope.demo_server.devices import Device, select_device
from batchscope.demo_server.embedding.batcher import Batcher
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.embedding.service import Encoder
from batchscope.demo_server.loadgen import report as loadgen_report
from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen import workload
from batchscope.demo_server.loadgen.arrivals import open_loop
from batchscope.demo_server.queueing import QueueFull
from batchscope.exporter.instrumentation import BatcherMetrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import NotReady, free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUDGET_MS = 70.0
FIXED = BatcherSettings(mode="fixed", max_batch_size=8, max_wait_seconds=0.015)
ADAPTIVE = BatcherSettings(mode="adaptive", max_batch_size=128, latency_budget_seconds=0.070)
MAX_QUEUE = 1024
TEXT = "the quick brown fox jumps over the lazy dog"
PEAK_RATES = (1000, 2000, 3000, 4000, 5000, 6000, 8000)
HTTP_RATE = 40.0  # the target's rate
HTTP_BUSY_RATE = 400.0  # near where this machine's HTTP layer saturates
# Interleaved repetitions for the p99 verdicts: (repetitions, seconds each), full / quick.
LIGHT_REPEATS = {False: (5, 4.0), True: (2, 1.0)}
# 4 x 12 s at 40 req/s: ~1,900 requests a side pooled (a p99 from under ~1,000 is noise).
HTTP_REPEATS = {False: (4, 12.0), True: (1, 4.0)}
HTTP_BUSY_SECONDS = {False: 6.0, True: 3.0}
SWEEP_WAITS_MS = (0.0, 2.0, 5.0, 10.0)
SWEEP_RATES = (100, 300, 1000, 2000)
CHART_DIR = ROOT / "docs" / "bench"
TARGET_PEAK_GAIN = 1.6
TARGET_P99_RATIO = 0.6


@dataclass
class Run:
    """One offered rate against one batcher: what was answered, how fast, how late."""

    label: str
    rate: float
    seconds: float = 0.0
    sent: int = 0
    rejected: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    busy_seconds: float = 0.0
    mean_batch: float | None = None

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float | None:
        return loadgen_report.percentile(self.latencies_ms, q)

    @property
    def busy_fraction(self) -> float:
        return self.busy_seconds / self.seconds if self.seconds else 0.0


def paced_model(device: Device) -> Callable[[list[str]], list[list[float]]]:
    """The simulated device alone: each batch costs what the H200 encoder's batch does."""

    def run(texts: list[str]) -> list[list[float]]:
        device.pace("encoder", len(texts), time.perf_counter())
        return [[0.0]] * len(texts)

    return run


def encoder_model(device: Device) -> Callable[[list[str]], list[list[float]]]:
    """The demo server's real encoder, paced to the device's curve when simulated."""
    encoder = Encoder(seed=0).eval()

    def run(texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = encoder.embed(texts)
        device.pace("encoder", len(texts), started)
        return vectors

    return run


def registry_value(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name, {"batcher": "bench"}) or 0.0


async def offer(
    model: Callable[[list[str]], list[list[float]]],
    settings: BatcherSettings,
    rate: float,
    seconds: float,
    seed: int,
    label: str,
) -> Run:
    """Poisson arrivals of one-text requests at `rate` for `seconds` into a fresh batcher
    (its cost curve measured first, as the demo server does at start)."""
    registry = CollectorRegistry()
    metrics = BatcherMetrics("bench", max_batch_size=settings.max_batch_size, registry=registry)
    batcher = Batcher(model, settings=settings, max_queue=MAX_QUEUE, metrics=metrics)
    size = 1
    while size <= settings.max_batch_size:
        started = time.perf_counter()
        model([TEXT] * size)
        batcher.cost_curve.observe(size, time.perf_counter() - started)
        size *= 2
    await batcher.start()
    run = Run(label, rate)

    async def one(_: int, scheduled_at: float) -> None:
        try:
            await batcher.submit([TEXT])
        except QueueFull:
            run.rejected += 1
            return
        run.latencies_ms.append((time.perf_counter() - scheduled_at) * 1000.0)

    offered = await open_loop(rate, seconds, random.Random(seed), one)
    run.seconds = max(seconds, offered.elapsed_s)
    await batcher.stop()
    run.sent = offered.sent
    run.busy_seconds = registry_value(registry, "batchscope_batcher_execution_seconds_sum")
    batches = registry_value(registry, "batchscope_batcher_batch_size_count")
    items = registry_value(registry, "batchscope_batcher_batch_size_sum")
    run.mean_batch = items / batches if batches else None
    return run


# --- 1. seed 001's table ------------------------------------------------------------


def peak(runs: Sequence[Run], within_ms: float | None) -> Run:
    """The run with the highest throughput (with p99 within `within_ms`, when given)."""
    eligible = [r for r in runs if within_ms is None or (r.p(99) or 1e9) <= within_ms]
    return max(eligible or runs, key=lambda r: r.throughput)


def seed001_in_process(quick: bool) -> dict[str, Any]:
    device = select_device("sim:h200")
    model = paced_model(device)
    seconds = 1.0 if quick else 2.5
    rates = PEAK_RATES[::3] if quick else PEAK_RATES
    sweep: dict[str, list[Run]] = {"fixed": [], "adaptive": []}
    for i, rate in enumerate(rates):
        for label, settings in (("fixed", FIXED), ("adaptive", ADAPTIVE)):
            print(f"seed 001 in-process: {label} at {rate}/s", file=sys.stderr, flush=True)
            sweep[label].append(asyncio.run(offer(model, settings, rate, seconds, i, label)))
    fixed_peak = peak(sweep["fixed"], None)
    adaptive_peak = peak(sweep["adaptive"], BUDGET_MS)
    light_rate = round(adaptive_peak.throughput / 10)
    repeats, light_seconds = LIGHT_REPEATS[quick]
    light: dict[str, list[Run]] = {"fixed": [], "adaptive": []}
    for repeat in range(repeats):
        for label, settings in (("fixed", FIXED), ("adaptive", ADAPTIVE)):
            print(
                f"seed 001 in-process at 10% load: {label}, repetition {repeat + 1}",
                file=sys.stderr,
                flush=True,
            )
            run = offer(model, settings, light_rate, light_seconds, 100 + repeat, label)
            light[label].append(asyncio.run(run))
    return {
        "sweep": sweep,
        "fixed_peak": fixed_peak,
        "adaptive_peak": adaptive_peak,
        "light": light,
    }


def serve(settings: BatcherSettings) -> tuple[subprocess.Popen[bytes], str]:
    """A demo server on sim:h200 with these embedding settings; returns it and its URL
    once it answers."""
    port = free_port()
    ms = settings.as_ms()
    args = [
        sys.executable,
        "-m",
        "batchscope.demo_server.cli",
        "--port",
        str(port),
        "--device",
        "sim:h200",
        "--embed-batching",
        settings.mode,
        "--max-batch-size",
        str(settings.max_batch_size),
        "--max-wait-ms",
        str(ms["max_wait_ms"]),
        "--latency-budget-ms",
        str(ms["latency_budget_ms"]),
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", 120, processes=[process])
    except NotReady:
        process.kill()
        raise
    return process, url


def seed001_http(quick: bool) -> dict[str, Any]:
    """Both modes' servers up at once; the load generator at HTTP_RATE on each in turn
    (interleaved repetitions, a pair on the same arrival schedule), then HTTP_BUSY_RATE
    on each. Returns `light`: the HTTP_RATE results by mode, one per repetition, and
    `busy`: the HTTP_BUSY_RATE result records by mode."""
    repeats, seconds = HTTP_REPEATS[quick]
    modes = (("fixed", FIXED), ("adaptive", ADAPTIVE))
    servers = {label: serve(settings) for label, settings in modes}
    light: dict[str, list[loadgen_report.RunResult]] = {"fixed": [], "adaptive": []}
    busy: dict[str, dict[str, Any]] = {}
    try:
        for repeat in range(repeats):
            for label, _ in modes:
                print(
                    f"seed 001 over HTTP: {label} at {HTTP_RATE:g} req/s, repetition {repeat + 1}",
                    file=sys.stderr,
                    flush=True,
                )
                url = servers[label][1]
                spec = workload.LoadSpec(rates=(HTTP_RATE,), duration_s=seconds, seed=7 + repeat)
                run = loadgen.sweep(url, spec)
                light[label] += asyncio.run(run)
        for label, _ in modes:
            print(
                f"seed 001 over HTTP: {label} at {HTTP_BUSY_RATE:g} req/s",
                file=sys.stderr,
                flush=True,
            )
            spec = workload.LoadSpec(
                rates=(HTTP_BUSY_RATE,), duration_s=HTTP_BUSY_SECONDS[quick], seed=7
            )
            run = loadgen.sweep(servers[label][1], spec)
            busy[label] = asyncio.run(run)[0].record(BUDGET_MS)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(30)
    return {"light": light, "busy": busy}


# --- 2. seed 000's sweep ------------------------------------------------------------


def seed000_sweep(quick: bool) -> list[tuple[str, float, Run]]:
    seconds = 0.8 if quick else 1.5
    rows = []
    for device_name in ("cpu", "sim:h200"):
        device = select_device(device_name)
        model = encoder_model(device) if device_name == "cpu" else paced_model(device)
        for wait_ms in SWEEP_WAITS_MS:
            settings = BatcherSettings(max_batch_size=32, max_wait_seconds=wait_ms / 1000.0)
            for rate in SWEEP_RATES:
                print(
                    f"seed 000 sweep: {device_name} wait {wait_ms:g} ms at {rate}/s",
                    file=sys.stderr,
                    flush=True,
                )
                run = asyncio.run(offer(model, settings, rate, seconds, rate, f"{wait_ms:g} ms"))
                rows.append((device_name, wait_ms, run))
    return rows


def sweep_chart(rows: Sequence[tuple[str, float, Run]], stem: Path) -> list[str]:
    """p50 (dotted) and p99 (solid) vs rate per max_wait, one panel per device; HTML and,
    when a headless Chromium renders it, PNG. Returns the files written."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    devices = sorted({d for d, _, _ in rows})
    figure = make_subplots(rows=1, cols=len(devices), subplot_titles=devices)
    for col, device in enumerate(devices, start=1):
        for wait in SWEEP_WAITS_MS:
            runs = [r for d, w, r in rows if d == device and w == wait]
            for q, dash in ((50, "dot"), (99, "solid")):
                figure.add_trace(
                    go.Scatter(
                        x=[r.rate for r in runs],
                        y=[r.p(q) for r in runs],
                        name=f"{device} max_wait {wait:g} ms p{q}",
                        line={"dash": dash},
                    ),
                    row=1,
                    col=col,
                )
    figure.update_xaxes(title_text="offered rate (req/s)", type="log")
    figure.update_yaxes(title_text="latency (ms)", type="log")
    figure.update_layout(width=1400, height=520, title="seed 000: latency vs rate by max_wait")
    stem.parent.mkdir(parents=True, exist_ok=True)
    html = stem.with_suffix(".html")
    figure.write_html(html, include_plotlyjs="cdn")
    written = [html.name]
    if "BROWSER_PATH" not in os.environ and os.path.exists(loadgen_report.CHROMIUM):
        os.environ["BROWSER_PATH"] = loadgen_report.CHROMIUM
    try:
        figure.write_image(stem.with_suffix(".png"))
        written.append(stem.with_suffix(".png").name)
    except Exception as error:  # kaleido missing or no browser
        print(f"PNG chart skipped: {error}", file=sys.stderr)
    return written


# --- 3. overhead ----------------------------------------------------------------------


class SeedBatcher:
    """Seed 000's plain asyncio Batcher, as printed there."""

    def __init__(
        self, predict: Callable[[list[str]], list[Any]], max_size: int = 32, max_wait: float = 0.005
    ) -> None:
        self.predict = predict
        self.max_size = max_size
        self.max_wait = max_wait
        self.queue: asyncio.Queue[tuple[str, asyncio.Future[Any]]] = asyncio.Queue()

    async def submit(self, item: str) -> Any:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((item, future))
        return await future

    async def run(self) -> None:
        while True:
            item, future = await self.queue.get()
            batch = [(item, future)]
            deadline = asyncio.get_running_loop().time() + self.max_wait
            while len(batch) < self.max_size:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), timeout))
                except TimeoutError:
                    break
            outputs = self.predict([i for i, _ in batch])
            for (_, f), out in zip(batch, outputs, strict=True):
                f.set_result(out)


def instant(texts: list[str]) -> list[int]:
    return [1] * len(texts)


async def seed_rate(requests: int) -> float:
    batcher = SeedBatcher(instant)
    worker = asyncio.create_task(batcher.run())
    started = time.perf_counter()
    await asyncio.gather(*(batcher.submit(TEXT) for _ in range(requests)))
    seconds = time.perf_counter() - started
    worker.cancel()
    return requests / seconds


async def ours_rate(requests: int) -> float:
    metrics = BatcherMetrics("bench", max_batch_size=32, registry=CollectorRegistry())
    batcher = Batcher(
        instant,
        settings=BatcherSettings(max_batch_size=32, max_wait_seconds=0.005),
        max_queue=requests,
        metrics=metrics,
    )
    await batcher.start()
    started = time.perf_counter()
    await asyncio.gather(*(batcher.submit([TEXT]) for _ in range(requests)))
    seconds = time.perf_counter() - started
    await batcher.stop()
    return requests / seconds


def overhead(quick: bool) -> dict[str, list[float]]:
    requests, repeats = (5000, 3) if quick else (20000, 7)
    rates: dict[str, list[float]] = {"seed 000 Batcher": [], "batchscope Batcher": []}
    for _ in range(repeats):
        rates["seed 000 Batcher"].append(asyncio.run(seed_rate(requests)))
        rates["batchscope Batcher"].append(asyncio.run(ours_rate(requests)))
    return rates


# --- report ---------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _refused(record: dict[str, Any]) -> int:
    return record["errors_by_status"].get("429", 0)


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _ratio(adaptive: float | None, fixed: float | None) -> float:
    return (adaptive or 0.0) / (fixed or 1.0)


def _pooled(results: Sequence[loadgen_report.RunResult]) -> list[float]:
    return [ms for result in results for ms in result.latencies_ms]


def light_load_lines(light: dict[str, list[Run]]) -> list[str]:
    """Each interleaved repetition at 10% load: p99 by mode and the pair's ratio."""
    lines = [
        f"p99 at 10% load ({light['adaptive'][0].rate:g} req/s), each interleaved "
        "repetition (fixed, then adaptive on the same arrival schedule):",
        "",
        "| repetition | requests a side | fixed p99 (ms) | adaptive p99 (ms) | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, (fixed, adaptive) in enumerate(zip(light["fixed"], light["adaptive"], strict=True)):
        lines.append(
            f"| {i + 1} | {len(adaptive.latencies_ms):,} | {_ms(fixed.p(99))} | "
            f"{_ms(adaptive.p(99))} | {_ratio(adaptive.p(99), fixed.p(99)):.2f}x |"
        )
    return lines + [""]


def http_light_lines(light: dict[str, list[loadgen_report.RunResult]]) -> list[str]:
    """Each interleaved repetition at HTTP_RATE, and the requests of all pooled."""
    lines = [
        f"HTTP at {HTTP_RATE:g} req/s, each interleaved repetition, and all pooled (the verdict):",
        "",
        "| repetition | requests fixed / adaptive | fixed p99 (ms) | adaptive p99 (ms) | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for i, (fixed, adaptive) in enumerate(zip(light["fixed"], light["adaptive"], strict=True)):
        lines.append(
            f"| {i + 1} | {fixed.ok} / {adaptive.ok} | {_ms(fixed.p99_ms)} | "
            f"{_ms(adaptive.p99_ms)} | {_ratio(adaptive.p99_ms, fixed.p99_ms):.2f}x |"
        )
    fixed_all, adaptive_all = _pooled(light["fixed"]), _pooled(light["adaptive"])
    fixed_p99 = loadgen_report.percentile(fixed_all, 99)
    adaptive_p99 = loadgen_report.percentile(adaptive_all, 99)
    lines.append(
        f"| pooled | {len(fixed_all):,} / {len(adaptive_all):,} | {_ms(fixed_p99)} | "
        f"{_ms(adaptive_p99)} | {_ratio(adaptive_p99, fixed_p99):.2f}x |"
    )
    return lines + [""]


def markdown(
    one: dict[str, Any],
    http_runs: dict[str, Any],
    sweep: list[tuple[str, float, Run]],
    charts: list[str],
    over: dict[str, list[float]],
    command: str,
) -> str:
    fixed_peak, adaptive_peak = one["fixed_peak"], one["adaptive_peak"]
    light = one["light"]
    light_fixed_p99 = statistics.median(r.p(99) or 0.0 for r in light["fixed"])
    light_adaptive_p99 = statistics.median(r.p(99) or 0.0 for r in light["adaptive"])
    light_ratio = statistics.median(
        _ratio(a.p(99), f.p(99)) for f, a in zip(light["fixed"], light["adaptive"], strict=True)
    )
    gain = adaptive_peak.throughput / fixed_peak.throughput
    http_fixed = _pooled(http_runs["light"]["fixed"])
    http_adaptive = _pooled(http_runs["light"]["adaptive"])
    http = {
        "fixed": {q: loadgen_report.percentile(http_fixed, q) for q in (50, 99)},
        "adaptive": {q: loadgen_report.percentile(http_adaptive, q) for q in (50, 99)},
    }
    http_ratio = _ratio(http["adaptive"][99], http["fixed"][99])
    busy = http_runs["busy"]
    adaptive_within = (adaptive_peak.p(99) or 1e9) <= BUDGET_MS
    lines = [
        "# Benchmark: the embedding batcher, fixed vs adaptive (seeds 000 and 001)",
        "",
        f"Command: `{command}`. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Machine: nproc {len(os.sched_getaffinity(0))}, load average at the end "
        f"{os.getloadavg()[0]:.1f} (other jobs share it), torch {torch.__version__}, "
        "GPU: none in this session (every GPU number is the simulated H200, `sim:h200`: "
        "each batch waits out the encoder cost measured on an H200 for its size, "
        "`anchors/h200-batch-cost.json`).",
        "",
        "## Seed 001's table: fixed 8 / 15 ms vs adaptive, 70 ms p99 budget, sim:h200",
        "",
        "In-process rows drive the batcher directly (no HTTP; the batch function is the "
        "simulated device alone); the HTTP row is the demo server (real encoder paced to "
        "the H200 curve) under `batchscope-loadgen`. Peak: the highest throughput over the "
        f"offered rates {', '.join(str(r) for r in PEAK_RATES)} req/s (adaptive: among "
        "rates whose p99 stays within the budget; fixed: whatever its p99, as seed 001 "
        "reports it). Latency from each request's scheduled arrival.",
        "",
        "| row | fixed 8 / 15 ms | adaptive, 70 ms budget | adaptive / fixed | target | |",
        "|---|---:|---:|---:|---|---|",
        f"| in-process: peak throughput (req/s) | {fixed_peak.throughput:,.0f} "
        f"(offered {fixed_peak.rate:g}) | {adaptive_peak.throughput:,.0f} "
        f"(offered {adaptive_peak.rate:g}) | {gain:.2f}x | >= {TARGET_PEAK_GAIN}x, adaptive "
        f"p99 within budget | {_met(gain >= TARGET_PEAK_GAIN and adaptive_within)} |",
        f"| in-process: p99 at peak (ms) | {_ms(fixed_peak.p(99))} | "
        f"{_ms(adaptive_peak.p(99))} | | adaptive <= {BUDGET_MS:g} | {_met(adaptive_within)} |",
        f"| in-process: p99 at 10% load, {light['adaptive'][0].rate:g} req/s (ms; medians "
        f"of {len(light['adaptive'])} interleaved repetitions, ratio: median of the pairs') | "
        f"{_ms(light_fixed_p99)} | {_ms(light_adaptive_p99)} | {light_ratio:.2f}x | "
        f"<= {TARGET_P99_RATIO}x | {_met(light_ratio <= TARGET_P99_RATIO)} |",
        f"| in-process: simulated device busy at peak | {fixed_peak.busy_fraction:.0%} | "
        f"{adaptive_peak.busy_fraction:.0%} | | (seed 001: 61% / 84%) | |",
        f"| in-process: mean batch at peak | {fixed_peak.mean_batch or 0:.1f} | "
        f"{adaptive_peak.mean_batch or 0:.1f} | | | |",
        f"| in-process: refused at peak (429) | {fixed_peak.rejected} of {fixed_peak.sent} | "
        f"{adaptive_peak.rejected} of {adaptive_peak.sent} | | | |",
        f"| HTTP, {HTTP_RATE:g} req/s: p99 (ms; {len(http_fixed):,} / {len(http_adaptive):,} "
        f"requests pooled over {len(http_runs['light']['fixed'])} interleaved repetitions) | "
        f"{_ms(http['fixed'][99])} | {_ms(http['adaptive'][99])} | {http_ratio:.2f}x | "
        f"<= {TARGET_P99_RATIO}x | {_met(http_ratio <= TARGET_P99_RATIO)} |",
        f"| HTTP, {HTTP_RATE:g} req/s: p50 (ms, pooled) | {_ms(http['fixed'][50])} | "
        f"{_ms(http['adaptive'][50])} | | | |",
        f"| HTTP, {HTTP_BUSY_RATE:g} req/s: p50 / p99 (ms) | "
        f"{_ms(busy['fixed']['p50_e2el_ms'])} / {_ms(busy['fixed']['p99_e2el_ms'])} | "
        f"{_ms(busy['adaptive']['p50_e2el_ms'])} / {_ms(busy['adaptive']['p99_e2el_ms'])} | | | |",
        f"| HTTP, {HTTP_BUSY_RATE:g} req/s: completed/s, refused (429) | "
        f"{busy['fixed']['request_throughput']:.0f}, {_refused(busy['fixed'])} | "
        f"{busy['adaptive']['request_throughput']:.0f}, {_refused(busy['adaptive'])} | | | |",
        "",
        "Over HTTP the demo server runs its real encoder on this CPU under the pacing, and "
        "from a few items per batch that compute already takes longer than the H200 would "
        "(the server counts each such batch in `simulated_overruns`): the HTTP rows at "
        f"{HTTP_BUSY_RATE:g} req/s measure this CPU, not the H200. There the adaptive server "
        "refuses at once (429) what its measured costs say cannot make the budget, where "
        "the fixed pair queues.",
        "",
        *light_load_lines(light),
        *http_light_lines(http_runs["light"]),
        "The in-process sweep (offered rate: completed req/s, p99 ms, refused):",
        "",
        "| offered req/s | fixed | adaptive |",
        "|---:|---|---|",
    ]
    for fixed_run, adaptive_run in zip(
        one["sweep"]["fixed"], one["sweep"]["adaptive"], strict=True
    ):
        cells = [
            f"{r.throughput:,.0f}/s, p99 {_ms(r.p(99))}, {r.rejected} refused"
            for r in (fixed_run, adaptive_run)
        ]
        lines.append(f"| {fixed_run.rate:g} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "## Seed 000's sweep: latency vs rate by max_wait (fixed policy, max batch 32)",
        "",
        "CPU: the demo server's real encoder on one torch thread; sim:h200: the simulated "
        f"device. Chart: {', '.join(f'[{c}](bench/{c})' for c in charts)}.",
        "",
    ]
    if any(c.endswith(".png") for c in charts):
        lines += ["![seed 000 sweep](bench/seed000-sweep.png)", ""]
    lines += [
        "| device | max_wait ms | "
        + " | ".join(f"{r} req/s p50 / p99" for r in SWEEP_RATES)
        + " |",
        "|---|---:|" + "---:|" * len(SWEEP_RATES),
    ]
    for device in ("cpu", "sim:h200"):
        for wait in SWEEP_WAITS_MS:
            runs = [r for d, w, r in sweep if d == device and w == wait]
            cells = " | ".join(f"{_ms(r.p(50))} / {_ms(r.p(99))}" for r in runs)
            lines.append(f"| {device} | {wait:g} | {cells} |")
    seed_rate_median = statistics.median(over["seed 000 Batcher"])
    ours_median = statistics.median(over["batchscope Batcher"])
    lines += [
        "",
        "## Batcher overhead: a model that returns at once",
        "",
        "Closed loop: all requests submitted at once, max batch 32, max wait 5 ms; "
        f"{len(over['seed 000 Batcher'])} interleaved repetitions, medians. batchscope's "
        "Batcher with its metrics on (prometheus-client), its batch function on its own "
        "thread; seed 000's runs `predict` on the event loop.",
        "",
        "| batcher | req/s, median | runs |",
        "|---|---:|---|",
        f"| seed 000 plain asyncio Batcher | {seed_rate_median:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in over["seed 000 Batcher"])
        + " |",
        f"| batchscope Batcher (fixed, metrics on) | {ours_median:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in over["batchscope Batcher"])
        + " |",
        "",
        f"Ratio {ours_median / seed_rate_median:.2f}x; target no slower (>= 1.0x): "
        f"{_met(ours_median >= seed_rate_median)}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test")
    parser.add_argument("--output", type=Path, help="write the report here (else stdout)")
    parser.add_argument("--chart-dir", type=Path, default=CHART_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gc.freeze()  # as the demo server does once started: no full-collection pauses from torch
    command = shlex.join(["python", "scripts/bench_batcher.py", *(argv or sys.argv[1:])])
    over = overhead(args.quick)
    one = seed001_in_process(args.quick)
    http = seed001_http(args.quick)
    sweep = seed000_sweep(args.quick)
    charts = sweep_chart(sweep, args.chart_dir / "seed000-sweep")
    report = markdown(one, http, sweep, charts, over, command)
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
