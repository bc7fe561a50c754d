"""The advice held against the truth on the demo server, in one run.

KV cache (the checklist of "Continuous Batching: Why Your GPU Waits for the Slowest
Request"): the demo server with a small KV cache (`--kv-cache-tokens`) under the load
generator at a fixed length mix, requests always waiting. Three phases:

1. cap C, small cache: the exporter's advised sustainable concurrency against the running
   count the server settles at (its own /metrics, sampled while requests wait);
2. the cap raised past it through POST /admin/config: throughput should not rise;
3. the server restarted with the advised `--kv-cache-tokens` for cap C: running should
   reach the cap.

In-house batcher (the fixed policy of "Batching Requests to a Model Server"): the
embedding batcher on `sim:h200` with a fixed pair that is wrong for the traffic; the
exporter's advised pair is applied through the admin endpoint and the p99 at the same
rate is held against the budget.

Gates: the advised sustainable concurrency within 10% of the running batch the server
measures; the cap raised, tokens per step at most 1.25x; with the advised KV tokens,
running at least 90% of the cap; the advised pair's p99 within the budget.

    .venv/bin/python scripts/bench_advice.py [--quick] [--output FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import benchmark

from batchscope.demo_server.loadgen import report as loadgen_report
from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen.workload import LoadSpec
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.engines import read_series
from batchscope.exporter.ingest import promtext
from batchscope.exporter.scrape.loop import Exporter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WINDOW_S = 30.0
INTERVAL_S = 1.0
SAMPLE_S = 0.5
STEPS = "batchscope_demo_steps_total"


@dataclass
class Phase:
    """One load phase: what the server did (its own /metrics) and what the exporter advised."""

    name: str
    cap: int
    kv_cache_tokens: int
    running: list[float] = field(default_factory=list)  # sampled while requests waited
    tokens_per_s: float = 0.0
    # Generated tokens per busy step (the server's counters): every running request makes
    # one token a step, so this is the mean running batch over every step, and the
    # throughput per step of the device, which the shared CPU's speed does not change.
    tokens_per_step: float = 0.0
    advice: dict[str, float] = field(default_factory=dict)
    summary: str = ""

    @property
    def sampled_running(self) -> float:
        """Mean of the running counts sampled while requests waited."""
        return statistics.fmean(self.running) if self.running else math.nan


@contextlib.contextmanager
def demo_server(*flags: str) -> Iterator[str]:
    """`python -m batchscope.demo_server.cli` with these flags on a free port; yields its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile(prefix="demo-server-", suffix=".log") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.demo_server.cli",
                "--port",
                str(port),
                "--log-level",
                "warning",
                *flags,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait_http(f"{url}/health", 60, Path(log.name), processes=[proc])
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def advice_numbers(series: SeriesSignals) -> dict[str, float]:
    return {item.kind: item.value for item in series.advice.items}


def engine_series(signals, engine: str) -> SeriesSignals:
    (series,) = [s for s in signals.series if s.engine == engine]
    return series


async def drive(
    url: str,
    exporter: Exporter,
    phase_seconds: float,
    warmup_seconds: float,
    make_load,
    on_sample,
) -> tuple[loadgen_report.RunResult, TargetSignals | None]:
    """Run `make_load(session)` while the exporter scrapes on its schedule and
    `on_sample(text, t)` reads the server's /metrics every SAMPLE_S (after the warm-up,
    while load is offered). Returns the load's result and the exporter's last signals
    with the server up while load was offered."""
    timeout = aiohttp.ClientTimeout(total=120)
    stop = asyncio.Event()
    scraping = asyncio.create_task(exporter.run_forever(stop))
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            task = asyncio.create_task(make_load(session))
            start = time.monotonic()
            last = None
            while not task.done():
                elapsed = time.monotonic() - start
                current = exporter.current()
                # A scrape can time out on a loaded machine: keep the last answered one.
                if elapsed < phase_seconds and current and current[0].up:
                    last = current[0]
                if warmup_seconds <= elapsed < phase_seconds:
                    async with session.get(f"{url}/metrics") as response:
                        on_sample(await response.text(), elapsed)
                await asyncio.sleep(SAMPLE_S)
            return await task, last
    finally:
        stop.set()
        await scraping


def kv_window_seconds(args: argparse.Namespace) -> float:
    """The exporter's window in a KV phase: the phase after its warm-up, the seconds the
    server's own measures (sampled running, tokens per step) cover. A longer window would
    hold the fresh server's first steps, which the truth leaves out."""
    return args.phase_seconds - args.warmup_seconds


