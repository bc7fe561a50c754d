"""Fleet benchmark: the real exporter process scraping 1000 simulated vLLM servers.

`fleet_sim.py` serves the targets from a separate process; the exporter runs as
`python -m batchscope.exporter.cli --config FLEET.yaml`, exactly as deployed. While it runs, the
benchmark samples the CPU time (user + system, psutil) of the exporter, the simulator
and the whole machine every few milliseconds, and fetches the exporter's /metrics and
/api/v1/signals from a thread, as a Prometheus scrape and a dashboard poll would.
Afterwards the exporter's own /api/v1/history gives when each round evaluated each
target: a round starts at its first evaluation, so the CPU time between two round
starts is one round's cost, whatever the rounds' phase or length on a loaded machine.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import free_port, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIMULATOR = ROOT / "scripts/fleet_sim.py"
# The target: 1000 targets at a 5 s interval within half of one core.
TARGET_CORE_FRACTION = 0.5
SAMPLE_SECONDS = 0.02
# How often a wait asks the exporter whether its rounds are done.
DONE_CHECK_SECONDS = 0.5
# Probes drift against the rounds (period 1.1 intervals) so they meet rounds at every phase.
PROBE_PERIOD_INTERVALS = 1.1
STARTUP_TIMEOUT_SECONDS = 180.0
# How long the measured rounds may overrun their schedule on a loaded machine.
OVERRUN_SECONDS = 120.0


@dataclass(frozen=True)
class FleetPlan:
    """How big a run is: `rounds` are measured after a warm-up round."""

    targets: int
    rounds: int
    interval_seconds: float


FULL = FleetPlan(targets=1000, rounds=6, interval_seconds=5.0)
QUICK = FleetPlan(targets=100, rounds=2, interval_seconds=5.0)


@dataclass(frozen=True)
class Round:
    """One measured round, from its start to the next round's start."""

    exporter_cpu: float
    simulator_cpu: float
    benchmark_cpu: float  # this process: sampling and probing
    other_cpu: float  # every other process on the machine
    duration: float  # first to last target evaluated
    cycle: float  # this round's start to the next one's
    up: int


@dataclass(frozen=True)
class Probe:
    """One fetch of the exporter's endpoints."""

    started: float
    metrics_seconds: float
    metrics_bytes: int
    signals_seconds: float
    signals_bytes: int
    up: int


@dataclass(frozen=True)
class FleetResult:
    """A fleet run: its measured rounds, its probes and every round's span."""

    plan: FleetPlan
    rounds: list[Round]
    probes: list[Probe]
    round_spans: list[tuple[float, float]]  # (first, last evaluation) of every round seen
    warmup_seconds: float
    exporter_rss_bytes: int
    load_before: tuple[float, float, float]

    @property
    def cpu_per_round(self) -> float:
        return statistics.median(r.exporter_cpu for r in self.rounds)

    @property
    def cpu_per_round_mean(self) -> float:
        return statistics.fmean(r.exporter_cpu for r in self.rounds)

    @property
    def meets_target(self) -> bool:
        """Both the median round and the mean fit the CPU budget."""
        budget = TARGET_CORE_FRACTION * self.plan.interval_seconds
        return max(self.cpu_per_round, self.cpu_per_round_mean) <= budget

    @property
    def all_up(self) -> bool:
        return all(r.up == self.plan.targets for r in self.rounds) and all(
            p.up == self.plan.targets for p in self.probes
        )

    def during_round(self, probe: Probe) -> bool:
        return any(first <= probe.started <= last for first, last in self.round_spans)


