"""Real Prometheus, Alertmanager, VictoriaMetrics, vmalert and batchscope processes for the
tests, on 127.0.0.1.

Each starts in a temporary directory on a free port and is stopped by the fixture that
started it. A missing binary fails the test with the command that installs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.support.network import free_port, wait_until
from tests.support.paths import REPO
from tests.support.system_tools import tool

REPO = REPO


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


@dataclass
class Process:
    name: str
    port: int
    log: Path
    popen: subprocess.Popen
    # How long a terminated process may take to drain before it is killed.
    stop_seconds: float = 10.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate the process, and kill it if still running `stop_seconds` later; one
        that already exited (a test may stop it itself) is left as it is."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=self.stop_seconds)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@contextmanager
def process(
    name: str,
    args: list[str],
    port: int,
    workdir: Path,
    ready_path: str,
    env: dict[str, str] | None = None,
    *,
    log: Path | None = None,
    start_seconds: float = 60.0,
    stop_seconds: float = 10.0,
) -> Iterator[Process]:
    """Start `args` in `workdir`, its output to `log` (`workdir`/`name`.log by default);
    wait up to `start_seconds` until GET ready_path answers (an early exit fails at once,
    naming the log and its tail); stop it on exit (`Process.stop`)."""
    log = log or workdir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env)
    proc = Process(name, port, log, popen, stop_seconds)
    try:
        wait_until(
            lambda: http_get(proc.url + ready_path) is not None,
            start_seconds,
            f"{name} on port {port}",
            log,
            processes=[popen],
        )
        yield proc
    finally:
        proc.stop()


def python_env() -> dict[str, str]:
    """This environment, with the checkout importable and Python's output unbuffered (a
    log read while the process runs shows what it printed)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


@contextmanager
def exporter(workdir: Path, *flags: str) -> Iterator[Process]:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "batchscope.exporter.cli",
        "--listen",
        f"127.0.0.1:{port}",
        *flags,
    ]
    with process("exporter", args, port, workdir, "/metrics", python_env()) as proc:
        yield proc


@contextmanager
def prometheus(
    workdir: Path,
    scrape_configs: list[dict],
    rule_files: dict[str, str],
    alertmanager_url: str | None = None,
    interval: str = "1s",
    resend_delay: str | None = "1s",
) -> Iterator[Process]:
    """A Prometheus with these scrape jobs and rule files (name -> text). `resend_delay`:
    how often a firing alert is sent again (None: Prometheus' default, 1m). An alert sent
    is valid for four of them, so at 1s a Prometheus starved for 4 s lets Alertmanager
    resolve it in between."""
    port = free_port()
    names = []
    for name, text in rule_files.items():
        (workdir / name).write_text(text)
        names.append(name)
    config: dict = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": names,
        "scrape_configs": scrape_configs,
    }
    if alertmanager_url:
        target = urllib.parse.urlsplit(alertmanager_url).netloc
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [tool("promtool"), "check", "config", str(workdir / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    args = [
        tool("prometheus"),
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *([f"--rules.alert.resend-delay={resend_delay}"] if resend_delay else []),
    ]
    with process("prometheus", args, port, workdir, "/-/ready") as proc:
        yield proc


@contextmanager
def victoria_metrics(
    workdir: Path, scrape_configs: list[dict], interval: str = "1s"
) -> Iterator[Process]:
    """A single-node VictoriaMetrics scraping these jobs itself (`-promscrape.config`),
    answering the Prometheus query API. Queries see a sample as soon as it is stored (its
    default hides the last 30 s) and are never answered from its cache: a test reads
    points seconds old."""
    port = free_port()
    config = {"global": {"scrape_interval": interval}, "scrape_configs": scrape_configs}
    (workdir / "vm-scrape.yml").write_text(yaml.safe_dump(config))
    args = [
        tool("victoria-metrics"),
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={workdir / 'vm-data'}",
        f"-promscrape.config={workdir / 'vm-scrape.yml'}",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-retentionPeriod=1d",
    ]
    with process("victoria-metrics", args, port, workdir, "/health") as proc:
        yield proc


@contextmanager
def vmalert(
    workdir: Path,
    datasource: Process,
    rule_files: dict[str, str],
    notifier_url: str,
    interval: str = "1s",
) -> Iterator[Process]:
    """vmalert evaluating these rule files (name -> text) every `interval` against
    `datasource` (a VictoriaMetrics), writing recorded series and alert states back to it
    (flushed every `interval`, so a rule that reads another's series lags it by about one
    evaluation) and posting alerts to `notifier_url`."""
    port = free_port()
    for name, text in rule_files.items():
        (workdir / name).write_text(text)
    args = [
        tool("vmalert"),
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-datasource.url={datasource.url}",
        f"-remoteWrite.url={datasource.url}",
        f"-remoteWrite.flushInterval={interval}",
        f"-evaluationInterval={interval}",
        f"-notifier.url={notifier_url}",
        *(f"-rule={workdir / name}" for name in rule_files),
    ]
    with process("vmalert", args, port, workdir, "/health") as proc:
        yield proc


def query(prom: Process, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    body = json.loads(http_get(f"{prom.url}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def query_range(prom: Process, expr: str, start: float, end: float, step: float = 1.0) -> dict:
    """{timestamp: value} of the single series `expr` returns (empty when none)."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    body = json.loads(http_get(f"{prom.url}/api/v1/query_range?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    result = body["data"]["result"]
    assert len(result) <= 1, f"{expr} returned {len(result)} series: {result}"
    return {float(t): float(v) for t, v in result[0]["values"]} if result else {}


@dataclass
class Webhook:
    """A local Alertmanager webhook receiver that keeps every notification it gets."""

    port: int
    notifications: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def alerts(self, name: str, status: str = "firing") -> list[dict]:
        return [
            a
            for n in list(self.notifications)
            for a in n["alerts"]
            if a["labels"].get("alertname") == name and a["status"] == status
        ]


@contextmanager
def webhook() -> Iterator[Webhook]:
    received = Webhook(0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.notifications.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with serving(Handler) as server:
        received.port = server.server_address[1]
        yield received


@contextmanager
def alertmanager(workdir: Path, webhook_url: str) -> Iterator[Process]:
    """Alertmanager routing everything at once to `webhook_url`."""
    port = free_port()
    config = {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname", "target"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url}]}],
    }
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
    args = [
        tool("alertmanager"),
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # one instance: no gossip port
    ]
    with process("alertmanager", args, port, workdir, "/-/ready") as proc:
        yield proc


@contextmanager
def payload_server(render: Callable[[], str]) -> Iterator[str]:
    """Serve `render()` as /metrics on a free port; yields the URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """A threaded HTTP server of `handler` on a free local port, for the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
