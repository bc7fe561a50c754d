"""Continuous against static batching on one trace of output lengths, held to the prediction.

The trace (log-normal output lengths, clipped; `--seed` draws it) goes through the demo
server's scheduler in static and in continuous mode, in-process (no HTTP, so transport
overhead does not dilute the step cost), every request submitted at t=0 so the queue is
never empty until its end. The two modes run side by side, stepped in turns on one
thread, so the machine's noise falls on both alike. The measured tokens/s ratio
continuous/static is held against the gain predicted from the trace alone by the exact
static-utilisation formula of "Continuous Batching: Why Your GPU Waits for the Slowest
Request" (consecutive groups of B; gain = 1 / utilisation,
`batchscope.exporter.core.static_util`, what `batchscope-static-util` prints). Gate:
measured >= 0.9 of predicted, on every device and B.

The measured ratio decomposes exactly as
    ratio = (static steps / continuous steps) * (static step time / continuous step time)
The first factor is the slot arithmetic: the prediction, less continuous batching's own
tail once the queue runs dry. The second is how the step cost moved between the modes.

    .venv/bin/python scripts/bench_batching.py [--quick] [--output FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass

import benchmark
import torch

from batchscope.demo_server.devices import Device, select_device
from batchscope.demo_server.generation.decoder import (
    KVCache,
    PrefillBatch,
    TinyDecoder,
    encode_prompt,
)
from batchscope.demo_server.generation.ragged import try_load
from batchscope.demo_server.generation.scheduler import (
    Scheduler,
    SchedulerConfig,
    SimulatedClock,
)
from batchscope.exporter.core.static_util import exact_static_utilization

TARGET = 0.9  # measured gain must reach this share of the predicted gain
PROMPT_TEXT = "Benchmark prompt: tell me a story, a long one, about batching on GPUs. "


def prompt_tokens(count: int) -> list[int]:
    """A prompt of exactly `count` tokens: BOS, then bytes of PROMPT_TEXT (repeated)."""
    text = (PROMPT_TEXT * (count // len(PROMPT_TEXT) + 1))[: count - 1]
    return encode_prompt(text)


def trace(requests: int, seed: int, median: float, sigma: float, max_len: int) -> list[int]:
    """`requests` output lengths, log-normal (`median`, `sigma`), clipped to [1, max_len]."""
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(max_len, max(1, round(rng.lognormvariate(mu, sigma)))) for _ in range(requests)]


class SpanRecordingDecoder(TinyDecoder):
    """The demo model, adding up the cache positions each decode step reads per row: its
    rows' own lengths with ragged attention, the longest row's for every row when padded."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.span_total = 0.0

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        span: int,
        cache: KVCache,
        prefill: PrefillBatch | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.ragged is not None and lengths is not None:
            self.span_total += lengths.float().mean().item()
        else:
            self.span_total += span
        return super().decode(tokens, positions, span, cache, prefill, lengths)


@dataclass(frozen=True)
class Run:
    """One mode's measurement."""

    mode: str
    seconds: float
    tokens: int
    steps: int
    slot_utilization: float
    overruns: int
    simulated_seconds: float | None
    mean_span: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def step_ms(self) -> float:
        return 1000 * self.seconds / self.steps


MODES = ("static", "continuous")
SLICE_SECONDS = 0.05  # each turn of the side-by-side run steps one mode for this long