async def kv_phase(
    url: str, name: str, cap: int, kv_tokens: int, args: argparse.Namespace
) -> Phase:
    phase = Phase(name, cap, kv_tokens)
    exporter = Exporter(
        Settings(
            targets=(Target("demo", f"{url}/metrics", engine="vllm", cap=cap),),
            interval_seconds=INTERVAL_S,
            window_seconds=kv_window_seconds(args),
            timeout_seconds=1.0,
        )
    )
    counters: list[tuple[float, float, float]] = []  # (t, generated tokens, busy steps)

    def on_sample(text: str, t: float) -> None:
        (series,) = read_series(text, "vllm")
        # Requests wait and the scheduler steps (a fresh server's first seconds run nothing).
        if (series.waiting or 0) > 0 and (series.running or 0) > 0:
            phase.running.append(series.running)
        (steps,) = [s.value for s in promtext.parse(text, [STEPS]) if s.name == STEPS]
        counters.append((t, series.generation_tokens_total or 0.0, steps))

    def make_load(session: aiohttp.ClientSession):
        spec = LoadSpec(
            "completions",
            duration_s=args.phase_seconds,
            seed=args.seed,
            max_tokens=(args.max_tokens,),
            concurrency_limit=args.in_flight,
        )
        return loadgen.run_rate(session, url, spec, args.rate)

    _, signals = await drive(
        url, exporter, args.phase_seconds, args.warmup_seconds, make_load, on_sample
    )
    if len(counters) >= 2:
        (t0, n0, s0), (t1, n1, s1) = counters[0], counters[-1]
        phase.tokens_per_s = (n1 - n0) / (t1 - t0)
        phase.tokens_per_step = (n1 - n0) / (s1 - s0) if s1 > s0 else 0.0
    if signals is not None:
        series = engine_series(signals, "vllm")
        phase.advice = advice_numbers(series)
        phase.summary = series.advice.summary
    print(
        f"{name}: running {phase.sampled_running} (n={len(phase.running)}), "
        f"{phase.tokens_per_s:.0f} tokens/s, {phase.tokens_per_step:.2f} tokens/step, "
        f"advice {phase.advice}",
        file=sys.stderr,
    )
    return phase


async def post_admin(url: str, **setting: float) -> None:
    async with aiohttp.ClientSession() as session:
        await loadgen.apply_setting(session, url, setting)


async def kv_check(args: argparse.Namespace) -> list[Phase]:
    """The three KV phases in one run; the third restarts the server with the advice."""
    flags = ["--device", args.device, "--max-num-seqs", str(args.cap)]
    with demo_server(*flags, "--kv-cache-tokens", str(args.kv_tokens)) as url:
        small = await kv_phase(url, "small cache, cap C", args.cap, args.kv_tokens, args)
        raised_cap = 2 * args.cap
        await post_admin(url, max_num_seqs=raised_cap)
        raised = await kv_phase(url, "cap raised past it", raised_cap, args.kv_tokens, args)
    advised = math.ceil(small.advice.get("kv_tokens_for_cap", 0))
    if advised <= 0:
        return [small, raised]
    with demo_server(*flags, "--kv-cache-tokens", str(advised)) as url:
        given = await kv_phase(url, "advised KV tokens, cap C", args.cap, advised, args)
    return [small, raised, given]


@dataclass
class BatcherRun:
    name: str
    max_batch_size: int
    max_wait_ms: float
    rate: float
    p99_ms: float | None
    ok: int
    server_p99_ms: float | None = None
    advice: dict[str, float] = field(default_factory=dict)
    summary: str = ""


async def batcher_run(url: str, name: str, settings: tuple[int, float], args) -> BatcherRun:
    exporter = Exporter(
        Settings(
            targets=(Target("demo", f"{url}/metrics", budget_seconds=args.budget_ms / 1000),),
            interval_seconds=INTERVAL_S,
            window_seconds=WINDOW_S,
            timeout_seconds=1.0,
        )
    )

    def make_load(session: aiohttp.ClientSession):
        spec = LoadSpec(duration_s=args.phase_seconds, seed=args.seed)
        return loadgen.run_rate(session, url, spec, args.embed_rate)

    result, signals = await drive(
        url, exporter, args.phase_seconds, args.phase_seconds, make_load, lambda text, t: None
    )
    run = BatcherRun(name, settings[0], settings[1], args.embed_rate, result.p99_ms, result.ok)
    if signals is not None:
        series = engine_series(signals, "inhouse")
        run.advice = advice_numbers(series)
        run.summary = series.advice.summary
        if series.latency_seconds is not None:
            run.server_p99_ms = series.latency_seconds * 1000
    print(
        f"{name}: p99 {result.p99_ms} ms (server {run.server_p99_ms} ms), ok {result.ok}, "
        f"advice {run.advice}",
        file=sys.stderr,
    )
    return run


