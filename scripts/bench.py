"""`make bench`: run batchscope's benchmarks and write docs/benchmarks.md.

Benchmarks: `parser` (promtext vs prometheus_client on a real vLLM payload,
bench_parser.py), `ingest` (read_series against commit 2137ba4 on the vLLM payloads
and fleet_sim's variants, bench_ingest.py), `evaluation` (a target's evaluation per
scrape against the baseline commit's, bench_evaluation.py), `render` (the /metrics body
of 1000 targets, the served writer vs the previous one and prometheus_client,
bench_render.py), `fleet` (the exporter process scraping 1000 simulated vLLM targets,
bench_fleet.py + fleet_sim.py), `prometheus` (the exporter beside a real Prometheus
2.42 on the same 1000 targets, bench_prometheus.py), `schedule` (the exporter process
scraping 1000 local targets while 200 hang: each healthy one on its schedule, the hung
backed off, bench_schedule.py), `shortcuts` (each speed shortcut with and without it,
at 1000 targets, about 7 minutes: bench_shortcuts.py), `fuzz` (5 minutes of atheris on
the parser, fuzz_parser.py), `batching` (static vs continuous batching on the
demo server's scheduler, bench_batching.py, run as a subprocess when it is there),
`dashboard` (server-side time to build the Live page for 10 targets with an hour of
history, and per refresh at 1,000 targets its time and bytes to the browser,
bench_dashboard.py),
`batcher` (the embedding batcher, fixed vs adaptive, seeds 000 and 001, and its
overhead against seed 000's plain Batcher: bench_batcher.py, a subprocess; its charts
go to `bench/` beside the report) and `advice` (the exporter's advice held against the
demo server's truth: bench_advice.py, a subprocess; it starts demo servers), `slo` (what
an SLO objective costs: one series' history after days of scrapes, and a scrape's ingest
with and without it, bench_slo.py), `history` (the history memory of 1,000 one-series
targets after a synthesized hour, bench_history.py, a subprocess); on request,
`overload` (the exporter beside a real vLLM held at five times its budget on the same
cores: bench_overload.py, a subprocess) and `metrics-latency` (/metrics fetched every
second for 10 minutes from the exporter scraping 1000 simulated targets, its p99 against
100 ms: bench_metrics_latency.py).
The report names the machine, the command and the date: numbers from a shared 2-core
machine only mean something next to those.

    .venv/bin/python scripts/bench.py                  # everything, about 22 minutes
    .venv/bin/python scripts/bench.py --only soak       # 30 minutes: build/benchmarks-soak.md
    .venv/bin/python scripts/bench.py --only metrics-latency   # 10 minutes at 1000 targets
    .venv/bin/python scripts/bench.py --quick --only parser --output /tmp/b.md
    .venv/bin/python scripts/bench.py --only render --json /tmp/render.json   # + the numbers
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import bench_dashboard
import bench_fleet
import bench_metrics_latency
import bench_parser
import bench_prometheus
import bench_render
import bench_schedule
import bench_shortcuts
import bench_slo
import bench_soak

ROOT = Path(__file__).resolve().parent.parent
BATCHING_SCRIPT = ROOT / "scripts/bench_batching.py"
# bench_batching.py's flags for a smoke run: fewer requests, one repetition.
BATCHING_QUICK_ARGS = ("--requests", "64", "--repeat", "1")
PACKAGES = (
    "batchscope",
    "aiohttp",
    "prometheus-client",
    "psutil",
    "PyYAML",
    "torch",
    "streamlit",
    "plotly",
    "pandas",
)
BATCHER_SCRIPT = ROOT / "scripts/bench_batcher.py"
ADVICE_SCRIPT = ROOT / "scripts/bench_advice.py"
HISTORY_SCRIPT = ROOT / "scripts/bench_history.py"
BENCHMARKS = (
    "parser",
    "render",
    "fleet",
    "prometheus",
    "schedule",
    "shortcuts",
    "fuzz",
    "batching",
    "dashboard",
    "batcher",
    "advice",
    "slo",
    "history",
)
# The benchmarks whose numbers --json writes (their sections are rendered from them).
WITH_NUMBERS = (
    "parser",
    "render",
    "schedule",
    "shortcuts",
    "dashboard",
    "slo",
)
# Run only when named with --only: the soak takes 30 minutes (--soak-minutes); the
# overload needs the real vLLM of the end-to-end suite (`make vllm-env`), about 5 minutes;
# metrics-latency fetches /metrics for 10 minutes (--metrics-latency-minutes).
ON_REQUEST = ("soak", "overload", "metrics-latency")
OVERLOAD_SCRIPT = ROOT / "scripts/bench_overload.py"
FUZZ_SCRIPT = ROOT / "scripts/fuzz_parser.py"
FUZZ_SECONDS = 300
FUZZ_QUICK_SECONDS = 20


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_section(command: str) -> str:
    """The header: what ran, where and when."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Benchmarks",
            "",
            f"Command: `{command}`. Date: {now}.",
            "",
            "| machine | |",
            "|---|---|",
            f"| CPUs (nproc) | {usable} |",
            f"| CPU model | {_cpu_model()} |",
            f"| memory | {_memory()} |",
            f"| OS | {platform.system()} {platform.release()} |",
            f"| Python | {platform.python_version()} ({platform.python_implementation()}) |",
            "| packages | " + ", ".join(f"{p} {_version(p)}" for p in PACKAGES) + " |",
            "",
            "The machine is shared and noisy: parser timings are medians of interleaved "
            "repetitions in one process, compared as ratios; fleet CPU is CPU time (not wall "
            "time) of the exporter process.",
            "",
        ]
    )


