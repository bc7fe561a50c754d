"""Benchmark: static vs continuous batching on one trace of output lengths.

The same seeded trace (log-normal output lengths, clipped) goes through the demo
server's scheduler in static and in continuous mode, in-process (no HTTP, so transport
overhead does not dilute the step cost), every request submitted at t=0 so the queue is
never empty until its end. The measured tokens/s ratio continuous/static is held against
the gain predicted from the trace alone by the exact static-utilisation formula
(consecutive groups of B; gain = 1 / utilisation, `exporter.static_util`, the same
numbers `batchscope-static-util` prints). Target: measured >= 0.9 of predicted.

The measured ratio decomposes exactly as
    ratio = (static steps / continuous steps) * (static step time / continuous step time)
The first factor is the slot arithmetic: the prediction, less continuous batching's own
tail once the queue runs dry. The second is how the step cost moved between the modes.

    .venv/bin/python scripts/bench_batching.py      # writes docs/benchmarks-batching.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from demo_server.devices import Device, select_device
from demo_server.generation import (
    CompletionResult,
    KVCache,
    PrefillBatch,
    Scheduler,
    SchedulerConfig,
    TinyDecoder,
    encode_prompt,
)
from exporter.static_util import exact_static_utilization

TARGET = 0.9  # measured gain must reach this share of the predicted gain
PROMPT = "Benchmark prompt: tell me a story."


def trace(requests: int, seed: int, median: float, sigma: float, max_len: int) -> list[int]:
    """`requests` output lengths, log-normal (`median`, `sigma`), clipped to [1, max_len]."""
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(max_len, max(1, round(rng.lognormvariate(mu, sigma)))) for _ in range(requests)]


class SpanRecordingDecoder(TinyDecoder):
    """The demo model, adding up the attention span (cache positions read per row) of every
    decode step: a padded batch attends as far back as its longest row."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.span_total = 0

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        span: int,
        cache: KVCache,
        prefill: PrefillBatch | None = None,
    ) -> torch.Tensor:
        self.span_total += span
        return super().decode(tokens, positions, span, cache, prefill)


class SimulatedClock:
    """A scheduler listener adding up what each step costs on the simulated device: the
    wall time an unloaded machine would show (real compute always below the curve)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.seconds = 0.0

    def on_step(self, tokens: int) -> None:
        self.seconds += self.device.simulated_ms("decode", tokens) / 1000

    def on_finished(self, result: CompletionResult) -> None:
        """Requests are not timed here."""


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


def run_mode(mode: str, device: Device, lengths: list[int], slots: int, seed: int) -> Run:
    """Submit every request of `lengths` at t=0 (ignore_eos, so each makes exactly its
    length), run the scheduler until all finish, and measure."""
    prompt = encode_prompt(PROMPT)
    clock = SimulatedClock(device) if device.simulated else None
    model = SpanRecordingDecoder(seed)
    scheduler = Scheduler(
        model,
        device,
        SchedulerConfig(
            batching=mode,
            max_num_seqs=slots,
            kv_cache_tokens=len(prompt) * len(lengths) + sum(lengths),  # never preempts
            max_queue=len(lengths),
        ),
        seed=seed,
        listeners=[clock] if clock else [],
    )
    handles = [scheduler.submit(prompt, n, ignore_eos=True) for n in lengths]
    overruns_before = device.overruns["decode"]
    started = time.perf_counter()
    scheduler.start()
    results = [h.future.result() for h in handles]
    seconds = time.perf_counter() - started
    scheduler.stop()
    stats = scheduler.stats()
    if [r.output_tokens for r in results] != lengths:
        raise RuntimeError(f"{mode}: requests did not produce their lengths")
    return Run(
        mode=mode,
        seconds=seconds,
        tokens=stats.generation_tokens,
        steps=stats.steps,
        slot_utilization=stats.slot_utilization or 0.0,
        overruns=device.overruns["decode"] - overruns_before,
        simulated_seconds=clock.seconds if clock else None,
        mean_span=model.span_total / stats.steps,
    )


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


def measure(device: Device, lengths: list[int], slots: int, seed: int, repeat: int) -> Row:
    """Warm up, then interleave `repeat` runs of each mode and keep each mode's fastest:
    a shared machine's noise only ever adds time."""
    run_mode("continuous", device, [32] * (2 * slots), slots, seed)
    best: dict[str, Run] = {}
    for _ in range(repeat):
        for mode in ("static", "continuous"):
            run = run_mode(mode, device, lengths, slots, seed)
            if mode not in best or run.seconds < best[mode].seconds:
                best[mode] = run
    return Row(
        device=device.name,
        slots=slots,
        static=best["static"],
        continuous=best["continuous"],
        static_utilization=exact_static_utilization(lengths, slots).static_utilization,
    )


