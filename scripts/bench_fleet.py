"""The exporter on a fleet of 1,000 simulated vLLM servers, beside Prometheus: its budgets.

`fleet_sim.py` serves the targets. In turn, each alone with the fleet and scraping every
target every 5 s: the exporter as deployed (`python -m batchscope.exporter.cli`),
Debian's Prometheus, the exporter without tick batching, and the exporter on asyncio's
event loop instead of uvloop; `--runs` rounds of the four, the order rotated each round.
A run starts its process, waits for every target up, warms up for a full window, then
reads the process's CPU time (user + system) over the measured span, while `/metrics`
is fetched with `Accept-Encoding: gzip` every second, as a Prometheus would. Then the
soak: the exporter as deployed for `--soak-minutes`, `/metrics` every second, its
resident memory sampled every minute.

Gates: the exporter's CPU at most 1.25x Prometheus's (the ratio of the medians over the
runs); the `/metrics` p99 of the exporter as deployed (its runs and the soak) at most
100 ms; its resident memory after the soak at most 400 MiB.

    .venv/bin/python scripts/bench_fleet.py                      # about 90 minutes
    .venv/bin/python scripts/bench_fleet.py --soak-minutes 10    # a shorter soak
    .venv/bin/python scripts/bench_fleet.py --quick              # 100 targets, 3 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import benchmark
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support
from tests.support.network import free_port, wait_until  # noqa: E402

SIMULATOR = ROOT / "scripts/fleet_sim.py"
CPU_RATIO_BOUND = 1.25
P99_BOUND_MS = 100.0
RSS_BOUND_MIB = 400.0
PROBE_SECONDS = 1.0
RSS_SAMPLE_SECONDS = 60.0
STARTUP_SECONDS = 300.0
MIB = 2**20
# What runs in turn on the fleet. The last two are the exporter without one of its
# fast paths each: what that fast path saves is their CPU against the deployed one's.
EXPORTER, PROMETHEUS = "exporter", "prometheus"
WITHOUT_TICK_BATCHING, ASYNCIO_LOOP = "without tick batching", "asyncio event loop"
KINDS = (EXPORTER, PROMETHEUS, WITHOUT_TICK_BATCHING, ASYNCIO_LOOP)
# The child that runs the exporter's own command line with tick batching off.
WITHOUT_TICK_BATCHING_FLAG = "--exporter-without-tick-batching"


@dataclass(frozen=True)
class Plan:
    targets: int
    interval_seconds: float
    runs: int
    warmup_seconds: float
    measure_seconds: float
    soak_minutes: float


# The warm-up fills the default 60 s window, so every run evaluates full windows.
FULL = Plan(1000, 5.0, runs=3, warmup_seconds=65.0, measure_seconds=60.0, soak_minutes=60.0)
QUICK = Plan(100, 5.0, runs=1, warmup_seconds=5.0, measure_seconds=15.0, soak_minutes=0.5)


@dataclass
class Run:
    """One process on the fleet over its measured span."""

    kind: str
    cpu_seconds: float = 0.0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # /metrics answers, seconds
    rss_bytes: list[int] = field(default_factory=list)  # every RSS_SAMPLE_SECONDS, and last
    up_at_end: int = 0

    @property
    def cores(self) -> float:
        return self.cpu_seconds / self.seconds


def exporter_without_tick_batching(argv: list[str]) -> int:
    """The exporter's own command line, its Exporter built with tick batching off."""
    from batchscope.exporter import cli

    cli.Exporter = functools.partial(cli.Exporter, tick_batching=False)
    return cli.main(argv)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers or {}), timeout=60
    ) as r:
        body = r.read()
    return time.perf_counter() - started, body


def exporter_up(base: str) -> int:
    """Targets up, read from the exporter's /metrics as Prometheus reads it."""
    body = _get(f"{base}/metrics")[1]
    return sum(
        1
        for line in body.splitlines()
        if line.startswith(b"batchscope_target_up{") and line.rsplit(b" ", 1)[1] in (b"1", b"1.0")
    )


def prometheus_up(base: str) -> int:
    query = urllib.parse.urlencode({"query": "count(up == 1)"})
    result = json.loads(_get(f"{base}/api/v1/query?{query}")[1])["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _exporter_config(folder: Path, plan: Plan, address: str) -> Path:
    lines = [f"interval_seconds: {plan.interval_seconds:g}", "targets:"]
    for i in range(plan.targets):
        lines.append(
            f"  - {{name: t{i}, url: 'http://{address}/t/{i}/metrics', engine: vllm, "
            "cap: 256, budget_seconds: 1.0}"
        )
    path = folder / "fleet.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _prometheus_config(folder: Path, plan: Plan, address: str) -> Path:
    """One static group per target: the simulator serves them all on one port, by path."""
    groups = [
        {"targets": [address], "labels": {"__metrics_path__": f"/t/{i}/metrics", "t": f"t{i}"}}
        for i in range(plan.targets)
    ]
    interval = f"{plan.interval_seconds:g}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": "4s"},
        "scrape_configs": [{"job_name": "fleet", "static_configs": groups}],
    }
    path = folder / "prometheus.yml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return path