def run_side_by_side(
    device: Device, lengths: list[int], slots: int, seed: int, prompt: list[int]
) -> dict[str, Run]:
    """Both modes on the same requests (every one submitted at t=0 with ignore_eos, so each
    makes exactly its length), stepped in turns on this thread: each turn of SLICE_SECONDS goes
    to the mode least far through its tokens, so both progress together and whatever else
    the machine does at a moment slows both alike. A mode's time is the sum of its turns."""
    schedulers: dict[str, Scheduler] = {}
    handles = {}
    clocks: dict[str, SimulatedClock] = {}
    models: dict[str, SpanRecordingDecoder] = {}
    for mode in MODES:
        clocks[mode] = SimulatedClock(device)
        models[mode] = SpanRecordingDecoder(seed)
        schedulers[mode] = Scheduler(
            models[mode],
            device,
            SchedulerConfig(
                batching=mode,
                max_num_seqs=slots,
                kv_cache_tokens=len(prompt) * len(lengths) + sum(lengths),  # never preempts
                max_queue=len(lengths),
            ),
            seed=seed,
            listeners=[clocks[mode]] if device.simulated else [],
        )
        handles[mode] = [schedulers[mode].submit(prompt, n, ignore_eos=True) for n in lengths]
    total = sum(lengths)
    seconds = dict.fromkeys(MODES, 0.0)
    overruns = dict.fromkeys(MODES, 0)
    running = set(MODES)
    while running:
        mode = min(running, key=lambda m: schedulers[m].stats().generation_tokens / total)
        before = device.overruns["decode"]
        started = time.perf_counter()
        # A slice of steps, not one: a switch evicts the other mode's model and cache from
        # the CPU's caches, and one-step turns would charge that to the mode stepped less.
        while (stepped := schedulers[mode].step_here()) and (
            time.perf_counter() - started < SLICE_SECONDS
        ):
            pass
        seconds[mode] += time.perf_counter() - started
        overruns[mode] += device.overruns["decode"] - before
        if not stepped:
            running.discard(mode)
    runs = {}
    for mode in MODES:
        stats = schedulers[mode].stats()
        if [h.future.result(timeout=0).output_tokens for h in handles[mode]] != lengths:
            raise RuntimeError(f"{mode}: requests did not produce their lengths")
        runs[mode] = Run(
            mode=mode,
            seconds=seconds[mode],
            tokens=stats.generation_tokens,
            steps=stats.steps,
            slot_utilization=stats.slot_utilization or 0.0,
            overruns=overruns[mode],
            simulated_seconds=clocks[mode].seconds if device.simulated else None,
            mean_span=models[mode].span_total / stats.steps,
        )
    return runs


@dataclass(frozen=True)
class Row:
    """Both modes on one device at one batch size, and the prediction."""

    device: str
    slots: int
    static: Run
    continuous: Run
    static_utilization: float

    @property
    def predicted_gain(self) -> float:
        return 1 / self.static_utilization

    @property
    def ratio(self) -> float:
        return self.continuous.tokens_per_s / self.static.tokens_per_s

    @property
    def share(self) -> float:
        return self.ratio / self.predicted_gain

    @property
    def simulated_gain(self) -> float | None:
        """The gain on the simulated clock (no CPU noise), for simulated devices."""
        if self.static.simulated_seconds is None or self.continuous.simulated_seconds is None:
            return None
        return self.static.simulated_seconds / self.continuous.simulated_seconds


def measure(
    device: Device, lengths: list[int], slots: int, seed: int, repeat: int, prompt: list[int]
) -> Row:
    """Warm up, then `repeat` side-by-side runs; each mode's fastest counts (a shared
    machine's noise only ever adds time)."""
    run_side_by_side(device, [32] * (2 * slots), slots, seed, prompt)
    best: dict[str, Run] = {}
    for _ in range(repeat):
        for mode, run in run_side_by_side(device, lengths, slots, seed, prompt).items():
            if mode not in best or run.seconds < best[mode].seconds:
                best[mode] = run
    return Row(
        device=device.name,
        slots=slots,
        static=best["static"],
        continuous=best["continuous"],
        static_utilization=exact_static_utilization(lengths, slots).static_utilization,
    )


def row_results(r: Row) -> dict:
    """One row's figures, as `--json` writes them and the report reads them."""
    return {
        "device": r.device,
        "slots": r.slots,
        "static_utilization": r.static_utilization,
        "predicted_gain": r.predicted_gain,
        "tokens_per_s": {"static": r.static.tokens_per_s, "continuous": r.continuous.tokens_per_s},
        "measured_gain": r.ratio,
        "share": r.share,
        "steps": {"static": r.static.steps, "continuous": r.continuous.steps},
        "step_ms": {"static": r.static.step_ms, "continuous": r.continuous.step_ms},
        "kv_read_per_row": {"static": r.static.mean_span, "continuous": r.continuous.mean_span},
        "continuous_slot_utilization": r.continuous.slot_utilization,
        "simulated_gain": r.simulated_gain,
        "overruns": {"static": r.static.overruns, "continuous": r.continuous.overruns},
    }