async def batcher_check(args: argparse.Namespace) -> list[BatcherRun]:
    """A fixed pair wrong for the traffic, then the advised pair, at the same rate."""
    first = (args.embed_max_batch, args.embed_max_wait_ms)
    flags = [
        "--device",
        "sim:h200",
        "--embed-batching",
        "fixed",
        "--max-batch-size",
        str(first[0]),
        "--max-wait-ms",
        str(first[1]),
    ]
    with demo_server(*flags) as url:
        before = await batcher_run(url, "as configured", first, args)
        if "advised_max_batch_size" not in before.advice:
            return [before]
        pair = (
            int(before.advice["advised_max_batch_size"]),
            before.advice["advised_max_wait_seconds"] * 1000,
        )
        await post_admin(url, max_batch_size=pair[0], max_wait_ms=pair[1])
        after = await batcher_run(url, "advised pair", pair, args)
    return [before, after]


def kv_markdown(phases: Sequence[Phase], args: argparse.Namespace) -> str:
    small = phases[0]
    sustainable = small.advice.get("sustainable_concurrency", math.nan)
    lines = [
        f"KV cache: the demo server on `{args.device}`, continuous "
        f"batching, the load generator at {args.rate:g} requests/s offered with at most "
        f"{args.in_flight} in flight, prompts of 3-12 words, max_tokens {args.max_tokens} "
        f"(ignore_eos), {args.phase_seconds:g} s per phase ({args.warmup_seconds:g} s "
        f"warm-up); exporter window {kv_window_seconds(args):g} s (the phase after its "
        f"warm-up) at {INTERVAL_S:g} s. Running is the "
        "server's: generated tokens per busy step from its counters, i.e. the mean running "
        "batch over every step while requests waited (also the throughput per device step, "
        "whatever the shared CPU's speed), and the mean of `vllm:num_requests_running` "
        f"sampled every {SAMPLE_S:g} s (a scrape can fall between a finish and the next "
        "admission). Tokens/s: wall clock, noisy on a shared machine.",
        "",
        "| phase | cap | KV tokens | running per step | running sampled | tokens/s | advised "
        "sustainable | advice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        lines.append(
            f"| {p.name} | {p.cap} | {p.kv_cache_tokens} | {p.tokens_per_step:.2f} | "
            f"{p.sampled_running:.2f} | {p.tokens_per_s:.0f} | "
            f"{p.advice.get('sustainable_concurrency', math.nan):.2f} | "
            f"{p.summary} |"
        )
    error = abs(sustainable - small.tokens_per_step) / small.tokens_per_step
    sampled_error = abs(sustainable - small.sampled_running) / small.sampled_running
    lines += [
        "",
        f"- Advised sustainable concurrency {sustainable:.2f} vs the running batch "
        f"the server settled at, {small.tokens_per_step:.2f} per step: {error:.1%} apart; "
        f"{small.sampled_running:.2f} sampled: {sampled_error:.1%} apart (target: within "
        "10% of the batch measured either way).",
    ]
    if len(phases) >= 2:
        raised = phases[1]
        lines.append(
            f"- Cap raised to {raised.cap}: tokens per step "
            f"x{raised.tokens_per_step / small.tokens_per_step:.2f}, tokens/s "
            f"x{raised.tokens_per_s / small.tokens_per_s:.2f} (the advice said it would "
            "not help)."
        )
    if len(phases) >= 3:
        given = phases[2]
        lines.append(
            f"- Restarted with the advised {given.kv_cache_tokens} KV tokens "
            f"(`kv_tokens_for_cap`): running {given.tokens_per_step:.2f} per step of cap "
            f"{given.cap} ({given.tokens_per_step / given.cap:.0%}), tokens per step "
            f"x{given.tokens_per_step / small.tokens_per_step:.2f}, tokens/s "
            f"x{given.tokens_per_s / small.tokens_per_s:.2f}."
        )
    return "\n".join(lines) + "\n"


