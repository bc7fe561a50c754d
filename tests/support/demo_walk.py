"""A walk through `make demo`'s four phases in Chromium, as a user watches the Live page.

`walk` starts `scripts/demo.py` (at a phase scale: 1 is the demo as documented), opens
the Live page at 1400x900 with the LLM selected, follows the demo's "demo: phase ..."
lines, and in each phase waits, from a third of the way in, for the phase to show its
name (`demo_phases`: on the exporter's signals and on the page's state chip). Then, on
the first screen, with no scrolling (`first_screen_problems`), saved as the phase's
picture:

- the selected target's state chip and its headline, of at most 12 words;
- the chart drawn;
- no saturation banner over one line;
- no "seed" and no "None" in the text above the fold.

Then, with the folded boxes opened (a full-page screenshot where asked), what a reader
must never see:

- "None" anywhere on the page (the fleet table's cells included);
- a metric tile whose value is cut off;
- "nothing to fix" beside a budget used above 100%: on the page, and for every target
  and model the exporter's signals list (the same next steps the page shows);
- a fleet table wider than the page (its key columns must show without scrolling).

A phase that has not shown its name by nine tenths of its length is saved as it is, with
what it lacked. The walk ends when the last phase does, so each phase's printout is read
whole: a load generator that stopped before its phase ended is kept with the phase.

Used by the browser test (a walk at half length) and by `scripts/demo_walk.py` (the
full-length walk whose screenshots the README shows).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from batchscope.dashboard.client import get_json
from batchscope.dashboard.next_steps import next_step
from tests.support import chromium
from tests.support.demo_phases import LLM, LOAD_STOPPED, SHOWS, Targets
from tests.support.network import free_port
from tests.support.paths import REPO

VIEWPORT = {"width": 1400, "height": 2400}
FIRST_SCREEN = {"width": 1400, "height": 900}
HEADLINE_WORDS = 12
SCROLL_TO_TOP = """() => document.querySelectorAll('*').forEach(e => {
  if (e.scrollTop) e.scrollTop = 0;
})"""
# The Live page's last folded box: drawn, the boxes above it are too.
LAST_FOLDED = "All charts over the range"
PHASE_LINE = re.compile(r"demo: phase (?P<name>[a-z ]+): .*, (?P<seconds>[0-9.]+) s$")
READY_LINE = "demo: dashboard ready"
# A phase is looked at from this share of its length (its load has started, the exporter
# has scraped it a few times) until this one; then it is saved as it is.
LOOK_FROM_SHARE = 1 / 3
LOOK_UNTIL_SHARE = 0.9
POLL_SECONDS = 1.0
SELECT_TRIES = 5
NOTHING_TO_FIX = "nothing to fix"
CHIP = ".st-key-live_state .stMarkdownBadge"

# The page's own numbers, read in the browser: each tile's value and whether it is cut
# off, the budget used tile, the fleet table's width against its frame, and every cell
# of the table as glide-data-grid lays it out for screen readers.
READ_PAGE = """() => {
  const tiles = [...document.querySelectorAll('[data-testid="stMetric"]')].map(m => {
    const label = m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim() ?? '';
    const value = m.querySelector('[data-testid="stMetricValue"]');
    const inner = value?.querySelector('div') ?? value;
    return {label, value: inner?.innerText ?? '',
            cut: inner ? inner.scrollWidth > inner.clientWidth + 1 : false};
  });
  const grid = document.querySelector('[data-testid="stDataFrame"]');
  const scroller = grid?.querySelector('.dvn-scroller');
  const cells = grid ? [...grid.querySelectorAll('td, [role="gridcell"]')].map(c => c.innerText) : [];
  return {tiles,
          table: scroller ? {scroll: scroller.scrollWidth, frame: scroller.clientWidth} : null,
          cells};
}"""


# The first screen as a user sees it without scrolling: the text fully inside the window,
# the state chip and headline of the selected target, the overview chart's drawn traces,
# and the lines each saturation banner takes.
READ_FIRST_SCREEN = """() => {
  const fold = window.innerHeight;
  const inside = r => r.width > 1 && r.height > 1 && r.top >= 0 && r.bottom <= fold
    && r.left >= 0 && r.right <= window.innerWidth;
  const seen = el => el != null && inside(el.getBoundingClientRect());
  const lines = el => {
    const range = document.createRange();
    range.selectNodeContents(el);
    const rects = [...range.getClientRects()].filter(r => r.width > 0);
    const middles = rects.map(r => (r.top + r.bottom) / 2).sort((a, b) => a - b);
    const height = Math.min(...rects.map(r => r.height));
    return middles.filter((m, i) => i === 0 || m - middles[i - 1] > height / 2).length;
  };
  const words = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    if (inside(range.getBoundingClientRect())) words.push(node.textContent.trim());
  }
  const state = sel => [...document.querySelectorAll(`.st-key-live_state ${sel}`)];
  const chip = state('.stMarkdownBadge').find(seen);
  const headline = state('[data-testid="stMarkdownContainer"]')
    .find(m => !m.querySelector('.stMarkdownBadge') && seen(m));
  // Streamlit keeps a replaced element, hidden, while it redraws: the one in sight counts.
  const plot = [...document.querySelectorAll('.st-key-live_overview .js-plotly-plot')]
    .find(seen);
  const labels = [...document.querySelectorAll('[data-testid="stExpander"] summary')]
    .filter(s => s.innerText.includes('Budget saturated'))
    .map(s => s.querySelector('[data-testid="stMarkdownContainer"]'));
  const more = [...document.querySelectorAll('[data-testid="stAlert"]')]
    .filter(a => a.innerText.includes('more targets have a saturated budget'));
  return {
    text: words.join('\\n'),
    chip: seen(chip) ? chip.innerText.trim() : '',
    headline: seen(headline) ? headline.innerText.trim() : '',
    chart: seen(plot) ? plot.querySelectorAll('.scatterlayer .trace').length : 0,
    banners: [...labels, ...more].filter(Boolean)
      .map(b => ({text: b.innerText.trim(), lines: lines(b)})),
  };
}"""


def first_screen_problems(read: dict) -> list[str]:
    """What the first screen (its READ_FIRST_SCREEN numbers) misses of one that answers
    the question without scrolling."""
    problems = []
    if not read["chip"]:
        problems.append("no state chip above the fold")
    words = len(read["headline"].split())
    if not words:
        problems.append("no headline above the fold")
    elif words > HEADLINE_WORDS:
        problems.append(f"a headline of {words} words: {read['headline']!r}")
    if not read["chart"]:
        problems.append("no chart drawn above the fold")
    for banner in read["banners"]:
        if banner["lines"] > 1:
            problems.append(f"a banner of {banner['lines']} lines: {banner['text']!r}")
    if re.search(r"seed", read["text"], re.IGNORECASE):
        problems.append("'seed' above the fold")
    if re.search(r"\bNone\b", read["text"]):
        problems.append("None above the fold")
    return problems


def open_folded(page) -> None:
    """Open every folded box of the Live page, as a user reading on would (once the last
    of them is drawn)."""
    page.get_by_text(LAST_FOLDED).wait_for(timeout=120_000)
    folded = page.locator('[data-testid="stExpander"] details:not([open]) > summary:visible')
    deadline = time.monotonic() + 60
    while folded.count() and time.monotonic() < deadline:
        folded.first.click()
    # Back to the top: the page scrolls itself, not the window, as the boxes open.
    page.evaluate(SCROLL_TO_TOP)


@dataclass
class PhaseView:
    """What the Live page showed in one phase: the state on its chip, what the phase was
    to show and did not (`unmet`), what was wrong with the page (`problems`), and the
    demo's lines saying a load generator of the phase stopped before its end."""

    phase: str
    screenshot: Path
    problems: list[str] = field(default_factory=list)
    shown_state: str = ""
    unmet: list[str] = field(default_factory=list)
    stopped_load: list[str] = field(default_factory=list)
    # What each look found lacking, with the seconds into the phase it looked at.
    looks: list[tuple[float, list[str]]] = field(default_factory=list)
    headline: str = ""


