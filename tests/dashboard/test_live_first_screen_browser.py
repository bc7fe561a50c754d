"""The Live page's first screen in Chromium at 1400x900, with no scrolling, for targets in
three states a user must tell apart at a glance (tests/support/live_screens.py): the
state chip and a headline of at most 12 words naming its numbers, the chart drawn, and
every saturation banner one line; no "seed" anywhere on any of the four pages.

The screenshots of each first screen are kept in the test's tmp_path (run with
--basetemp to keep them).
"""

from __future__ import annotations

import re

import pytest

from batchscope.dashboard.headline import HEADLINE_WORDS
from tests.support import chromium
from tests.support.live_page import (
    FIRST_SCREEN,
    first_screen_problems,
    open_folded,
    read_first_screen,
)
from tests.support.live_screens import select_target, serving_screens

pytestmark = pytest.mark.slow

# target -> (the chip's words, its headline)
SCREENS = {
    "costly-embeddings": ("budget saturated", "p99 at 996% of the 50 ms budget for 69 s"),
    "steady-llm": ("healthy", "8 of 8 running, 2 waiting: batching is doing its job"),
    "memory-llm": ("memory-bound", "3 of 8 running, 6 waiting: KV 97% full, 0.33 preemptions/s"),
}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    with serving_screens(tmp_path_factory.mktemp("dashboard")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium.EXECUTABLE, args=chromium.ARGS)
        yield browser
        browser.close()


def test_the_first_screen_answers_for_each_state_without_scrolling(
    dashboard, browser, tmp_path
) -> None:
    page = browser.new_page(viewport=FIRST_SCREEN)
    page.goto(dashboard)
    page.get_by_text("Fleet, worst first").wait_for(timeout=60_000)
    for target, (state, headline) in SCREENS.items():
        select_target(page, target)
        read = read_first_screen(page, tmp_path / f"live-{target}.png")
        assert first_screen_problems(read) == [], (target, read)
        assert (read["chip"], read["headline"]) == (state, headline)
        assert len(read["headline"].split()) <= HEADLINE_WORDS
        # two saturated targets in the fleet: a line each, with how far over
        assert [b["text"] for b in read["banners"]] == [
            "Budget saturated: saturated-llm for 69 s, p99 at 497% of the 2 s budget",
            "Budget saturated: costly-embeddings for 69 s, p99 at 996% of the 50 ms budget",
        ]
        assert f"Target {target}" in read["text"]
        # the replica count of the target's model, on the first screen too
        model = "tiny" if target.endswith("-llm") else target
        assert f"Replicas of {model}: " in read["text"], read["text"]
        assert read["chart"] >= 3  # the batch, the queue, budget used (and the cap)
    page.close()


def test_the_full_reason_opens_from_a_banner(dashboard, browser) -> None:
    page = browser.new_page(viewport=FIRST_SCREEN)
    page.goto(dashboard)
    banner = page.get_by_test_id("stExpander").filter(has_text="Budget saturated: saturated-llm")
    banner.locator("summary").click()
    banner.get_by_text("Latency has stayed at or above 95% of the budget for 69 s").wait_for(
        timeout=30_000
    )
    page.close()


@pytest.mark.parametrize("path", ["", "calculator", "load_tests", "alerts"])
def test_no_page_says_seed(dashboard, browser, path: str) -> None:
    page = browser.new_page(viewport=FIRST_SCREEN)
    page.goto(f"{dashboard}/{path}")
    page.get_by_test_id("stMainBlockContainer").locator("h1").first.wait_for(timeout=60_000)
    if path == "":
        page.locator(".st-key-live_overview .js-plotly-plot:visible").first.wait_for(timeout=60_000)
        open_folded(page)
    if path == "calculator":
        page.get_by_test_id("stMetricValue").first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    assert text.strip()
    assert not re.search(r"seed", text, re.IGNORECASE), text
    page.close()