def batcher_markdown(runs: Sequence[BatcherRun], args: argparse.Namespace) -> str:
    lines = [
        f"In-house batcher, the advised fixed pair (sim:h200, a SIMULATED device): embeddings at {args.embed_rate:g} requests/s (Poisson) for {args.phase_seconds:g} s, "
        f"budget {args.budget_ms:g} ms (the exporter target's), fixed batching. The device is "
        "simulated: the CPU paced to the H200 cost curve, or slower where the CPU overruns "
        "it (DESIGN.md). p99 (batcher): the exporter's p99 of "
        "`batchscope_batcher_request_latency_seconds` over its window, what the budget is held "
        "against; p99 (client): the load generator's, HTTP included.",
        "",
        "| run | max_batch_size | max_wait | ok | p99 (batcher) | p99 (client) | within budget | "
        "advice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        within = r.server_p99_ms is not None and r.server_p99_ms <= args.budget_ms
        lines.append(
            f"| {r.name} | {r.max_batch_size} | {r.max_wait_ms:.1f} ms | {r.ok} | "
            f"{_ms(r.server_p99_ms)} | {_ms(r.p99_ms)} | {'yes' if within else 'no'} | "
            f"{r.summary} |"
        )
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="sim:h200")
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--kv-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--in-flight", type=int, default=48)
    parser.add_argument("--phase-seconds", type=float, help="a phase's length (35; quick 20)")
    parser.add_argument("--warmup-seconds", type=float, help="its warm-up (10; quick 8)")
    parser.add_argument("--seed", type=int, default=3, help="random seed of the load")
    parser.add_argument("--embed-rate", type=float, default=50.0)
    parser.add_argument("--embed-max-batch", type=int, default=64)
    parser.add_argument("--embed-max-wait-ms", type=float, default=80.0)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--skip-batcher", action="store_true")
    parser.add_argument("--skip-kv", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    return benchmark.parser(__doc__, add_arguments)


def with_lengths(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the phases' lengths filled in where not given (shorter when quick)."""
    phase, warmup = (20.0, 8.0) if args.quick else (35.0, 10.0)
    args.phase_seconds = args.phase_seconds or phase
    args.warmup_seconds = warmup if args.warmup_seconds is None else args.warmup_seconds
    if not 0 <= args.warmup_seconds < args.phase_seconds:
        raise SystemExit("--warmup-seconds must be at least 0 and under --phase-seconds")
    return args


def gates(phases: Sequence[Phase], runs: Sequence[BatcherRun], args) -> dict:
    """Each claim of the advice against what the server measured."""
    small = phases[0] if phases else None
    apart = None
    if small is not None and small.advice:
        low, high = sorted((small.sampled_running, small.tokens_per_step))
        sustainable = small.advice.get("sustainable_concurrency", math.nan)
        apart = 100 * max(0.0, (low - sustainable) / low, (sustainable - high) / high)
    raised = phases[1].tokens_per_step / small.tokens_per_step if len(phases) > 1 else None
    reached = 100 * phases[2].tokens_per_step / phases[2].cap if len(phases) > 2 else None
    after = runs[1].server_p99_ms if len(runs) > 1 else None
    found = {}
    if not args.skip_kv:
        found["advised sustainable concurrency, off the running batch measured"] = benchmark.gate(
            apart, 10.0, "%"
        )
        found["cap raised past it: tokens per step against before"] = benchmark.gate(
            raised, 1.25, "x"
        )
        found["advised KV tokens: running batch, share of the cap"] = benchmark.gate(
            reached, 90.0, "%", at_most=False
        )
    if not args.skip_batcher:
        found["advised fixed pair: batcher p99"] = benchmark.gate(after, args.budget_ms, "ms")
    return found


def run(args: argparse.Namespace) -> benchmark.Results:
    args = with_lengths(args)
    phases = [] if args.skip_kv else asyncio.run(kv_check(args))
    runs = [] if args.skip_batcher else asyncio.run(batcher_check(args))
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "json")}
    return {
        "settings": settings,
        "kv": [dataclasses.asdict(p) for p in phases],
        "batcher": [dataclasses.asdict(r) for r in runs],
        "gates": gates(phases, runs, args),
    }


def markdown(r: benchmark.Results) -> str:
    args = argparse.Namespace(**r["settings"])
    text = "## Advice against the truth (demo server)\n\n" + "\n".join(benchmark.gate_rows(r))
    if r["kv"]:
        text += "\n\n" + kv_markdown([Phase(**p) for p in r["kv"]], args)
    if r["batcher"]:
        text += "\n" + batcher_markdown([BatcherRun(**b) for b in r["batcher"]], args)
    return text


if __name__ == "__main__":
    sys.exit(benchmark.main(__doc__, run, markdown, add_arguments))
