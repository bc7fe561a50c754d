"""The dashboard in a real browser: Debian's Chromium through playwright, against the demo
server under load, scraped by the exporter running inside `batchscope-dashboard --target`.

Saves the calculator's and the load tests' screenshots the README shows (docs/img/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchscope.dashboard import ui
from batchscope.dashboard.calculator import MIXED_LENGTHS, ONE_LONG_ANSWER
from batchscope.dashboard.states import STATES
from batchscope.demo_server.names import MODEL_NAME
from tests.support import chromium
from tests.support.demo_process import running_demo_server
from tests.support.live_page import open_folded
from tests.support.network import free_port, wait_http
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

ROOT = REPO
SCREENSHOTS = ROOT / "docs" / "img"
VIEWPORT = {"width": 1400, "height": 2200}


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """The demo server under a short load sweep, and the dashboard with its own exporter."""
    logs = tmp_path_factory.mktemp("browser")
    dashboard_port = free_port()
    with running_demo_server(
        *("--batching", "continuous", "--max-num-seqs", "8", "--kv-cache-tokens", "2048"),
        log=logs / "server.log",
    ) as (server, server_process):
        procs = [
            start(
                [
                    "-m",
                    "batchscope.dashboard.cli",
                    "--target",
                    f"{server}/metrics",
                    "--name",
                    "demo",
                    "--cap",
                    "8",
                    "--budget-seconds",
                    "2",
                    "--interval",
                    "1",
                    "--window-seconds",
                    "10",
                    "--port",
                    str(dashboard_port),
                ],
                logs / "dashboard.log",
            )
        ]
        try:
            dashboard = f"http://127.0.0.1:{dashboard_port}"
            wait_http(
                f"{dashboard}/_stcore/health",
                60,
                logs / "dashboard.log",
                processes=[server_process, *procs],
            )
            result = logs / "sweep.json"
            # The sweep runs while the pages are looked at: the Live page has traffic to show.
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "batchscope.demo_server.loadgen.run",
                        "--url",
                        server,
                        "--endpoint",
                        "completions",
                        "--rates",
                        "2,4,8",
                        "--duration",
                        "12",
                        "--max-tokens",
                        "32,128,256",
                        "--json",
                    ],
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                    stdout=result.open("w"),
                )
            )
            yield dashboard, procs[-1], result
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed (make install installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=chromium.ARGS)
        yield browser
        browser.close()


def test_live_page_shows_the_target_its_diagnosis_and_charts(demo, browser, tmp_path) -> None:
    dashboard, _, _ = demo
    time.sleep(12)  # a window's worth of traffic
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(dashboard)
    page.get_by_text("Fleet, worst first").wait_for(timeout=60_000)
    page.get_by_text("Target demo").wait_for(timeout=30_000)
    page.locator(".st-key-live_overview .js-plotly-plot:visible").first.wait_for(timeout=90_000)
    open_folded(page)
    # Every panel of the folded charts drawn, or saying its engine does not expose it:
    # eight and the diagnosis over time, the last drawn.
    charts = page.get_by_test_id("stExpander").filter(has_text="All charts over the range")
    charts.locator(".gtitle").filter(has_text="Diagnosis over time").wait_for(timeout=90_000)
    drawn = charts.locator(".js-plotly-plot:visible").count()
    notes = charts.get_by_text("not exposed by this engine").count()
    assert drawn + notes >= 9, (drawn, notes)
    text = page.inner_text("body")
    assert any(look.words in text for look in STATES.values()), text[:2000]
    assert "Next:" in text
    # Pick the generation model by its name (the demo also serves embeddings); the choice
    # survives the page's own refresh.
    page.get_by_test_id("stSelectbox").filter(has_text="Model").click()
    page.get_by_role("option", name=MODEL_NAME, exact=True).click()
    time.sleep(ui.REFRESH_SECONDS + 2)
    open_folded(page)
    running = page.get_by_test_id("stMetric").first.inner_text()
    assert running.endswith("/ 8"), running  # the generation's cap, not the target's 8 + 32
    time.sleep(2)  # let plotly finish drawing before the picture
    # A record for the reader; the README's Live screenshots come from scripts/demo_walk.py.
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    page.close()


def test_calculator_page_computes_in_the_browser(demo, browser) -> None:
    dashboard, _, _ = demo
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(f"{dashboard}/calculator")
    page.get_by_test_id("stMetricValue").get_by_text("0.5234375").wait_for(timeout=60_000)
    page.get_by_test_id("stRadio").get_by_text(ONE_LONG_ANSWER).click()
    page.get_by_test_id("stMetricValue").get_by_text("0.25", exact=True).wait_for(timeout=30_000)
    page.get_by_test_id("stRadio").get_by_text(MIXED_LENGTHS).click()
    page.get_by_test_id("stMetricValue").get_by_text("0.5234375").wait_for(timeout=30_000)
    page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
    time.sleep(1)
    page.screenshot(path=str(SCREENSHOTS / "calculator.png"), full_page=True)
    page.close()


def test_load_tests_page_draws_a_real_sweep(demo, browser) -> None:
    dashboard, sweep, result = demo
    assert sweep.wait(timeout=120) == 0
    runs = json.loads(result.read_text())
    assert [r["rate_per_s"] for r in runs] == [2, 4, 8]
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{dashboard}/load_tests")
    page.get_by_text("No results opened yet.").wait_for(timeout=60_000)
    page.locator("input[type=file]").set_input_files(str(result))
    page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
    time.sleep(1)
    page.screenshot(path=str(SCREENSHOTS / "load-tests.png"), full_page=True)
    page.close()