class CpuLog:
    """CPU-seconds of the exporter, the simulator, this process and the machine, over time."""

    def __init__(self, exporter: psutil.Process, simulator: psutil.Process) -> None:
        self.processes = (exporter, simulator, psutil.Process())
        self.times: list[float] = []
        self.values: list[tuple[float, float, float]] = []

    def sample(self) -> None:
        machine = psutil.cpu_times()
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        self.values.append((*(_cpu(p) for p in self.processes), busy))
        self.times.append(time.time())

    def at(self, when: float) -> tuple[float, ...]:
        """The readings at `when`, interpolated between the two nearest samples."""
        i = min(max(bisect.bisect_left(self.times, when), 1), len(self.times) - 1)
        t0, t1 = self.times[i - 1], self.times[i]
        share = 0.0 if t1 == t0 else min(max((when - t0) / (t1 - t0), 0.0), 1.0)
        return tuple(a + (b - a) * share for a, b in zip(*self.values[i - 1 : i + 1], strict=True))


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _fetch(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - started, body


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_simulator(plan: FleetPlan, stack: contextlib.ExitStack) -> tuple[psutil.Process, str]:
    """Start fleet_sim.py; returns its process and HOST:PORT once it serves."""
    # Enough bodies that counters keep growing through warm-up, the rounds and some slack.
    variants = plan.rounds + 4
    sim = subprocess.Popen(
        [
            sys.executable,
            str(SIMULATOR),
            "--targets",
            str(plan.targets),
            "--variants",
            str(variants),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    stack.callback(_stop, sim)
    line = sim.stdout.readline() if sim.stdout else ""
    if not line.startswith("listening on "):
        raise RuntimeError(f"fleet_sim.py did not start (exit code {sim.poll()})")
    return psutil.Process(sim.pid), line.split()[-1]


def _write_config(folder: Path, plan: FleetPlan, address: str) -> Path:
    lines = ["targets:"]
    for i in range(plan.targets):
        lines += [
            f"  - name: t{i}",
            f"    url: http://{address}/t/{i}/metrics",
            "    engine: vllm",
            "    cap: 256",
            "    budget_seconds: 1.0",
        ]
    path = folder / "fleet.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rounds_seen(base: str) -> int:
    """Rounds that have evaluated target t0: each round evaluates every target once."""
    with contextlib.suppress(OSError, ValueError):
        return len(json.loads(_fetch(base + "/api/v1/history?target=t0")[1])["points"])
    return 0


def _probe(base: str) -> Probe:
    started = time.time()
    metrics_seconds, metrics = _fetch(base + "/metrics")
    signals_seconds, signals = _fetch(base + "/api/v1/signals")
    up = sum(1 for t in json.loads(signals)["targets"] if t["up"])
    return Probe(started, metrics_seconds, len(metrics), signals_seconds, len(signals), up)


def _probe_every(
    base: str, period: float, stop: threading.Event, probes: list[Probe], errors: list[str]
) -> None:
    """Probe every `period` seconds until `stop`; a probe that fails ends the probing."""
    while not stop.wait(period):
        try:
            probes.append(_probe(base))
        except (OSError, ValueError) as err:
            errors.append(f"{type(err).__name__}: {err}")
            return


def _round_spans(base: str) -> tuple[list[tuple[float, float]], list[int]]:
    """(first, last evaluation) and targets up, of every round in the exporter's history.

    The last round may still be running: its start is known, its end and count are not.
    """
    histories: list[list[dict]] = []
    page, pages = 0, 1
    while page < pages:  # the history comes a page of targets at a time
        body = json.loads(_fetch(f"{base}/api/v1/history?points=720&page={page}")[1])
        histories.extend(body["targets"].values())
        page, pages = page + 1, body["pages"]
    spans, up = [], []
    for k in range(max(len(h) for h in histories)):
        points = [h[k] for h in histories if len(h) > k]
        spans.append((min(p["t"] for p in points), max(p["t"] for p in points)))
        up.append(sum(1 for p in points if p["up"]))
    return spans, up


def _wait(
    seconds: float, what: str, cpu: CpuLog, exporter: subprocess.Popen, done: Callable[[], bool]
) -> None:
    """Sample CPU every SAMPLE_SECONDS until `done()` (asked every DONE_CHECK_SECONDS, as it
    costs the exporter a request); raises NotReady if the exporter exits or is late."""
    asked = 0.0

    def sampled_done() -> bool:
        nonlocal asked
        cpu.sample()
        if time.monotonic() - asked <= DONE_CHECK_SECONDS:
            return False
        asked = time.monotonic()
        return done()

    wait_until(sampled_done, seconds, what, processes=[exporter], interval=SAMPLE_SECONDS)


def run(quick: bool = False) -> FleetResult:
    """Run the simulator and the exporter, measure `plan.rounds` rounds after a warm-up."""
    plan = QUICK if quick else FULL
    load_before = psutil.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        print(f"fleet: rendering payloads for {plan.targets} targets", file=sys.stderr, flush=True)
        simulator, address = start_simulator(plan, stack)
        config = _write_config(Path(tmp), plan, address)
        port = free_port()
        exporter_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.exporter.cli",
                "--config",
                str(config),
                "--interval",
                f"{plan.interval_seconds:g}",
                "--listen",
                f"127.0.0.1:{port}",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        stack.callback(_stop, exporter_proc)
        base = f"http://127.0.0.1:{port}"
        cpu = CpuLog(psutil.Process(exporter_proc.pid), simulator)
        launched = time.time()
        _wait(
            STARTUP_TIMEOUT_SECONDS,
            "the exporter's warm-up round",
            cpu,
            exporter_proc,
            lambda: _rounds_seen(base) >= 1,
        )
        print("fleet: warm-up round started", file=sys.stderr, flush=True)
        probes: list[Probe] = []
        errors: list[str] = []
        stop = threading.Event()
        prober = threading.Thread(
            target=_probe_every,
            args=(base, PROBE_PERIOD_INTERVALS * plan.interval_seconds, stop, probes, errors),
        )
        prober.start()
        try:
            # Round rounds + 1 starting closes the last measured round.
            _wait(
                (plan.rounds + 2) * plan.interval_seconds + OVERRUN_SECONDS,
                "the exporter's measured rounds",
                cpu,
                exporter_proc,
                lambda: _rounds_seen(base) >= plan.rounds + 2,
            )
        finally:
            stop.set()
            prober.join()
        if errors:
            raise RuntimeError(f"the exporter did not answer a probe: {errors[0]}")
        cpu.sample()
        spans, up = _round_spans(base)
        rss = cpu.processes[0].memory_info().rss
    rounds = []
    for k in range(1, plan.rounds + 1):
        start, end = cpu.at(spans[k][0]), cpu.at(spans[k + 1][0])
        exporter_cpu, simulator_cpu, benchmark_cpu, machine_cpu = (
            b - a for a, b in zip(start, end, strict=True)
        )
        other_cpu = machine_cpu - exporter_cpu - simulator_cpu - benchmark_cpu
        rounds.append(
            Round(
                exporter_cpu,
                simulator_cpu,
                benchmark_cpu,
                other_cpu,
                duration=spans[k][1] - spans[k][0],
                cycle=spans[k + 1][0] - spans[k][0],
                up=up[k],
            )
        )
        print(f"fleet: round {k}: exporter {exporter_cpu:.2f} CPU-s", file=sys.stderr)
    warmup_seconds = spans[0][1] - launched
    return FleetResult(plan, rounds, probes, spans, warmup_seconds, rss, load_before)


def markdown(result: FleetResult) -> str:
    """The report section: the verdict, then one row per measured round."""
    plan, rounds, probes = result.plan, result.rounds, result.probes
    budget = TARGET_CORE_FRACTION * plan.interval_seconds
    interval = plan.interval_seconds
    exporter_cpu = [r.exporter_cpu for r in rounds]
    worst_up = min([r.up for r in rounds] + [p.up for p in probes])
    measures = [
        (
            "exporter CPU per round, median (min - max)",
            f"{result.cpu_per_round:.2f} CPU-s ({min(exporter_cpu):.2f} - {max(exporter_cpu):.2f})",
        ),
        ("exporter CPU per round, mean", f"{result.cpu_per_round_mean:.2f} CPU-s"),
        (
            f"fraction of one core at a {interval:g} s interval, median (mean)",
            f"{result.cpu_per_round / interval:.2f} ({result.cpu_per_round_mean / interval:.2f})",
        ),
        (
            f"target: <= {budget:g} CPU-s per round ({TARGET_CORE_FRACTION:g} core), median and "
            "mean",
            "met" if result.meets_target else "missed",
        ),
        (
            "simulator CPU per round, median",
            f"{statistics.median(r.simulator_cpu for r in rounds):.2f} CPU-s",
        ),
        (
            "targets up in every measured round and probe",
            f"{'yes' if result.all_up else 'NO'} ({worst_up} of {plan.targets} at worst)",
        ),
        (
            "round duration (first to last target evaluated), median (max)",
            f"{statistics.median(r.duration for r in rounds):.2f} s "
            f"({max(r.duration for r in rounds):.2f} s)",
        ),
    ]
    for endpoint, seconds in (
        ("/metrics", "metrics_seconds"),
        ("/api/v1/signals", "signals_seconds"),
    ):
        for when, during in (("between rounds", False), ("during a round", True)):
            values = [getattr(p, seconds) * 1e3 for p in probes if result.during_round(p) == during]
            shown = (
                f"{statistics.median(values):.0f} ms (max {max(values):.0f}, n={len(values)})"
                if values
                else "no probe fell there"
            )
            measures.append((f"{endpoint} latency {when}, median", shown))
    if probes:
        measures.append(
            (
                "/metrics and /api/v1/signals body sizes",
                f"{probes[-1].metrics_bytes / 1e6:.2f} MB, {probes[-1].signals_bytes / 1e6:.2f} MB",
            )
        )
    measures.append(
        ("exporter resident memory at the end", f"{result.exporter_rss_bytes / 2**20:.0f} MiB")
    )
    lines = [
        f"## Fleet: {plan.targets} simulated vLLM targets, one exporter process",
        "",
        f"`scripts/fleet_sim.py` serves {plan.targets} targets (`/t/{{i}}/metrics` on one "
        "port, one process) with the real vLLM 0.32 load payload (~53 KB, 420 samples), "
        "each target with its own model name, counters growing and gauges moving on every "
        "scrape, gzipped as vLLM does when the client accepts it. The exporter runs as "
        f"`python -m batchscope.exporter.cli --config fleet.yaml --interval {interval:g}` "
        "(engine vllm, cap 256, budget 1 s per target). After a warm-up round "
        f"({result.warmup_seconds:.1f} s from launch to its last target evaluated), "
        f"{plan.rounds} rounds are measured. A round's CPU is the exporter's user + system "
        "CPU time from its first target evaluated to the next round's first (from the "
        "exporter's /api/v1/history), so it includes the idle wait and the probes that fell "
        "in it. Probes: /metrics then /api/v1/signals every "
        f"{PROBE_PERIOD_INTERVALS * interval:g} s from another thread, as Prometheus and a "
        "dashboard would poll. Simulator, exporter and benchmark share the machine's cores "
        "with whatever else runs: load average before the run "
        f"{', '.join(f'{x:.2f}' for x in result.load_before)} (the per-round table shows the "
        "CPU the benchmark itself and every other process took).",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {measure} | {value} |" for measure, value in measures),
        "",
        "| round | exporter CPU-s | simulator CPU-s | benchmark CPU-s | other processes CPU-s "
        "| duration (s) "
        "| to next round (s) | up |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rounds, 1):
        lines.append(
            f"| {i} | {r.exporter_cpu:.2f} | {r.simulator_cpu:.2f} | "
            f"{r.benchmark_cpu:.2f} | {r.other_cpu:.2f} | {r.duration:.2f} | "
            f"{r.cycle:.2f} | {r.up} |"
        )
    lines.append("")
    return "\n".join(lines)