def page_problems(text: str, read: dict) -> list[str]:
    """What a reader must never see, on one view of the page (its text and its READ_PAGE
    numbers)."""
    problems = []
    if re.search(r"\bNone\b", text) or any(re.search(r"\bNone\b", c) for c in read["cells"]):
        problems.append("the page shows None")
    for tile in read["tiles"]:
        if tile["cut"]:
            problems.append(f"the tile {tile['label']!r} is cut off ({tile['value']!r})")
    used = [t["value"] for t in read["tiles"] if t["label"] == "budget used"]
    over = bool(used) and used[0].endswith("%") and float(used[0].rstrip("%")) > 100
    next_line = next((line for line in text.splitlines() if line.startswith("Next:")), "")
    if over and NOTHING_TO_FIX in next_line:
        problems.append(f"'nothing to fix' beside a budget used of {used[0]}")
    table = read["table"]
    if table is None:
        problems.append("no fleet table")
    elif table["scroll"] > table["frame"] + 2:
        problems.append(f"the fleet table is {table['scroll']} px wide in {table['frame']} px")
    return problems


def signals_problems(exporter: str) -> list[str]:
    """ "Nothing to fix" beside a budget used above 100% for any target or model the
    exporter judges now (what the page would show for it)."""
    problems = []
    for target in get_json(f"{exporter}/api/v1/signals")["targets"]:
        for series in (target["total"], *target["series"]):
            used = series.get("budget_utilization")
            state = (series.get("diagnosis") or {}).get("state", "")
            if used is not None and used > 1 and NOTHING_TO_FIX in next_step(state):
                problems.append(f"{target['target']}: {state} beside a budget used of {used:.0%}")
    return problems


