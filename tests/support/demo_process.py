"""The demo server as a user runs it: `python -m batchscope.demo_server.cli`, its own process, on a free port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.monitoring_stack import process, python_env
from tests.support.network import free_port
from tests.support.paths import REPO

# How long the server may take to answer /health: it loads torch on a loaded machine.
START_SECONDS = 120.0
# How long a terminated server may take to drain before it is killed.
STOP_SECONDS = 30.0


@contextmanager
def running_demo_server(*flags: str, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start the demo server with `flags` (and `--port`) under this interpreter; yield its
    base URL and process once GET /health answers.

    Its stdout and stderr go to `log`. Fails, naming `log` and ending with its tail, if
    the server exits first or does not answer within START_SECONDS. On exit the server is
    terminated, and killed if still running STOP_SECONDS later; one that already exited
    (a test may stop it itself) is left as it is.
    """
    port = free_port()
    command = [sys.executable, "-m", "batchscope.demo_server.cli", "--port", str(port), *flags]
    with process(
        "demo-server",
        command,
        port,
        REPO,
        "/health",
        python_env(),
        log=log,
        start_seconds=START_SECONDS,
        stop_seconds=STOP_SECONDS,
    ) as server:
        yield server.url, server.popen