def table(rows: list[dict]) -> list[str]:
    """The rows as a markdown table."""
    lines = [
        "| device | B | static util. (trace) | predicted gain | static tok/s | continuous tok/s "
        "| measured gain | measured / predicted | steps static / cont. "
        "| ms per step static / cont. | KV positions read per row static / cont. "
        "| cont. slot util. | gain on simulated clock | overrun steps static / cont. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        simulated = r["simulated_gain"] is not None
        gain = f"{r['simulated_gain']:.3f}x" if simulated else "-"
        overruns = f"{r['overruns']['static']:,} / {r['overruns']['continuous']:,}"
        tokens, steps, ms, kv = r["tokens_per_s"], r["steps"], r["step_ms"], r["kv_read_per_row"]
        lines.append(
            f"| {r['device']} | {r['slots']} | {r['static_utilization']:.4f} "
            f"| {r['predicted_gain']:.3f}x | {tokens['static']:,.0f} | {tokens['continuous']:,.0f} "
            f"| {r['measured_gain']:.3f}x | {r['share']:.3f} "
            f"| {steps['static']:,} / {steps['continuous']:,} "
            f"| {ms['static']:.3f} / {ms['continuous']:.3f} "
            f"| {kv['static']:.0f} / {kv['continuous']:.0f} "
            f"| {r['continuous_slot_utilization']:.4f} | {gain} | {overruns if simulated else '-'} |"
        )
    return lines


def explain(r: dict) -> str:
    """One row's share split into its two exact factors."""
    step_factor = r["step_ms"]["static"] / r["step_ms"]["continuous"]
    return (
        f"- {r['device']}, B={r['slots']}: {r['share']:.3f} = "
        f"{r['continuous_slot_utilization']:.4f} (continuous slot utilisation) x "
        f"{step_factor:.3f} (static / continuous ms per step)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, help="requests in the trace (1024; quick 64)")
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 32], help="max_num_seqs values")
    parser.add_argument("--devices", nargs="+", default=["cpu", "sim:h200"])
    parser.add_argument("--median", type=float, default=40.0, help="median output length")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    parser.add_argument("--max-len", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0, help="random seed of the trace")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=35,
        help="prompt length of every request, BOS included (default %(default)s)",
    )
    parser.add_argument(
        "--repeat", type=int, help="side-by-side runs, each mode's fastest counts (3; quick 1)"
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="exit 0 whether or not the gate is met (a smoke run on a busy machine)",
    )


def run(args: argparse.Namespace) -> benchmark.Results:
    """Both modes on every device and B; the rows and a gate per row."""
    torch.set_num_threads(args.torch_threads)
    requests = args.requests or (64 if args.quick else 1024)
    repeat = args.repeat or (1 if args.quick else 3)
    lengths = trace(requests, args.seed, args.median, args.sigma, args.max_len)
    prompt = prompt_tokens(args.prompt_tokens)
    kernel, why = try_load()
    rows = []
    for name in args.devices:
        device = select_device(name)
        for slots in args.slots:
            rows.append(row_results(measure(device, lengths, slots, args.seed, repeat, prompt)))
            print(table(rows[-1:])[-1], file=sys.stderr, flush=True)
    return {
        "trace": {
            "requests": len(lengths),
            "median": args.median,
            "sigma": args.sigma,
            "max_len": args.max_len,
            "tokens": sum(lengths),
            "max": max(lengths),
            "prompt_tokens": len(prompt),
        },
        "attention": "ragged (the C kernel)" if kernel else f"padded (no kernel: {why})",
        "repeat": repeat,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "rows": rows,
        "gates": {
            f"{r['device']}, B={r['slots']}: measured / predicted gain": benchmark.gate(
                r["share"], TARGET, "", at_most=False
            )
            for r in rows
        },
    }


def markdown(r: benchmark.Results) -> str:
    t = r["trace"]
    return (
        "\n".join(
            [
                "## Continuous vs static batching (demo server)",
                "",
                f"A trace of {t['requests']:,} requests, log-normal output lengths (median "
                f"{t['median']:g}, sigma {t['sigma']:g}) clipped to [1, {t['max_len']}]: "
                f"{t['tokens']:,} tokens, max {t['max']}; all submitted at t=0 with `ignore_eos`, "
                f"prompts of {t['prompt_tokens']} tokens, decode attention {r['attention']}, "
                f"{r['torch_threads']} torch thread(s), GPU {r['gpu'] or 'none'}. Both modes "
                f"in-process, side by side in turns of {SLICE_SECONDS * 1000:.0f} ms on one thread; "
                f"each mode's fastest of {r['repeat']} run(s). Predicted gain: 1 / the exact static "
                'utilisation of the trace in consecutive groups of B ("Continuous Batching: Why '
                'Your GPU Waits for the Slowest Request"; `batchscope-static-util` prints it).',
                "",
                *benchmark.gate_rows(r),
                "",
                *table(r["rows"]),
                "",
                "Measured / predicted = (continuous slot utilisation: its tail once the queue runs "
                "dry) x (static / continuous ms per step: prefill lowers it, the KV a static "
                "group's finished rows still read raises it on the CPU). A simulated step never "
                "costs less than the CPU compute under it: where steps overran, the gain on the "
                "simulated clock is the figure without that.",
                "",
                *(explain(row) for row in r["rows"]),
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    code = benchmark.main(__doc__, run, markdown, add_arguments)
    sys.exit(0 if code == 1 and "--report-only" in sys.argv else code)
