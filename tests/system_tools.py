"""Finding the Prometheus tools the tests start: a missing one fails, naming the fix."""

from __future__ import annotations

import shutil
import socket

import pytest

# Debian names Alertmanager's binary prometheus-alertmanager.
TOOLS = {
    "promtool": ("promtool",),
    "amtool": ("amtool",),
    "prometheus": ("prometheus",),
    "alertmanager": ("prometheus-alertmanager", "alertmanager"),
}


def tool(name: str) -> str:
    """The path of a Prometheus tool; fails the test (never skips) when it is missing."""
    for candidate in TOOLS[name]:
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(f"{name} is not installed: run `make system-packages` (Debian packages "
                "prometheus and prometheus-alertmanager)", pytrace=False)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
