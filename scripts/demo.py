"""`make demo`: the bundled demo server under varying load, the exporter, the dashboard.

Prints the dashboard's URL first, then starts `batchscope-demo-server` (continuous
batching, a small KV cache so memory pressure shows), `batchscope-exporter` pointed at
it, the Streamlit dashboard on the exporter, and load generators that cycle through
light, heavy, long-answer and overload phases (a memory-bound stretch and a saturation
episode within a few minutes); prints the exporter's signals every few seconds until
Ctrl-C or --duration. Everything binds 127.0.0.1.

`--phase-scale F` runs every phase F times as long, and the exporter's interval, window
and hold with them, so each phase tells the same story in less time (the browser test
walks the phases at 0.4); 1, the default, is the demo as documented.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import NotReady, free_port, wait_http  # noqa: E402

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent

# (name, seconds, completions per second, max_tokens drawn from, embeddings per second)
# "long answers": few requests fit the 2048-token KV cache, so the batch stays below the
# cap while requests wait (memory-bound); "overload" then saturates the latency budget.
PHASES = (
    ("light", 30, 1, "16,64", 5),
    ("heavy", 60, 12, "32,128,256", 200),
    ("long answers", 45, 3, "512,768", 50),
    ("overload", 60, 30, "64,256,400", 600),
)


# The exporter's interval, window and hold at a phase scale of 1.
EXPORTER_TIMING = {"--interval": 3.0, "--window-seconds": 20.0, "--hold-seconds": 20.0}


def exporter_timing(scale: float) -> list[str]:
    """The exporter's timing flags at a phase scale."""
    return [arg for flag, value in EXPORTER_TIMING.items() for arg in (flag, f"{value * scale:g}")]


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def show(signals: dict) -> None:
    """One line per series: what an operator reads first."""
    for target in signals["targets"]:
        if not target["up"]:
            print(f"  {target['target']}: DOWN ({target['error']})")
            continue
        for s in target["series"]:
            name = s["labels"].get("batcher") or s["labels"].get("model_name", "total")
            print(
                f"  {name:>12} | {s['diagnosis']['state']:<16} | running {fmt(s['running'], '.0f')}"
                f"/{fmt(s['cap'], '.0f')} (ratio {fmt(s['running_vs_cap'])}) "
                f"waiting {fmt(s['waiting'], '.0f')} | p99 {fmt(s['latency_seconds'], '.3f')} s "
                f"budget {fmt(s['budget_utilization'])} | preempt/s "
                f"{fmt(s['preemptions_per_second'])} | kv {fmt(s['kv_cache_usage'])}"
            )
            print(f"  {'':>12}   {s['diagnosis']['reason']}")


def write_fleet(server: str) -> Path:
    """The exporter's fleet file: one server, read as two targets.

    The demo server holds an LLM (vLLM names, judged against a 10 s budget) and an
    embedding batcher (its own 50 ms budget): two services, so two rows on the dashboard.
    """
    path = Path(tempfile.mkdtemp(prefix="batchscope-demo-")) / "fleet.yaml"
    path.write_text(
        "targets:\n"
        f"  - {{name: demo-llm, url: '{server}/metrics', engine: vllm, cap: 8, "
        "budget_seconds: 10}\n"
        f"  - {{name: demo-embeddings, url: '{server}/metrics', engine: inhouse}}\n"
    )
    return path