def table(rows: list[Row]) -> str:
    """The results as a markdown table."""
    lines = [
        "| device | B | static util. (trace) | predicted gain | static tok/s | continuous tok/s "
        "| measured gain | measured / predicted | steps static / cont. "
        "| ms per step static / cont. | mean attention span static / cont. "
        "| cont. slot util. | gain on simulated clock "
        "| overrun steps static / cont. | >= 0.9 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        simulated = "-" if r.simulated_gain is None else f"{r.simulated_gain:.3f}x"
        overruns = (
            f"{r.static.overruns:,} / {r.continuous.overruns:,}"
            if r.simulated_gain is not None
            else "-"
        )
        lines.append(
            f"| {r.device} | {r.slots} | {r.static_utilization:.4f} | {r.predicted_gain:.3f}x "
            f"| {r.static.tokens_per_s:,.0f} | {r.continuous.tokens_per_s:,.0f} "
            f"| {r.ratio:.3f}x | {r.share:.3f} "
            f"| {r.static.steps:,} / {r.continuous.steps:,} "
            f"| {r.static.step_ms:.3f} / {r.continuous.step_ms:.3f} "
            f"| {r.static.mean_span:.0f} / {r.continuous.mean_span:.0f} "
            f"| {r.continuous.slot_utilization:.4f} | {simulated} | {overruns} "
            f"| {'met' if r.share >= TARGET else 'missed'} |"
        )
    return "\n".join(lines)


def explain(row: Row) -> str:
    """One row's share split into its two exact factors."""
    step_factor = row.static.step_ms / row.continuous.step_ms
    return (
        f"- {row.device}, B={row.slots}: {row.share:.3f} = "
        f"{row.continuous.slot_utilization:.4f} (continuous slot utilisation) x "
        f"{step_factor:.3f} (static / continuous ms per step)"
    )


def machine() -> str:
    """Where the numbers come from, one line."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (
        f"nproc {os.cpu_count()}, CPU {cpu}, GPU {gpu}, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op thread(s)), Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the report; exit 1 if a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 32], help="max_num_seqs values")
    parser.add_argument("--devices", nargs="+", default=["cpu", "sim:h200"])
    parser.add_argument("--median", type=float, default=40.0, help="median output length")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    parser.add_argument("--max-len", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode; the fastest counts")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--output",
        default=None,
        help="also write the report here (make bench puts it in docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)

    lengths = trace(args.requests, args.seed, args.median, args.sigma, args.max_len)
    rows = []
    for name in args.devices:
        device = select_device(name)
        for slots in args.slots:
            rows.append(measure(device, lengths, slots, args.seed, args.repeat))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))

    command = "python scripts/bench_batching.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    report = [
        "# Benchmark: static vs continuous batching (demo server)",
        "",
        f"Command: `{command.strip()}`. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Machine: {machine()}.",
        "",
        f"Trace: {len(lengths)} requests, log-normal output lengths (median {args.median:g}, "
        f"sigma {args.sigma:g}, seed {args.seed}) clipped to [1, {args.max_len}]: "
        f"{sum(lengths):,} tokens, mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}. "
        f"All submitted at t=0 with `ignore_eos`, prompt of {len(encode_prompt(PROMPT))} "
        "tokens; the scheduler runs in-process (no HTTP). Each mode ran "
        f"{args.repeat} time(s), interleaved; the fastest run counts.",
        "",
        table(rows),
        "",
        "- predicted gain: 1 / exact static utilisation of the trace in consecutive groups of "
        "B (`exporter.static_util.exact_static_utilization`, what `batchscope-static-util` "
        "prints for this trace).",
        "- measured gain = continuous tok/s / static tok/s = (static steps / continuous steps) "
        "x (static ms per step / continuous ms per step).",
        "- cont. slot util.: the continuous run's true slot utilisation; below 1 only for the "
        "tail, once the queue has run dry.",
        "- gain on simulated clock: the same steps priced on the H200 curve alone; the wall "
        "clock matches it when no step overran (real CPU compute above the simulated cost).",
        "- mean attention span: cache positions each row of a decode step attends over; a "
        "padded batch attends as far back as its longest row.",
        "",
        "## Where measured and predicted part",
        "",
        "Static steps count exactly the slot-steps of the formula, so the share decomposes "
        "exactly: measured / predicted = (continuous slot utilisation) x (static ms per step / "
        "continuous ms per step).",
        "",
        *(explain(r) for r in rows),
        "",
        "The first factor is continuous batching's own tail: once the queue is empty, its "
        "last requests run with free slots (the prediction assumes a queue that never empties; "
        "more requests shrink the tail). The second is the step cost moving between the "
        "modes, for two reasons the table measures. Prefill: every request is prefilled once "
        "in either mode, so that work does not shrink with continuous batching and dilutes "
        "its gain. The scheduler runs one forward per step, the admitted requests' prompt "
        "tokens riding along with every row's decode token (chunked-prefill style, as vLLM "
        "runs a step), so prefill costs its tokens' compute, not a forward of its own per "
        "request; on the simulated clock, where a step's cost depends on its token count "
        "only, it is what remains beside the tail. Attention "
        "span: a static group's span restarts short with each group, while a continuous batch "
        "nearly always holds some long-running request, so its decode steps attend further "
        "back; on a CPU that costs time in proportion to rows x span (a paged or ragged "
        "attention kernel, as vLLM's, reads each row's own length only; in plain torch on a "
        "CPU, gathering each row's own positions, or cutting the batch into runs of rows "
        "attending to their own longest, cost about what the padding does, so decode "
        "attention stays padded to the longest row). A simulated step "
        "cannot be cheaper than the real CPU compute under it: overrun steps run at CPU "
        "speed, so where the tiny model's CPU step approaches the H200 cost (large B), the "
        "wall clock follows the CPU rather than the curve. On a shared 2-core machine, step "
        "times also move by about 10-20% between runs; the fastest run of each mode counts.",
    ]
    if args.output is None:
        print("\n".join(report))
    else:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(report) + "\n")
        print(f"\nwrote {args.output}")
    return 0 if all(r.share >= TARGET for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