def targets(exporter: str) -> Targets:
    """The exporter's signals now, by target name."""
    return {t["target"]: t for t in get_json(f"{exporter}/api/v1/signals")["targets"]}


@contextmanager
def running_demo(scale: float) -> Iterator[tuple[str, str, queue.Queue]]:
    """`scripts/demo.py` at `scale` on free ports: the dashboard's and the exporter's
    URLs, and a queue of its output lines, each with the time.monotonic() it was read at;
    stopped (everything it started) at the end."""
    dashboard_port, exporter_port = free_port(), free_port()
    demo = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(REPO / "scripts" / "demo.py"),
            *("--phase-scale", f"{scale:g}"),
            *("--dashboard-port", str(dashboard_port), "--exporter-port", str(exporter_port)),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put((time.monotonic(), x.rstrip())) for x in demo.stdout],
        daemon=True,
    ).start()
    try:
        yield f"http://127.0.0.1:{dashboard_port}", f"http://127.0.0.1:{exporter_port}", lines
    finally:
        demo.send_signal(signal.SIGTERM)  # the demo stops what it started
        demo.wait(timeout=60)


def next_line(
    lines: queue.Queue, deadline: float, log: list[str], wanted: re.Pattern
) -> tuple[re.Match, float]:
    """The demo's next line that `wanted` finds, and when it was printed; every line read
    kept in `log`."""
    while True:
        try:
            at, line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(
                f"the demo printed no {wanted.pattern!r} in time:\n" + "\n".join(log[-30:])
            ) from None
        log.append(line)
        found = wanted.search(line)
        if found:
            return found, at


