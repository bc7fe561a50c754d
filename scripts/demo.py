"""`make demo`: the bundled demo server under varying load, the exporter, the dashboard.

Prints the dashboard's URL first, then starts two demo servers, `batchscope-exporter`
pointed at both, the Streamlit dashboard on the exporter, and load generators that cycle
through four phases, each named for what the dashboard then shows:

- light: little traffic, so both services read underloaded;
- heavy: the LLM at its cap of 8 with a queue, the embeddings batcher in large batches
  within its budget;
- long answers: answers of 128 and 768 tokens fill the LLM's 2048-token KV cache, which
  binds (memory-bound or preempting), and their mixed lengths show what static batching
  would waste;
- overload: more than the LLM can serve; its latency budget saturates (the banner).

The LLM (vLLM's metric names, a 10 s budget) runs on this machine's CPU. The embeddings
batcher runs on a simulated H200, 100 times slower than the real one, with its budget and
traffic scaled to match (1 s, a real H200's 10 ms): on a CPU a batch of embeddings costs
about in proportion to its size, so batching buys nothing there to show, while the
simulated device's cost is nearly flat in the batch size, as a GPU's is. The printout
and the target's name say so. Each runs in its own demo server, so neither waits on the
other's Python.

Each phase lasts its length; a load generator that stops before its phase ends is
reported with the end of its log. Logs of every process are kept in a folder the demo
prints. Prints the exporter's signals every few seconds until Ctrl-C or --duration.
Everything binds 127.0.0.1.

`--phase-scale F` runs every phase F times as long, and the exporter's interval, window
and hold with them, so each phase tells the same story in less time (the browser test
walks the phases at 0.5); 1, the default, is the demo as documented.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.network import NotReady, free_port, wait_http  # noqa: E402

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent

LLM_TARGET = "demo-llm"
EMBEDDINGS_TARGET = "embeddings-sim-h200"
# The simulated H200 of the embeddings server: this many times slower than the real one,
# so that a loaded 2-core CPU finishes a batch of 32 within the simulated time, and the
# budget scaled with it.
EMBEDDINGS_SLOWDOWN = 100
EMBEDDINGS_BUDGET_MS = 10 * EMBEDDINGS_SLOWDOWN
# The start of the line a load generator that stopped before its phase ended prints.
LOAD_STOPPED = "demo: a load generator stopped before its phase ended"
SHOW_EVERY_S = 5.0


@dataclass(frozen=True)
class Phase:
    """One phase of the demo: its length at scale 1, the completions it offers (per
    second, their lengths drawn from `max_tokens`, at most `in_flight` of them sent and
    unanswered: more are not sent) and the embedding requests (per second, each of
    `texts` texts, which the batcher queues as one item each)."""

    name: str
    seconds: float
    completions_per_s: float
    max_tokens: str
    in_flight: int | None
    embedding_requests_per_s: float
    texts: int


# Light comes first and lasts a minute and a half, the time a dashboard takes to open on
# a loaded machine, and keeps a few completions in flight, never enough to fill the batch
# or the KV cache however slow the machine. Heavy and long answers offer more
# completions than the LLM serves, with a bound on those in flight: its batch stays at
# its cap (or at what the KV cache holds) with a few waiting, however fast or loaded this
# machine is. Overload has no bound: its queue grows until its latency saturates the
# budget. Embeddings come 4 texts a request when they come fast, so that the HTTP work of
# the requests leaves a loaded machine's CPU to the batches.
PHASES = (
    Phase("light", 90, 5, "128,256,384", 3, 0.5, 1),
    Phase("heavy", 60, 40, "32,96,192", 12, 15, 4),
    Phase("long answers", 60, 6, "128,768", 8, 2, 4),
    Phase("overload", 90, 40, "64,256,400", None, 30, 4),
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


def write_fleet(folder: Path, llm: str, embeddings: str) -> Path:
    """The exporter's fleet file: the LLM (vLLM names, judged against a 10 s budget) and
    the embeddings batcher (its own budget, from its metrics): two services, two rows."""
    path = folder / "fleet.yaml"
    path.write_text(
        "targets:\n"
        f"  - {{name: {LLM_TARGET}, url: '{llm}/metrics', engine: vllm, cap: 8, "
        "budget_seconds: 10}\n"
        f"  - {{name: {EMBEDDINGS_TARGET}, url: '{embeddings}/metrics', engine: inhouse}}\n"
    )
    return path


def spawn(log: Path, *cmd: str) -> subprocess.Popen:
    """A process started in the checkout, its output written to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process still running, then wait for each (a kill after 15 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Services:
    """The demo's servers, exporter and dashboard, each writing its own log in `logs`:
    started in order, stopped together."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, name: str, *cmd: str) -> subprocess.Popen:
        log = self.logs / f"{name}.log"
        proc = spawn(log, *cmd)
        self.started.append((proc, log))
        return proc

    def processes(self) -> list[subprocess.Popen]:
        return [proc for proc, _ in self.started]

    def exited(self) -> list[str]:
        """Each service that has exited, with the end of its log."""
        return [
            f"demo: {log.stem} exited (status {proc.returncode}); the end of {log}:\n"
            + log_tail(log)
            for proc, log in self.started
            if proc.poll() is not None
        ]


def start_server(procs: Services, log_name: str, *flags: str) -> str:
    """A demo server on a free port with these flags, once it answers; its URL."""
    port = free_port()
    procs.start(log_name, str(BIN / "batchscope-demo-server"), "--port", str(port), *flags)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 120, procs.logs / f"{log_name}.log", processes=procs.processes())
    return url


def start_services(args: argparse.Namespace, procs: Services) -> tuple[str, str, str]:
    """The two demo servers, the exporter on them and the dashboard on the exporter, each
    up before the next starts; the LLM's, the embeddings' and the exporter's URLs."""
    exporter = f"http://127.0.0.1:{args.exporter_port}"
    dashboard = f"http://127.0.0.1:{args.dashboard_port}"
    print(f"demo: open the dashboard at {dashboard} (it comes up in about a minute)")
    print(f"demo: every process writes its log in {procs.logs}")
    print(f"demo: starting the LLM's demo server (device {args.device})")
    llm = start_server(
        procs,
        "llm-server",
        *("--batching", "continuous", "--max-num-seqs", "8", "--kv-cache-tokens", "2048"),
        *("--device", args.device),
    )
    print(
        f"demo: starting the embeddings' demo server on a SIMULATED H200, "
        f"{EMBEDDINGS_SLOWDOWN} times slower than the real one (its budget "
        f"{EMBEDDINGS_BUDGET_MS} ms, a real H200's {EMBEDDINGS_BUDGET_MS // EMBEDDINGS_SLOWDOWN} "
        "ms): on this CPU a batch costs about in proportion to its size, so batching would "
        "show nothing"
    )
    embeddings = start_server(
        procs,
        "embeddings-server",
        *("--device", "sim:h200", "--sim-slowdown", str(EMBEDDINGS_SLOWDOWN)),
        *("--embed-batching", "adaptive", "--latency-budget-ms", str(EMBEDDINGS_BUDGET_MS)),
    )
    print(f"demo: LLM at {llm}, embeddings at {embeddings}; starting the exporter on {exporter}")
    procs.start(
        "exporter",
        str(BIN / "batchscope-exporter"),
        *("--config", str(write_fleet(procs.logs, llm, embeddings))),
        *("--listen", f"127.0.0.1:{args.exporter_port}", *exporter_timing(args.phase_scale)),
    )
    wait_http(f"{exporter}/health", 30, procs.logs / "exporter.log", processes=procs.processes())
    print(f"demo: starting the dashboard on {dashboard}")
    procs.start(
        "dashboard",
        sys.executable,
        *("-m", "batchscope.dashboard.cli", "--exporter", exporter),
        *("--port", str(args.dashboard_port)),
    )
    wait_http(
        f"{dashboard}/_stcore/health", 60, procs.logs / "dashboard.log", processes=procs.processes()
    )
    print(f"demo: dashboard ready at {dashboard}")
    print(f"demo: signals at {exporter}/api/v1/signals, Prometheus text at {exporter}/metrics")
    print("demo: Ctrl-C stops everything\n")
    return llm, embeddings, exporter


@dataclass
class Load:
    """One load generator of a phase: what it loads, its process and its log."""

    endpoint: str
    proc: subprocess.Popen
    log: Path
    reported: bool = False


def start_load(
    procs: Services, urls: tuple[str, str], phase: Phase, seconds: float, seed: int
) -> list[Load]:
    """One phase's load generators: completions to the LLM, embeddings to the embeddings
    server, at the phase's rates. Each runs its step to the end, over-saturated or not
    (the overload phase is meant to be)."""
    llm, embeddings = urls
    bounded = f", at most {phase.in_flight} in flight" if phase.in_flight else ""
    texts = phase.embedding_requests_per_s * phase.texts
    print(
        f"demo: phase {phase.name}: {phase.completions_per_s:g} completions/s of "
        f"{phase.max_tokens} tokens{bounded}, {texts:g} embeddings/s "
        f"({phase.texts} a request), {seconds:g} s"
    )
    every = ("--duration", f"{seconds:g}", "--seed", str(seed), "--keep-over-saturated")
    limit = ("--concurrency-limit", str(phase.in_flight)) if phase.in_flight else ()
    flags = {
        "completions": (
            *("--url", llm, "--endpoint", "completions"),
            *("--rates", f"{phase.completions_per_s:g}", "--max-tokens", phase.max_tokens),
            *limit,
        ),
        "embeddings": (
            *("--url", embeddings, "--endpoint", "embeddings"),
            *("--rates", f"{phase.embedding_requests_per_s:g}"),
            *("--inputs-per-request", str(phase.texts)),
        ),
    }
    loads = []
    for endpoint, endpoint_flags in flags.items():
        name = f"{seed:02d}-{phase.name.replace(' ', '-')}-{endpoint}"
        log = procs.logs / f"{name}.log"
        loads.append(
            Load(
                endpoint, spawn(log, str(BIN / "batchscope-loadgen"), *endpoint_flags, *every), log
            )
        )
    return loads


def log_tail(path: Path, lines: int = 4) -> str:
    """The last lines of a log, indented, or a note that it is empty."""
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(f"    {line}" for line in text[-lines:]) or "    (its log is empty)"


def report_stopped(loads: list[Load], phase: Phase, ran: float, total: float) -> None:
    """Say which of the phase's load generators have exited before its end, with the end
    of its log; each once."""
    for load in loads:
        if load.reported or load.proc.poll() is None:
            continue
        load.reported = True
        print(
            f"{LOAD_STOPPED}: the {load.endpoint} load of phase {phase.name} exited after "
            f"{ran:.0f} s of {total:g} s (exit status {load.proc.returncode}), so the phase "
            f"runs on without it; the end of {load.log}:\n{log_tail(load.log)}"
        )


def show_signals(exporter: str) -> None:
    try:
        with urllib.request.urlopen(f"{exporter}/api/v1/signals", timeout=5) as r:
            show(json.load(r))
    except (urllib.error.URLError, OSError) as err:
        print(f"  exporter unreachable: {err}")


def run_phase(
    procs: Services, urls: tuple[str, str], exporter: str, phase: Phase, scale: float, seed: int
) -> bool:
    """One phase for its length (scaled), the exporter's signals shown every 5 s; its load
    generators stopped at its end. False when a demo process exited meanwhile."""
    seconds = phase.seconds * scale
    loads = start_load(procs, urls, phase, seconds, seed)
    started = time.monotonic()
    try:
        while (left := started + seconds - time.monotonic()) > 0:
            time.sleep(min(SHOW_EVERY_S, left))
            ran = time.monotonic() - started
            if ran < seconds:
                report_stopped(loads, phase, ran, seconds)
            if procs.exited():
                return False
            show_signals(exporter)
    finally:
        stop([load.proc for load in loads])
    return True


def run_phases(
    args: argparse.Namespace, procs: Services, urls: tuple[str, str], exporter: str
) -> None:
    """The phases in a loop until --duration (0: until stopped); stops at a demo process
    that exited, naming it and its log."""
    started = time.monotonic()
    index = 0
    while not args.duration or time.monotonic() - started < args.duration:
        phase = PHASES[index % len(PHASES)]
        index += 1
        if not run_phase(procs, urls, exporter, phase, args.phase_scale, index):
            print("\n".join(procs.exited()))
            raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="the LLM's device: cpu or sim:h200")
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
    procs = Services(Path(tempfile.mkdtemp(prefix="batchscope-demo-")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        llm, embeddings, exporter = start_services(args, procs)
        run_phases(args, procs, (llm, embeddings), exporter)
    except KeyboardInterrupt:
        print("\ndemo: stopping")
    except NotReady as err:
        raise SystemExit(f"demo: {err}") from None
    finally:
        stop(procs.processes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