def command(kind: str, plan: Plan, address: str, folder: Path, port: int) -> list[str]:
    """The command line of `kind` scraping the fleet at `address`, serving on `port`."""
    if kind == PROMETHEUS:
        data = Path(tempfile.mkdtemp(dir=folder))  # a fresh store each run
        return [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={_prometheus_config(folder, plan, address)}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=error",
        ]
    exporter = [sys.executable, "-m", "batchscope.exporter.cli"]
    if kind == WITHOUT_TICK_BATCHING:
        exporter = [sys.executable, __file__, WITHOUT_TICK_BATCHING_FLAG]
    flags = ["--event-loop", "asyncio"] if kind == ASYNCIO_LOOP else []
    config = _exporter_config(folder, plan, address)
    listen = f"127.0.0.1:{port}"
    return [
        *exporter,
        "--config",
        str(config),
        "--listen",
        listen,
        "--log-level",
        "warning",
        *flags,
    ]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def simulator(targets: int) -> Iterator[str]:
    """fleet_sim.py serving `targets`; yields its HOST:PORT."""
    sim = subprocess.Popen(
        [sys.executable, str(SIMULATOR), "--targets", str(targets)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = sim.stdout.readline() if sim.stdout else ""
        if not line.startswith("listening on "):
            raise RuntimeError(f"fleet_sim.py did not start (exit code {sim.poll()})")
        yield line.split()[-1]
    finally:
        _stop(sim)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(kind: str, plan: Plan, address: str, folder: Path, seconds: float) -> Run:
    """Start `kind`, wait for every target up and the warm-up, then measure for `seconds`."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    up = prometheus_up if kind == PROMETHEUS else exporter_up
    process = subprocess.Popen(command(kind, plan, address, folder, port), cwd=ROOT)
    try:
        wait_until(
            lambda: up(base) == plan.targets,
            STARTUP_SECONDS,
            f"{kind}: every target up",
            processes=[process],
            interval=2.0,
        )
        time.sleep(plan.warmup_seconds)
        print(f"fleet: measuring {kind} for {seconds:g} s", file=sys.stderr, flush=True)
        return _measured(Run(kind), psutil.Process(process.pid), base, seconds, up)
    finally:
        _stop(process)


def _measured(run: Run, process: psutil.Process, base: str, seconds: float, up) -> Run:
    """`run` filled over `seconds`: CPU, /metrics answers (the exporters), resident memory."""
    cpu, started = _cpu(process), time.monotonic()
    next_probe = next_rss = started
    while (now := time.monotonic()) - started < seconds:
        if now >= next_rss:
            run.rss_bytes.append(process.memory_info().rss)
            next_rss += RSS_SAMPLE_SECONDS
        if run.kind != PROMETHEUS:
            run.latencies.append(_get(f"{base}/metrics", {"Accept-Encoding": "gzip"})[0])
        # On a 1 s schedule, as Prometheus scrapes: a tick missed behind a slow answer is skipped.
        behind = time.monotonic() - next_probe
        next_probe += PROBE_SECONDS * max(1, math.ceil(behind / PROBE_SECONDS))
        time.sleep(max(0.0, next_probe - time.monotonic()))
    run.cpu_seconds, run.seconds = _cpu(process) - cpu, time.monotonic() - started
    run.rss_bytes.append(process.memory_info().rss)
    run.up_at_end = up(base)
    return run


def run(args: argparse.Namespace) -> benchmark.Results:
    plan = QUICK if args.quick else FULL
    plan = Plan(
        plan.targets,
        plan.interval_seconds,
        args.runs or plan.runs,
        plan.warmup_seconds,
        plan.measure_seconds,
        plan.soak_minutes if args.soak_minutes is None else args.soak_minutes,
    )
    if shutil.which("prometheus") is None:
        raise SystemExit("bench_fleet.py: prometheus is not installed (Debian package prometheus)")
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp, simulator(plan.targets) as address:
        for round_ in range(plan.runs):
            for kind in KINDS[round_ % 4 :] + KINDS[: round_ % 4]:
                runs.append(measure(kind, plan, address, Path(tmp), plan.measure_seconds))
        soak = None
        if plan.soak_minutes > 0:
            soak = measure(EXPORTER, plan, address, Path(tmp), plan.soak_minutes * 60)
    found = re.search(r"version (\S+)", version.stdout or version.stderr)
    return results(plan, runs, soak, f"Prometheus {found[1] if found else '(version unknown)'}")


def results(plan: Plan, runs: list[Run], soak: Run | None, prometheus: str) -> benchmark.Results:
    """The figures and gates of the runs and the soak."""
    cores = {kind: [r.cores for r in runs if r.kind == kind] for kind in KINDS}
    median = {kind: statistics.median(values) for kind, values in cores.items()}
    deployed = [r for r in runs if r.kind == EXPORTER] + ([soak] if soak else [])
    latencies_ms = [s * 1000 for r in deployed for s in r.latencies] or [float("nan")]
    p99 = benchmark.percentile(latencies_ms, 0.99)
    rss_mib = soak.rss_bytes[-1] / MIB if soak else None
    return {
        "targets": plan.targets,
        "interval_seconds": plan.interval_seconds,
        "warmup_seconds": plan.warmup_seconds,
        "measure_seconds": plan.measure_seconds,
        "soak_minutes": plan.soak_minutes,
        "prometheus": prometheus,
        "runs": [{**asdict(r), "cores": r.cores} for r in runs],
        "cores_median": median,
        "cpu_ratio": median[EXPORTER] / median[PROMETHEUS],
        "without": {
            "tick batching": median[WITHOUT_TICK_BATCHING] / median[EXPORTER],
            "uvloop": median[ASYNCIO_LOOP] / median[EXPORTER],
        },
        "metrics_ms": {
            "answers": sum(len(r.latencies) for r in deployed),
            "p50": benchmark.percentile(latencies_ms, 0.5),
            "p99": p99,
            "max": max(latencies_ms),
            "over_bound": sum(1 for ms in latencies_ms if ms > P99_BOUND_MS),
        },
        "soak": None if soak is None else {**asdict(soak), "rss_mib": rss_mib},
        "gates": {
            "exporter CPU / Prometheus CPU": benchmark.gate(
                median[EXPORTER] / median[PROMETHEUS], CPU_RATIO_BOUND, "x"
            ),
            "/metrics p99": benchmark.gate(p99, P99_BOUND_MS, "ms"),
            f"exporter memory after the {plan.soak_minutes:g}-minute soak": benchmark.gate(
                rss_mib, RSS_BOUND_MIB, "MiB"
            ),
        },
        "checks": {
            "every target up at the end of every run": all(
                r.up_at_end == plan.targets for r in runs + ([soak] if soak else [])
            ),
        },
    }


def markdown(r: benchmark.Results) -> str:
    targets, runs = r["targets"], len(r["runs"]) // len(KINDS)
    metrics, soak = r["metrics_ms"], r["soak"]
    cores = r["cores_median"]
    lines = [
        f"## Fleet: the exporter beside Prometheus ({targets:,} simulated vLLM targets)",
        "",
        f"`scripts/fleet_sim.py` serves {targets:,} simulated vLLM 0.32 targets (the real 53 KB "
        "payload, each target its own model, counters growing and gauges moving at every "
        f"scrape). In turn, each alone with the fleet, scraping every target every "
        f"{r['interval_seconds']:g} s: the exporter as deployed, {r['prometheus']}, the "
        "exporter without tick batching, and on asyncio's event loop; "
        f"{runs} run{'s' if runs > 1 else ''} of each, measured for {r['measure_seconds']:g} s after every target "
        f"was up and a {r['warmup_seconds']:g} s warm-up. CPU: user + system of the process. "
        "`/metrics` fetched with gzip every second. Then the soak: the exporter as deployed "
        f"for {r['soak_minutes']:g} minutes.",
        "",
        *benchmark.gate_rows(r),
        "",
        f"`/metrics` over {metrics['answers']} answers: p50 {metrics['p50']:.1f} ms, p99 "
        f"{metrics['p99']:.1f} ms, max {metrics['max']:.0f} ms, {metrics['over_bound']} over "
        f"{P99_BOUND_MS:g} ms. CPU, the median run, in cores: exporter {cores[EXPORTER]:.3f}, "
        f"Prometheus {cores[PROMETHEUS]:.3f}.",
    ]
    if soak is not None:
        rss = [b / MIB for b in soak["rss_bytes"]]
        lines.append(
            f"Soak: resident memory {rss[0]:.0f} MiB at its start, {max(rss):.0f} at most, "
            f"{rss[-1]:.0f} at the end; every target up at the end: "
            f"{'yes' if soak['up_at_end'] == targets else 'no'}."
        )
    lines += [
        "",
        "| the exporter without | CPU, median run (cores) | against as deployed |",
        "|---|---:|---:|",
        f"| tick batching | {cores[WITHOUT_TICK_BATCHING]:.3f} | "
        f"{r['without']['tick batching']:.2f}x |",
        f"| uvloop (asyncio's event loop) | {cores[ASYNCIO_LOOP]:.3f} | "
        f"{r['without']['uvloop']:.2f}x |",
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, help="rounds of the four (default 3; quick 1)")
    parser.add_argument(
        "--soak-minutes", type=float, help="the soak's length (default 60; quick 0.5; 0: none)"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == [WITHOUT_TICK_BATCHING_FLAG]:
        sys.exit(exporter_without_tick_batching(sys.argv[2:]))
    sys.exit(benchmark.main(__doc__, run, markdown, add_arguments))
