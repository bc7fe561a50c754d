"""Finding the system tools the tests start (Prometheus's, openssl): a missing one fails,
naming the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# Debian names Alertmanager's binary prometheus-alertmanager.
TOOLS = {
    "promtool": ("promtool",),
    "amtool": ("amtool",),
    "prometheus": ("prometheus",),
    "alertmanager": ("prometheus-alertmanager", "alertmanager"),
    "victoria-metrics": ("victoria-metrics",),
    "vmalert": ("vmalert",),
}


def tool(name: str) -> str:
    """The path of a Prometheus or VictoriaMetrics tool; fails the test (never skips) when
    it is missing."""
    for candidate in TOOLS[name]:
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(
        f"{name} is not installed: run `make system-packages` (Debian packages "
        "prometheus, prometheus-alertmanager and victoria-metrics)",
        pytrace=False,
    )


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, valid one day, and its key (openssl, in `folder`)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
