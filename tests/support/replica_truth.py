"""The replica count held against a fleet of demo servers: the truth table.

At a rate that saturates one instance, the exporter watching that instance recommends k
replicas; the same rate then runs against k-1, k and k+1 instances. The count is true
when at k and k+1 the budget is not saturated and the p99 is within it, and at k-1 it is
saturated (or k is 1). The run at one instance is the one k is read from, and the k-1
run where k is 2.

Each run: n demo servers (continuous batching on the simulated H200, slowed so that n
of them keep the simulated pace on this machine: their overruns are counted), an
exporter watching them (the real process, its fleet file naming each), and the load
generator sending Poisson arrivals round robin over them for the run's length, an
over-saturated run kept to its end. The exporter's /api/v1/replicas is read every POLL_S
while the load runs, each replica's saturation until the last answer (a backlog is
served after the load, and its latencies are the run's). scripts/bench_replicas.py runs the
whole table; tests/demo_server/test_replica_truth.py a smaller one.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.support.monitoring_stack import Process, exporter, process, python_env
from tests.support.network import free_port

POLL_S = 2.0
# The demo servers' queue: large enough that no arrival of a run is refused.
MAX_QUEUE = 100_000
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Setting:
    """A server setting and the limit it should bind: the demo server's flags, the cap
    and latency budget the exporter judges it by, the answers' length."""

    name: str
    limit: str
    cap: int
    budget_seconds: float
    max_tokens: int
    server_flags: tuple[str, ...]


@dataclass(frozen=True)
class Timing:
    """The exporter's interval, window and hold; how long each run sends load."""

    window_seconds: float = 30.0
    hold_seconds: float = 10.0
    run_seconds: float = 75.0
    interval_seconds: float = 1.0


def cap_bound(slowdown: float) -> Setting:
    """16 slots, the KV cache ample: requests of 64 tokens wait at the request cap; a
    12 s budget, which a queue of a few seconds behind the 3.5 s service fits."""
    return Setting(
        "cap-bound",
        "requests",
        16,
        12.0,
        64,
        ("--max-num-seqs", "16", "--sim-slowdown", f"{slowdown:g}"),
    )


def kv_bound(slowdown: float) -> Setting:
    """32 slots and a KV cache of 384 tokens: answers of 64 tokens fill it a few running,
    and preemptions push requests back to the queue; a 20 s budget."""
    return Setting(
        "kv-bound",
        "kv_cache",
        32,
        20.0,
        64,
        (
            "--max-num-seqs",
            "32",
            "--kv-cache-tokens",
            "384",
            "--sim-slowdown",
            f"{slowdown:g}",
        ),
    )


@dataclass
class FleetRun:
    """What one rate did on n replicas: the load generator's p99 and completions, whether
    the exporter flagged any replica's budget saturated while the load ran or its backlog
    was served, its recommendation at the end of the load, and the servers' overruns."""

    replicas: int
    rate: float
    budget_seconds: float
    p99_seconds: float | None = None
    completed: int = 0
    failed: int = 0
    saturated: bool = False
    desired: int | None = None
    needed: int | None = None
    limit: str | None = None
    capacity: float | None = None
    demand: float | None = None
    overruns: float = 0.0
    steps: float = 0.0
    throughput: float | None = None
    reasons: list[str] = field(default_factory=list)
    # The model's capacity inputs at the end of the load (at_limit_per_second, headroom, ...).
    inputs: dict[str, float] = field(default_factory=dict)

    @property
    def budget_used(self) -> float | None:
        return None if self.p99_seconds is None else self.p99_seconds / self.budget_seconds

    @property
    def within_budget(self) -> bool:
        """Not saturated, and the p99 within the budget."""
        return not self.saturated and self.budget_used is not None and self.budget_used <= 1


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def demo_servers(setting: Setting, n: int, workdir: Path) -> Iterator[list[Process]]:
    """n demo servers of `setting`, each on a free port."""
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(n):
            port = free_port()
            args = [sys.executable, "-m", "batchscope.demo_server.cli", "--port", str(port)]
            args += ["--device", "sim:h200", "--max-queue", str(MAX_QUEUE)]
            args += ["--log-level", "warning", *setting.server_flags]
            servers.append(
                stack.enter_context(
                    process(f"demo-{i}", args, port, workdir, "/health", python_env())
                )
            )
        yield servers


def fleet_file(setting: Setting, servers: Sequence[Process], timing: Timing, path: Path) -> Path:
    fleet = {
        "interval_seconds": timing.interval_seconds,
        "window_seconds": timing.window_seconds,
        "hold_seconds": timing.hold_seconds,
        # The count read is the one that has held for the hold either way: a run is too
        # short for the five-minute scale-down window.
        "scale_down_seconds": timing.hold_seconds,
        "targets": [
            {
                "name": f"demo-{i}",
                "url": f"{s.url}/metrics",
                "engine": "vllm",
                "cap": setting.cap,
                "budget_seconds": setting.budget_seconds,
            }
            for i, s in enumerate(servers)
        ],
    }
    path.write_text(yaml.safe_dump(fleet))
    return path


