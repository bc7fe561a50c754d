"""The demo server as a user runs it: `python -m demo_server.cli`, its own process, on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.network import free_port, wait_http
from tests.support.paths import REPO

# How long the server may take to answer /health: it loads torch on a loaded machine.
START_SECONDS = 120.0
# How long a terminated server may take to drain before it is killed.
STOP_SECONDS = 30.0


@contextmanager
def running_demo_server(*flags: str, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start the demo server with `flags` (and `--port`) under this interpreter; yield its
    base URL and process once GET /health answers.

    Its stdout and stderr go to `log`. Raises `network.NotReady`, naming `log` and ending
    with its tail, if the server exits first or does not answer within START_SECONDS. On
    exit the server is terminated, and killed if still running STOP_SECONDS later; one
    that already exited (a test may stop it itself) is left as it is.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "demo_server.cli", "--port", str(port), *flags]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"{url}/health", START_SECONDS, log, processes=[process])
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