def script_section(script: Path, title: str, extra_args: list[str]) -> tuple[str, bool]:
    """Run a benchmark script in its own process (`--output` a temporary report, plus
    `extra_args`) and take its report as a section; whether it exited 0 (its claims met)."""
    if not script.exists():
        return f"## {title}\n\nSkipped: `scripts/{script.name}` is not there.\n", False
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.md"
        args = [sys.executable, str(script), "--output", str(report), *extra_args]
        # Its stdout is its progress; the report it writes is what goes into ours.
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(args, cwd=ROOT, stdout=sys.stderr, check=False, env=env)
        text = report.read_text(encoding="utf-8") if report.exists() else ""
    if not text:
        return f"## {title}\n\n`{script.name}` failed (exit code {done.returncode}).\n", False
    # One level down: its title becomes a section of this report.
    body = "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())
    note = "" if done.returncode == 0 else f"\n`{script.name}` exit code: {done.returncode}.\n"
    return body + "\n" + note, done.returncode == 0


def fuzz_section(quick: bool) -> tuple[str, bool]:
    """The atheris harness on the parser for a bounded time: runs done, and crashes;
    whether it found none."""
    seconds = FUZZ_QUICK_SECONDS if quick else FUZZ_SECONDS
    print(f"fuzz: {seconds} s of atheris on the parser", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, str(FUZZ_SCRIPT), f"-max_total_time={seconds}", "-rss_limit_mb=2048"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    runs = [line for line in done.stderr.splitlines() if line.startswith("Done ")]
    verdict = "no crash" if done.returncode == 0 else f"FAILED (exit code {done.returncode})"
    return (
        "## Parser fuzzing (atheris)\n\n"
        f"`scripts/fuzz_parser.py` for {seconds} s, seeded with the real payloads: "
        f"{runs[-1] if runs else 'no run count'}; {verdict}. The oracle: only ParseError, "
        "a refusal of every text that breaks a rule of the format, the same samples as "
        "prometheus_client where both read, the selective parse equal to the full one.\n"
    ), done.returncode == 0


def report_path(only: str | None) -> Path:
    """Where a run writes its report when not told: `make bench` (every benchmark) writes
    docs/benchmarks.md; one benchmark alone writes beside it in build/, since the report
    holds only what ran and would replace every other section of the document."""
    return ROOT / ("docs/benchmarks.md" if only is None else f"build/benchmarks-{only}.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=BENCHMARKS + ON_REQUEST, help="run one benchmark")
    parser.add_argument(
        "--soak-minutes", type=float, default=30.0, help="length of the soak (--only soak)"
    )
    parser.add_argument(
        "--metrics-latency-minutes",
        type=float,
        default=10.0,
        help="how long /metrics is fetched (--only metrics-latency)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small counts: a smoke run, not a measurement"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="report path (default: docs/benchmarks.md for every benchmark; "
        "build/benchmarks-NAME.md for --only NAME)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the numbers of " + ", ".join(WITH_NUMBERS) + " here, by benchmark",
    )
    args = parser.parse_args(argv)
    args.output = args.output or report_path(args.only)
    selected = (args.only,) if args.only else BENCHMARKS
    given = sys.argv[1:] if argv is None else argv
    # `make bench` runs the script without flags.
    command = (
        shlex.join([".venv/bin/python", "scripts/bench.py", *given]) if given else "make bench"
    )
    sections = [machine_section(command)]
    if args.quick:
        sections.append("**Quick run (`--quick`): small counts, a smoke test only.**\n")
    # The numbers of the benchmarks that give them (--json), by benchmark.
    numbers: dict[str, dict] = {}
    # Benchmarks whose claims were missed (or that failed): `make bench` then exits 1.
    missed: list[str] = []

    def add(name: str, results: dict, markdown: Callable[[dict], str]) -> None:
        numbers[name] = results
        sections.append(markdown(results))

    def add_section(name: str, section: tuple[str, bool]) -> None:
        text, met = section
        sections.append(text)
        if not met:
            missed.append(name)

    if "parser" in selected:
        add("parser", bench_parser.results(*bench_parser.run(args.quick)), bench_parser.markdown)
    if "render" in selected:
        add("render", bench_render.results(bench_render.run(args.quick)), bench_render.markdown)
    if "fleet" in selected:
        sections.append(bench_fleet.markdown(bench_fleet.run(args.quick)))
    if "prometheus" in selected:
        sections.append(bench_prometheus.markdown(bench_prometheus.run(args.quick)))
    if "schedule" in selected:
        schedule = bench_schedule.results(bench_schedule.run(args.quick))
        add("schedule", schedule, bench_schedule.markdown)
        if not all(schedule["met"].values()):
            missed.append("schedule")
    if "shortcuts" in selected:
        add("shortcuts", bench_shortcuts.run(args.quick), bench_shortcuts.markdown)
    if "fuzz" in selected:
        add_section("fuzz", fuzz_section(args.quick))
    if "soak" in selected:
        minutes = 1.0 if args.quick else args.soak_minutes
        sections.append(bench_soak.markdown(bench_soak.run(minutes), minutes))
    if "metrics-latency" in selected:
        plan = bench_metrics_latency.Plan(
            targets=100 if args.quick else 1000,
            minutes=1.0 if args.quick else args.metrics_latency_minutes,
        )
        latency = bench_metrics_latency.run(plan)
        sections.append(bench_metrics_latency.markdown(latency))
        if not latency.meets_target:
            missed.append("metrics-latency")
    if "batching" in selected:
        print("batching: running scripts/bench_batching.py", file=sys.stderr, flush=True)
        quick_args = list(BATCHING_QUICK_ARGS) if args.quick else []
        add_section("batching", script_section(BATCHING_SCRIPT, "Batching", quick_args))
    if "dashboard" in selected:
        dashboard = bench_dashboard.results(bench_dashboard.run(args.quick))
        add("dashboard", dashboard, bench_dashboard.markdown)
    if "slo" in selected:
        add("slo", bench_slo.results(bench_slo.run(args.quick)), bench_slo.markdown)
    if "history" in selected:
        print("history: running scripts/bench_history.py", file=sys.stderr, flush=True)
        quick_args = ["--quick"] if args.quick else []
        add_section("history", script_section(HISTORY_SCRIPT, "History memory", quick_args))
    if "batcher" in selected:
        print("batcher: running scripts/bench_batcher.py", file=sys.stderr, flush=True)
        chart_args = ["--chart-dir", str(args.output.parent / "bench")]
        quick_args = ["--quick"] if args.quick else []
        add_section("batcher", script_section(BATCHER_SCRIPT, "Batcher", chart_args + quick_args))
    if "overload" in selected:
        print("overload: running scripts/bench_overload.py", file=sys.stderr, flush=True)
        quick_args = ["--phase-seconds", "15"] if args.quick else []
        add_section("overload", script_section(OVERLOAD_SCRIPT, "Overload", quick_args))
    if "advice" in selected:
        print("advice: running scripts/bench_advice.py", file=sys.stderr, flush=True)
        quick_args = ["--quick"] if args.quick else []
        add_section("advice", script_section(ADVICE_SCRIPT, "Advice", quick_args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(sections), encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    print("\n".join(sections[1:]))
    print(f"wrote {args.output}")
    if missed:
        print("claims missed or benchmarks failed: " + ", ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
