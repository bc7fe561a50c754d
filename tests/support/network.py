"""Local ports for the servers the tests and benchmarks start, and waiting until they are up.

scripts/ import this too (with the repository root on sys.path), so it needs nothing but
the standard library.
"""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# A process a wait depends on: the wait fails as soon as it exits.
Process = subprocess.Popen | multiprocessing.Process
# How much of a log a failed wait shows: its end, where the reason usually is.
LOG_TAIL_CHARS = 3000


class NotReady(RuntimeError):
    """What a wait was for did not happen: its time ran out, or a process it needs exited."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    predicate: Callable[[], T],
    seconds: float,
    what: str,
    log: Path | None = None,
    *,
    processes: Sequence[Process] = (),
    seen: object = None,
    interval: float = 0.25,
    ignore: tuple[type[BaseException], ...] = (OSError, ValueError),
) -> T:
    """Call `predicate` every `interval` seconds until it returns a true value; return that.

    An exception of a kind in `ignore` (a server not listening yet, a half-written body)
    counts as not yet. Raises NotReady naming `what` after `seconds`, or as soon as one of
    `processes` exits, with what `seen` holds by then, the last error ignored and the end
    of `log`.
    """
    deadline = time.monotonic() + seconds
    error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as err:
            error = err
        else:
            if result:
                return result
        for process in processes:
            code = process.poll() if isinstance(process, subprocess.Popen) else process.exitcode
            if code is not None:
                reason = f"{_name(process)} exited with code {code} while waiting for {what}"
                raise NotReady(_explained(reason, seen, error, log))
        if time.monotonic() > deadline:
            reason = f"timed out after {seconds:g} s waiting for {what}"
            raise NotReady(_explained(reason, seen, error, log))
        time.sleep(interval)


def wait_http(
    url: str, seconds: float, log: Path | None = None, *, processes: Sequence[Process] = ()
) -> None:
    """Wait until a GET of `url` answers with a success status (see `wait_until`)."""

    def answers() -> bool:
        with urllib.request.urlopen(url, timeout=2):
            return True

    wait_until(answers, seconds, f"{url} to answer", log, processes=processes, interval=0.5)


def _name(process: Process) -> str:
    return str(process.args[0]) if isinstance(process, subprocess.Popen) else process.name


def _explained(reason: str, seen: object, error: BaseException | None, log: Path | None) -> str:
    lines = [reason]
    if seen is not None:
        lines.append(f"so far: {seen}")
    if error is not None:
        lines.append(f"last error: {type(error).__name__}: {error}")
    if log is not None and log.exists():
        lines.append(f"{log}:\n{log.read_text(errors='replace')[-LOG_TAIL_CHARS:]}")
    return "\n".join(lines)