def loadgen(
    setting: Setting, servers: Sequence[Process], rate: float, seconds: float, out: Path
) -> subprocess.Popen:
    """The load generator, round robin over the servers, in the background."""
    args = [sys.executable, "-m", "batchscope.demo_server.loadgen.run"]
    args += ["--url", ",".join(s.url for s in servers), "--balance", "round-robin"]
    args += ["--endpoint", "completions", "--rates", f"{rate:g}", "--duration", f"{seconds:g}"]
    args += ["--max-tokens", str(setting.max_tokens), "--keep-over-saturated"]
    args += ["--timeout", f"{TIMEOUT_S:g}", "--json"]
    with open(out, "wb") as stdout:
        return subprocess.Popen(args, stdout=stdout, stderr=subprocess.DEVNULL, env=python_env())


def _watch(run: FleetRun, exp: Process, until: float, load: subprocess.Popen) -> None:
    """Read the exporter every POLL_S: whether any replica's budget saturated, until the
    load generator has its last answer (a backlog at the end of the load is served, and
    its latencies judged, after it), and the recommendation, the last read while the
    load ran."""
    while time.time() < until or (load.poll() is None and time.time() < until + TIMEOUT_S):
        time.sleep(POLL_S)
        summary = _get_json(f"{exp.url}/api/v1/signals?view=summary")
        run.saturated |= any(t["total"]["budget_saturated"] for t in summary["targets"])
        models = _get_json(f"{exp.url}/api/v1/replicas")["models"]
        if models and time.time() < until:
            model = models[0]
            run.desired, run.needed = model["desired_replicas"], model["needed_replicas"]
            capacity, demand = model["capacity"], model["demand"]
            run.limit = capacity["limit"] if capacity else None
            run.inputs = capacity["inputs"] if capacity else {}
            run.capacity = capacity["per_second"] if capacity else None
            run.demand = demand["per_second"] if demand else None
            run.reasons.append(model["reason"])


def _counted(server: Process, prefix: str) -> float:
    """The sum of a demo server's samples whose line starts with `prefix`."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


OVERRUNS = 'batchscope_demo_simulated_overruns_total{kind="decode"}'
STEPS = "batchscope_demo_steps_total{"


def fleet_run(setting: Setting, rate: float, n: int, timing: Timing, workdir: Path) -> FleetRun:
    """`rate` against n replicas of `setting` (module docstring)."""
    run = FleetRun(n, rate, setting.budget_seconds)
    workdir.mkdir(parents=True, exist_ok=True)
    with demo_servers(setting, n, workdir) as servers:
        fleet = fleet_file(setting, servers, timing, workdir / "fleet.yaml")
        with exporter(workdir, "--config", str(fleet)) as exp:
            out = workdir / "loadgen.json"
            started = time.time()
            load = loadgen(setting, servers, rate, timing.run_seconds, out)
            try:
                _watch(run, exp, started + timing.run_seconds, load)
                load.wait(TIMEOUT_S)
            finally:
                if load.poll() is None:
                    load.kill()
                    load.wait()
            (result,) = json.loads(out.read_text())
            run.overruns = sum(_counted(s, OVERRUNS) for s in servers)
            run.steps = sum(_counted(s, STEPS) for s in servers)
    p99 = result.get("p99_ms")
    run.p99_seconds = None if p99 is None else p99 / 1000
    run.completed, run.failed = result["ok"], result["errors"] + result["rejected_429"]
    run.throughput = result.get("throughput_per_s")
    return run


@dataclass
class TruthRow:
    """One rate of the table: the count read at one replica, and the runs around it."""

    setting: Setting
    rate: float
    recommended: int | None
    limit: str | None
    runs: dict[int, FleetRun]

    def holds(self) -> dict[str, bool]:
        """Each claim of the table for this rate, by name."""
        k = self.recommended
        if k is None:
            return {"a count was read": False}
        claims = {
            f"the count names {self.setting.limit}": self.limit == self.setting.limit,
            f"within the budget at k={k}": self.runs[k].within_budget,
        }
        if k + 1 in self.runs:
            claims[f"within the budget at k+1={k + 1}"] = self.runs[k + 1].within_budget
        if k > 1:
            claims[f"saturated at k-1={k - 1}"] = self.runs[k - 1].saturated
        claims["no run failed a request"] = all(r.failed == 0 for r in self.runs.values())
        return claims


def truth_row(
    setting: Setting,
    rate: float,
    timing: Timing,
    workdir: Path,
    watch: int = 1,
    around: tuple[int, ...] = (-1, 0, 1),
) -> TruthRow:
    """Read k from the exporter watching `watch` replicas, then run k plus each of
    `around` (k-1, k and k+1), reusing the first run where it is one of them."""
    first = fleet_run(setting, rate, watch, timing, workdir / f"{setting.name}-{rate:g}-{watch}")
    k = first.desired
    runs = {watch: first}
    for n in () if k is None else (k + step for step in around):
        if n >= 1 and n not in runs:
            runs[n] = fleet_run(setting, rate, n, timing, workdir / f"{setting.name}-{rate:g}-{n}")
    return TruthRow(setting, rate, k, first.limit, runs)
