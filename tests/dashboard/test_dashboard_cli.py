"""`batchscope-dashboard`: the flags, and the one-command mode with the exporter inside."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.dashboard.cli import streamlit_args
from batchscope.dashboard.client import get_json
from tests.support.network import free_port, wait_http, wait_until
from tests.support.paths import REPO
from tests.support.scripted_fleet import ScriptedTargets
from tests.support.vllm_payload import VllmState

ROOT = REPO
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_streamlit_runs_headless_on_the_address_without_usage_stats() -> None:
    args = streamlit_args("127.0.0.1", 8600)
    assert args[:2] == ["run", str(ROOT / "dashboard" / "app.py")]
    for flag in (
        "--server.headless=true",
        "--server.address=127.0.0.1",
        "--server.port=8600",
        "--browser.gatherUsageStats=false",
    ):
        assert flag in args


@pytest.mark.integration
def test_target_and_exporter_together_are_refused() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchscope.dashboard.cli",
            "--exporter",
            "http://127.0.0.1:9500",
            "--target",
            "http://127.0.0.1:8000/metrics",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--exporter reads another exporter; --target/--config run one here" in done.stderr


@pytest.mark.integration
def test_one_command_scrapes_the_target_inside_the_app(tmp_path: Path) -> None:
    targets = ScriptedTargets(
        {"llm": (VllmState(running=6, waiting=1, kv_usage=0.5), lambda s: s.finish(1, 0.5, 40))}
    )
    targets.start()
    port = free_port()
    log = tmp_path / "dashboard.log"
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchscope.dashboard.cli",
            "--target",
            targets.metrics_url("llm"),
            "--name",
            "llm",
            "--cap",
            "8",
            "--budget-seconds",
            "2",
            "--interval",
            "0.5",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=ENV,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60, log, processes=[app])
        api = re.search(r"exporter API and /metrics at (http://\S+)", log.read_text())
        assert api is not None, log.read_text()

        def running_six() -> dict | None:
            doc = get_json(f"{api.group(1)}/api/v1/signals")
            return doc if doc["targets"] and doc["targets"][0]["total"]["running"] == 6 else None

        doc = wait_until(running_six, 20, "the target's running 6 in the app's API", interval=0.3)
        assert doc["targets"][0]["target"] == "llm"
        assert doc["targets"][0]["total"]["cap"] == 8
        assert f"open http://127.0.0.1:{port} (reading {api.group(1)})" in log.read_text()
    finally:
        app.terminate()
        app.wait(timeout=20)
        targets.stop()