class Processes:
    """The demo's processes: started in order, stopped together."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, *cmd: str) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_services(args: argparse.Namespace, procs: Processes) -> tuple[str, str]:
    """The demo server, the exporter on it and the dashboard on the exporter, each up
    before the next starts; the server's and the exporter's URLs."""
    server_port = free_port()
    server = f"http://127.0.0.1:{server_port}"
    exporter = f"http://127.0.0.1:{args.exporter_port}"
    dashboard = f"http://127.0.0.1:{args.dashboard_port}"
    print(f"demo: open the dashboard at {dashboard} (it comes up in about a minute)")
    print(f"demo: starting the demo server on {server} (device {args.device})")
    procs.start(
        str(BIN / "batchscope-demo-server"),
        *("--port", str(server_port), "--batching", "continuous", "--max-num-seqs", "8"),
        *("--kv-cache-tokens", "2048", "--embed-batching", "adaptive"),
        *("--latency-budget-ms", "50", "--device", args.device),
    )
    wait_http(f"{server}/health", 120, processes=procs.started)
    print(f"demo: starting the exporter on {exporter}")
    procs.start(
        str(BIN / "batchscope-exporter"),
        *("--config", str(write_fleet(server)), "--listen", f"127.0.0.1:{args.exporter_port}"),
        *exporter_timing(args.phase_scale),
    )
    wait_http(f"{exporter}/health", 30, processes=procs.started)
    print(f"demo: starting the dashboard on {dashboard}")
    procs.start(
        sys.executable,
        *("-m", "batchscope.dashboard.cli", "--exporter", exporter),
        *("--port", str(args.dashboard_port)),
    )
    wait_http(f"{dashboard}/_stcore/health", 60, processes=procs.started)
    print(f"demo: dashboard ready at {dashboard}")
    print(f"demo: signals at {exporter}/api/v1/signals, Prometheus text at {exporter}/metrics")
    print("demo: Ctrl-C stops everything\n")
    return server, exporter


def start_load(
    procs: Processes, server: str, phase: tuple, seconds: float, seed: int
) -> list[subprocess.Popen]:
    """One phase's load generators: completions and embeddings at the phase's rates."""
    name, _, rate, max_tokens, embed_rate = phase
    print(
        f"demo: phase {name}: {rate} completions/s of {max_tokens} tokens, "
        f"{embed_rate} embeddings/s, {seconds:g} s"
    )
    loadgen = (str(BIN / "batchscope-loadgen"), "--url", server)
    every = ("--duration", f"{seconds:g}", "--seed", str(seed))
    return [
        procs.start(
            *loadgen,
            *("--endpoint", "completions", "--rates", str(rate), "--max-tokens", max_tokens),
            *every,
        ),
        procs.start(*loadgen, "--endpoint", "embeddings", "--rates", str(embed_rate), *every),
    ]


def run_phases(args: argparse.Namespace, procs: Processes, server: str, exporter: str) -> None:
    """The phases in a loop, the exporter's signals shown every 5 s, until --duration."""
    started = time.monotonic()
    phase_index = 0
    while not args.duration or time.monotonic() - started < args.duration:
        phase = PHASES[phase_index % len(PHASES)]
        phase_index += 1
        load = start_load(procs, server, phase, phase[1] * args.phase_scale, phase_index)
        while any(p.poll() is None for p in load):
            time.sleep(5)
            try:
                with urllib.request.urlopen(f"{exporter}/api/v1/signals", timeout=5) as r:
                    show(json.load(r))
            except (urllib.error.URLError, OSError) as err:
                print(f"  exporter unreachable: {err}")
            if args.duration and time.monotonic() - started >= args.duration:
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="demo server device: cpu or sim:h200")
    parser.add_argument("--duration", type=float, default=0, help="stop after N s (0: Ctrl-C)")
    parser.add_argument("--exporter-port", type=int, default=9500)
    parser.add_argument("--dashboard-port", type=int, default=8501)
    parser.add_argument(
        "--phase-scale",
        type=float,
        default=1.0,
        help="run every phase, and the exporter's interval, window and hold, this many "
        "times as long (default: %(default)s, the demo as documented)",
    )
    args = parser.parse_args(argv)
    if args.phase_scale <= 0:
        parser.error(f"--phase-scale must be above 0 (got {args.phase_scale:g})")
    procs = Processes()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server, exporter = start_services(args, procs)
        run_phases(args, procs, server, exporter)
    except KeyboardInterrupt:
        print("\ndemo: stopping")
    except NotReady as err:
        raise SystemExit(f"demo: {err}") from None
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
