"""Fleet cost beside Prometheus: the exporter and a real Prometheus scrape the same fleet.

`fleet_sim.py` serves N simulated vLLM 0.32 targets; Debian's Prometheus (2.42) and the
exporter (`python -m batchscope.exporter.cli`, as deployed) both scrape all of them every 5 s, at
the same time, on the same machine. After both see every target up and a warm-up, the
CPU time (user + system) of each process is read over the same measured span, and the
exporter's /metrics is fetched as Prometheus would (gzip accepted) every 1.1 s.

Targets (issue 12): exporter CPU <= 0.75x Prometheus's, /metrics median <= 100 ms at
1,000 targets. Memory (RSS) is reported per 1,000 targets.

    .venv/bin/python scripts/bench_prometheus.py            # 1000 targets, ~3 minutes
    .venv/bin/python scripts/bench_prometheus.py --quick    # 100 targets
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
from bench_fleet import ROOT, FleetPlan, _cpu, _stop, _write_config, start_simulator

from batchscope.exporter.core.catalog import TARGET_UP
from batchscope.exporter.ingest import promtext
from tests.support.network import free_port, wait_until  # the root is on sys.path: bench_fleet

CPU_RATIO_TARGET = 0.75
METRICS_MEDIAN_TARGET_SECONDS = 0.1
PROBE_PERIOD_SECONDS = 1.1
WARMUP_SECONDS = 15.0
# The measured time is also cut in spans of this length (two rounds of the fleet), each
# with its own CPU ratio: their median and range show how steady the ratio is.
SPAN_SECONDS = 10.0
STARTUP_TIMEOUT_SECONDS = 240.0


@dataclass(frozen=True)
class Plan:
    targets: int
    interval_seconds: float
    measure_seconds: float


FULL = Plan(targets=1000, interval_seconds=5.0, measure_seconds=60.0)
QUICK = Plan(targets=100, interval_seconds=5.0, measure_seconds=20.0)


@dataclass(frozen=True)
class Result:
    plan: Plan
    exporter_cpu: float
    prometheus_cpu: float
    seconds: float
    metrics_seconds: list[float]
    metrics_bytes: int
    exporter_rss: int
    prometheus_rss: int
    span_ratios: list[float]  # exporter / Prometheus CPU over each SPAN_SECONDS of the run
    prometheus_version: str

    @property
    def cpu_ratio(self) -> float:
        return self.exporter_cpu / self.prometheus_cpu

    @property
    def metrics_median(self) -> float:
        return statistics.median(self.metrics_seconds)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[float, bytes]:
    started = time.perf_counter()
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - started, body


def _prometheus_config(folder: Path, plan: Plan, address: str) -> Path:
    """One static group per target: the simulator serves them all on one port, by path."""
    interval = f"{plan.interval_seconds:g}s"
    groups = [
        {"targets": [address], "labels": {"__metrics_path__": f"/t/{i}/metrics", "t": f"t{i}"}}
        for i in range(plan.targets)
    ]
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": "4s"},
        "scrape_configs": [{"job_name": "fleet", "static_configs": groups}],
    }
    path = folder / "prometheus.yml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return path


def _prometheus_up(base: str) -> int:
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        query = urllib.parse.urlencode({"query": "count(up == 1)"})
        body = json.loads(_get(f"{base}/api/v1/query?{query}")[1])
        return int(float(body["data"]["result"][0]["value"][1]))
    return 0


def _exporter_up(base: str) -> int:
    """Targets up, read from /metrics as Prometheus reads it. Not from /api/v1/signals: a
    read of the JSON keeps its body rendered after each round for JSON_KEPT_FRESH_SECONDS
    (exporter/serve/app.py), a cost of the probe, not of the exporter beside Prometheus,
    and one that the warm-up does not always outlast."""
    with contextlib.suppress(OSError, ValueError):
        body = _get(f"{base}/metrics")[1].decode()
        return sum(s.value == 1 for s in promtext.parse(body, [TARGET_UP.name]))
    return 0


def run(quick: bool = False) -> Result:
    plan = QUICK if quick else FULL
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("prometheus is not installed (Debian package prometheus)")
    version = subprocess.run([prometheus, "--version"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        rounds = 20  # 24 bodies a target; past the last, its counters stop (still parsed)
        print(f"prometheus: rendering payloads for {plan.targets} targets", file=sys.stderr)
        _, address = start_simulator(FleetPlan(plan.targets, rounds, plan.interval_seconds), stack)
        exporter_port, prometheus_port = free_port(), free_port()
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={_prometheus_config(folder, plan, address)}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(_stop, prom)
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.exporter.cli",
                "--config",
                str(_write_config(folder, FleetPlan(plan.targets, 1, 5.0), address)),
                "--interval",
                f"{plan.interval_seconds:g}",
                "--listen",
                f"127.0.0.1:{exporter_port}",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        stack.callback(_stop, exporter)
        exporter_base = f"http://127.0.0.1:{exporter_port}"
        prometheus_base = f"http://127.0.0.1:{prometheus_port}"
        wait_until(
            lambda: _prometheus_up(prometheus_base) == plan.targets,
            STARTUP_TIMEOUT_SECONDS,
            "Prometheus: all up",
            processes=[prom, exporter],
            interval=1.0,
        )
        wait_until(
            lambda: _exporter_up(exporter_base) == plan.targets,
            STARTUP_TIMEOUT_SECONDS,
            "the exporter: all up",
            processes=[prom, exporter],
            interval=1.0,
        )
        print("prometheus: every target up in both; warming up", file=sys.stderr)
        time.sleep(WARMUP_SECONDS)
        processes = psutil.Process(exporter.pid), psutil.Process(prom.pid)
        before = [_cpu(p) for p in processes]
        readings = [before]  # CPU of both at the start and at the end of every span
        started = time.monotonic()
        probes: list[float] = []
        size = 0
        while time.monotonic() - started < plan.measure_seconds:
            seconds, body = _get(exporter_base + "/metrics", {"Accept-Encoding": "gzip"})
            probes.append(seconds)
            size = len(body)
            time.sleep(PROBE_PERIOD_SECONDS)
            spans = int((time.monotonic() - started) / SPAN_SECONDS)
            if spans >= len(readings):
                readings.append([_cpu(p) for p in processes])
        seconds = time.monotonic() - started
        after = [_cpu(p) for p in processes]
        rss = [p.memory_info().rss for p in processes]
    span_ratios = [
        (b[0] - a[0]) / (b[1] - a[1]) for a, b in itertools.pairwise(readings) if b[1] > a[1]
    ]
    return Result(
        plan,
        after[0] - before[0],
        after[1] - before[1],
        seconds,
        probes,
        size,
        rss[0],
        rss[1],
        span_ratios,
        (version.stdout or version.stderr).splitlines()[0]
        if (version.stdout or version.stderr)
        else "unknown",
    )


def markdown(result: Result) -> str:
    plan = result.plan
    per_thousand = 1000 / plan.targets
    cpu_ok = result.cpu_ratio <= CPU_RATIO_TARGET
    latency_ok = result.metrics_median <= METRICS_MEDIAN_TARGET_SECONDS
    lines = [
        f"## Fleet cost beside Prometheus ({plan.targets} targets, {plan.interval_seconds:g} s)",
        "",
        f"The exporter and {result.prometheus_version} scrape the same {plan.targets} "
        "simulated vLLM 0.32 targets (`scripts/fleet_sim.py`) at the same time, on this "
        f"machine; CPU time (user + system) of each over the same {result.seconds:.0f} s, "
        f"after both saw every target up and a {WARMUP_SECONDS:g} s warm-up. Prometheus "
        "also stores every sample it scrapes; the exporter keeps windows and signals. "
        "`/metrics` is fetched with `Accept-Encoding: gzip`, as Prometheus does, every "
        f"{PROBE_PERIOD_SECONDS:g} s.",
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| exporter CPU | {result.exporter_cpu:.1f} CPU-s "
        f"({result.exporter_cpu / result.seconds:.0%} of a core) | | |",
        f"| Prometheus CPU | {result.prometheus_cpu:.1f} CPU-s "
        f"({result.prometheus_cpu / result.seconds:.0%} of a core) | | |",
        f"| exporter / Prometheus CPU | {result.cpu_ratio:.2f}x | <= {CPU_RATIO_TARGET}x | "
        f"{'yes' if cpu_ok else 'no'} |",
        f"| the same over {len(result.span_ratios)} spans of {SPAN_SECONDS:g} s, median "
        f"(min - max) | {statistics.median(result.span_ratios):.2f}x "
        f"({min(result.span_ratios):.2f} - {max(result.span_ratios):.2f}) | | |",
        f"| `/metrics` median ({len(result.metrics_seconds)} fetches) | "
        f"{result.metrics_median * 1000:.1f} ms (max {max(result.metrics_seconds) * 1000:.0f} "
        f"ms) | <= {METRICS_MEDIAN_TARGET_SECONDS * 1000:.0f} ms | "
        f"{'yes' if latency_ok else 'no'} |",
        f"| `/metrics` body, gzip | {result.metrics_bytes / 1e6:.2f} MB | | |",
        f"| exporter memory (RSS) per 1,000 targets | "
        f"{result.exporter_rss * per_thousand / 2**20:.0f} MiB | | |",
        f"| Prometheus memory (RSS) per 1,000 targets | "
        f"{result.prometheus_rss * per_thousand / 2**20:.0f} MiB | | |",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 targets, 20 s")
    args = parser.parse_args(argv)
    print(markdown(run(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
