"""Soak: the demo server at 80% of its peak for a long time, the exporter scraping it.

Starts the demo server and the exporter (both as deployed, separate processes), finds
the server's peak embedding throughput with the load generator (a short sweep; the
peak is the best rate it kept up with, no errors), then offers 80% of it in consecutive
windows for `--minutes` (30 by default). Per window it records the load generator's
p50/p99 latency and achieved rate, and the resident memory of the server and the
exporter, so a leak or a creeping latency shows as a trend between the first and the
last windows.

    .venv/bin/python scripts/bench_soak.py                 # 30 minutes
    .venv/bin/python scripts/bench_soak.py --minutes 3     # a short run, said as such
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PEAK_SWEEP_RATES = "25,50,100,200,400"
SWEEP_SECONDS = 5
WINDOW_SECONDS = 30
LOAD_SHARE = 0.8


def _loadgen(url: str, rates: str, seconds: float) -> list[dict]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchscope.demo_server.loadgen.run",
            "--url",
            url,
            "--endpoint",
            "embeddings",
            "--rates",
            rates,
            "--duration",
            f"{seconds:g}",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def run(minutes: float) -> list[dict]:
    server_port, exporter_port = free_port(), free_port()
    server_url = f"http://127.0.0.1:{server_port}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.demo_server.cli",
                "--port",
                str(server_port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        stack.callback(server.terminate)
        wait_http(server_url + "/health", 120, processes=[server])
        config = Path(tmp) / "soak.yaml"
        config.write_text(
            f'targets:\n  - {{name: demo, url: "{server_url}/metrics", engine: auto}}\n'
        )
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchscope.exporter.cli",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{exporter_port}",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        stack.callback(exporter.terminate)
        wait_http(f"http://127.0.0.1:{exporter_port}/health", 60, processes=[exporter])
        sweep = _loadgen(server_url, PEAK_SWEEP_RATES, SWEEP_SECONDS)
        # The peak: the best rate the server kept up with (achieved >= 95% of offered).
        clean = [
            r
            for r in sweep
            if r["errors"] == 0
            and r["rejected_429"] == 0
            and r["throughput_per_s"] >= 0.95 * r["rate_per_s"]
        ]
        peak = max(r["throughput_per_s"] for r in clean or sweep)
        rate = LOAD_SHARE * peak
        print(f"soak: peak {peak:.0f}/s, offering {rate:.0f}/s", file=sys.stderr)
        processes = {"server": psutil.Process(server.pid), "exporter": psutil.Process(exporter.pid)}
        windows = []
        started = time.monotonic()
        while time.monotonic() - started < minutes * 60:
            (result,) = _loadgen(server_url, f"{rate:.1f}", WINDOW_SECONDS)
            windows.append(
                {
                    "minute": (time.monotonic() - started) / 60,
                    "peak_per_s": peak,
                    **{k: result[k] for k in ("throughput_per_s", "p50_ms", "p99_ms", "errors")},
                    **{
                        f"{name}_rss_mib": p.memory_info().rss / 2**20
                        for name, p in processes.items()
                    },
                }
            )
            print(f"soak: {windows[-1]}", file=sys.stderr)
    return windows


def markdown(windows: list[dict], minutes: float) -> str:
    first, last = windows[0], windows[-1]
    lines = [
        f"## Soak ({minutes:g} minutes at {LOAD_SHARE:.0%} of peak)",
        "",
        f"Peak embedding throughput {first['peak_per_s']:.0f}/s from a short sweep; "
        f"{WINDOW_SECONDS} s windows at {LOAD_SHARE:.0%} of it, the exporter scraping the "
        "server every 5 s.",
        "",
        "| minute | achieved /s | p50 ms | p99 ms | errors | server RSS MiB | exporter RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in windows:
        lines.append(
            f"| {w['minute']:.1f} | {w['throughput_per_s']:.1f} | {w['p50_ms']:.1f} | "
            f"{w['p99_ms']:.1f} | {w['errors']} | {w['server_rss_mib']:.0f} | "
            f"{w['exporter_rss_mib']:.0f} |"
        )
    lines += [
        "",
        f"Last window over first: p99 {last['p99_ms'] / first['p99_ms']:.2f}x, server "
        f"memory {last['server_rss_mib'] / first['server_rss_mib']:.2f}x, exporter memory "
        f"{last['exporter_rss_mib'] / first['exporter_rss_mib']:.2f}x.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    args = parser.parse_args(argv)
    print(markdown(run(args.minutes), args.minutes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