def open_live_page(page, dashboard: str) -> None:
    """The Live page loaded at 1400x900, the LLM chosen in its target selector (the choice
    survives the page's own refreshes). A refresh that redraws the selector while it is
    open closes it: the choice is made again until the LLM's panel shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.set_viewport_size(FIRST_SCREEN)
    page.goto(dashboard, wait_until="domcontentloaded", timeout=120_000)
    page.get_by_text("Fleet, worst first").wait_for(timeout=120_000)
    for _ in range(SELECT_TRIES):
        try:
            page.get_by_test_id("stSelectbox").filter(has_text="matching").click(timeout=20_000)
            page.get_by_role("option", name=LLM, exact=True).click(timeout=5_000)
            page.get_by_text(f"Target {LLM}", exact=True).wait_for(timeout=20_000)
            page.evaluate("document.activeElement?.blur()")  # no focus ring in the pictures
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise TimeoutError(f"the Live page's target selector never showed {LLM}")


def read_first_screen(page, screenshot: Path) -> dict:
    """The first screen of the Live page shown, once drawn: its READ_FIRST_SCREEN numbers;
    that screen saved."""
    page.locator(CHIP).first.wait_for(timeout=120_000)
    page.locator(".st-key-live_overview .js-plotly-plot .scatterlayer .trace").first.wait_for(
        state="attached", timeout=120_000
    )
    # The fleet table's grid mounts after its heading, later on a starved machine.
    page.locator('[data-testid="stDataFrame"] .dvn-scroller').first.wait_for(timeout=120_000)
    time.sleep(2)  # plotly's drawing settles
    page.screenshot(path=str(screenshot))
    return page.evaluate(READ_FIRST_SCREEN)


def read_whole_page(page, screenshot: Path | None) -> tuple[str, dict]:
    """With every folded box open: the page's text and its READ_PAGE numbers; a
    full-page screenshot saved where asked."""
    open_folded(page)
    page.set_viewport_size(VIEWPORT)
    page.locator(".js-plotly-plot:visible").nth(3).wait_for(timeout=120_000)
    page.get_by_text("Over the last").first.wait_for(timeout=120_000)
    page.evaluate(SCROLL_TO_TOP)
    time.sleep(2)  # plotly's drawing settles
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    return page.inner_text("body"), page.evaluate(READ_PAGE)


def chip(page) -> str:
    """The state chip of the selected target, as the page shows it now."""
    badge = page.locator(CHIP)
    return badge.first.inner_text(timeout=10_000) if badge.count() else ""


def watch_phase(
    page, exporter: str, name: str, started: float, seconds: float
) -> list[tuple[float, list[str]]]:
    """From LOOK_FROM_SHARE of the phase, until it shows its name on the exporter and on
    the page or LOOK_UNTIL_SHARE of it has passed: what each look found lacking (the last
    empty: shown)."""
    shows = SHOWS[name]
    time.sleep(max(0.0, started + LOOK_FROM_SHARE * seconds - time.monotonic()))
    give_up = started + LOOK_UNTIL_SHARE * seconds
    looks = []
    while True:
        unmet = shows.check(targets(exporter))
        if not unmet:
            unmet = shows.page_unmet(chip(page), page.inner_text("body"))
        looks.append((round(time.monotonic() - started, 1), unmet))
        if not unmet or time.monotonic() >= give_up:
            return looks
        time.sleep(POLL_SECONDS)


@dataclass(frozen=True)
class Phase:
    """A phase of the demo as the walk met it: its name, its length and when it began
    (time.monotonic())."""

    name: str
    seconds: float
    started: float


def view(page, exporter: str, phase: Phase, shots: Path, full_pages: Path | None) -> PhaseView:
    """One phase watched until it shows its name (or gives up), its first screen saved
    and read, then the whole page and the exporter's signals looked over."""
    looks = watch_phase(page, exporter, phase.name, phase.started, phase.seconds)
    shot = shots / screenshot_name(phase.name)
    first = read_first_screen(page, shot)
    seen = PhaseView(phase.name, shot, shown_state=first["chip"], headline=first["headline"])
    seen.looks, seen.unmet = looks, looks[-1][1]
    if not seen.unmet:  # still shown once drawn: the picture is of the phase shown
        seen.unmet = SHOWS[phase.name].page_unmet(first["chip"], first["text"])
    full = None if full_pages is None else full_pages / screenshot_name(phase.name)
    text, read = read_whole_page(page, full)
    seen.problems = (
        first_screen_problems(first) + page_problems(text, read) + signals_problems(exporter)
    )
    return seen


def screenshot_name(phase: str) -> str:
    """A phase's screenshot file: "long answers" -> live-long-answers.png."""
    return f"live-{phase.replace(' ', '-')}.png"


def stopped_loads(log: list[str], phase_count: int) -> list[list[str]]:
    """The demo's lines saying a load generator stopped early, by phase (in order)."""
    by_phase: list[list[str]] = []
    for line in log:
        if PHASE_LINE.search(line):
            by_phase.append([])
        elif line.startswith(LOAD_STOPPED) and by_phase:
            by_phase[-1].append(line)
    return (by_phase + [[]] * phase_count)[:phase_count]


def walk(
    scale: float, screenshots: Path, phases: int = 4, full_pages: Path | None = None
) -> list[PhaseView]:
    """The first `phases` phases of `make demo` at `scale` (its four, by default), each
    phase's first screen saved to `screenshots` / `screenshot_name(phase)` once it shows
    its name, and its whole page to `full_pages` where given. Between phases the page is
    loaded afresh, its boxes folded again."""
    from playwright.sync_api import sync_playwright

    views = []
    log: list[str] = []
    with running_demo(scale) as (dashboard, exporter, lines), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium.EXECUTABLE, args=chromium.ARGS)
        page = browser.new_page(viewport=FIRST_SCREEN)
        next_line(lines, time.monotonic() + 300, log, re.compile(re.escape(READY_LINE)))
        open_live_page(page, dashboard)
        deadline = time.monotonic() + 120
        for index in range(phases):
            found, started = next_line(lines, deadline, log, PHASE_LINE)
            phase = Phase(found["name"], float(found["seconds"]), started)
            views.append(view(page, exporter, phase, screenshots, full_pages))
            if index < phases - 1:
                open_live_page(page, dashboard)
            deadline = started + phase.seconds + 120
        next_line(lines, deadline, log, PHASE_LINE)  # the last phase ran to its end
        browser.close()
    for seen, stopped in zip(views, stopped_loads(log, len(views)), strict=True):
        seen.stopped_load = stopped
    return views
