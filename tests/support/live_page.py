"""The Live page in Chromium as a user reads it: its first screen at 1400x900 with no
scrolling, and its whole page with the folded boxes open; what a reader must never see on
either (`first_screen_problems`, `page_problems`), and the same judged from the
exporter's signals (`signals_problems`).

`WholePageReader` keeps the whole page open in a browser of its own, on its own thread,
so that a walk's first screen stays as a user first sees it (folded) while the whole
page is read beside it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchscope.dashboard.client import get_json
from batchscope.dashboard.next_steps import next_step
from tests.support import chromium

VIEWPORT = {"width": 1400, "height": 2400}
FIRST_SCREEN = {"width": 1400, "height": 900}
HEADLINE_WORDS = 12
SCROLL_TO_TOP = """() => document.querySelectorAll('*').forEach(e => {
  if (e.scrollTop) e.scrollTop = 0;
})"""
# The Live page's last folded box: drawn, the boxes above it are too.
LAST_FOLDED = "All charts over the range"
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


def open_live_page(page, dashboard: str, target: str) -> None:
    """The Live page loaded at 1400x900, `target` chosen in its target selector (the
    choice survives the page's own refreshes). A refresh that redraws the selector while
    it is open closes it: the choice is made again until the target's panel shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.set_viewport_size(FIRST_SCREEN)
    page.goto(dashboard, wait_until="domcontentloaded", timeout=120_000)
    page.get_by_text("Fleet, worst first").wait_for(timeout=120_000)
    for _ in range(SELECT_TRIES):
        try:
            page.get_by_test_id("stSelectbox").filter(has_text="matching").click(timeout=20_000)
            page.get_by_role("option", name=target, exact=True).click(timeout=5_000)
            page.get_by_text(f"Target {target}", exact=True).wait_for(timeout=20_000)
            page.evaluate("document.activeElement?.blur()")  # no focus ring in the pictures
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise TimeoutError(f"the Live page's target selector never showed {target}")


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
    """The whole page as drawn now (its folded boxes opened already): its text and its
    READ_PAGE numbers; a full-page screenshot saved where asked."""
    page.locator(".js-plotly-plot:visible").nth(3).wait_for(timeout=120_000)
    page.get_by_text("Over the last").first.wait_for(timeout=120_000)
    page.evaluate(SCROLL_TO_TOP)
    time.sleep(2)  # plotly's drawing settles
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    # The fleet table's grid remounts as the page reruns, later on a starved machine.
    page.locator('[data-testid="stDataFrame"] .dvn-scroller').first.wait_for(timeout=120_000)
    return page.inner_text("body"), page.evaluate(READ_PAGE)


def chip(page) -> str:
    """The state chip of the selected target, as the page shows it now."""
    badge = page.locator(CHIP)
    return badge.first.inner_text(timeout=10_000) if badge.count() else ""


@dataclass
class _Span:
    """A phase as the reader knows it: when it runs, where its whole page is saved, and
    what the reads made within it found."""

    began: float
    ends: float
    screenshot: Path | None
    reads: int = 0
    problems: list[str] = field(default_factory=list)


class WholePageReader:
    """The Live page at 1400x2400 in a browser of its own, on a thread of its own,
    `target` chosen and every folded box opened once (they stay open), read over and
    over. `begin` names the phase from then on; `finish` returns, for each phase, what
    the reads made within it found (`page_problems`), or that none was."""

    def __init__(self, dashboard: str, target: str) -> None:
        self._spans: dict[str, _Span] = {}
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(dashboard, target), daemon=True)
        self._thread.start()

    def begin(self, phase: str, began: float, seconds: float, screenshot: Path | None) -> None:
        """Phase `phase` runs from time.monotonic() `began` for `seconds`; its first whole
        page read is saved to `screenshot` where given."""
        self._spans[phase] = _Span(began, began + seconds, screenshot)

    def finish(self, timeout: float = 120) -> dict[str, list[str]]:
        self._stop.set()
        self._thread.join(timeout)
        if self._failed is not None:
            raise self._failed
        if self._thread.is_alive():
            raise TimeoutError(f"the whole-page reader did not stop within {timeout:g} s")
        return {
            phase: span.problems if span.reads else ["the whole page was not read in the phase"]
            for phase, span in self._spans.items()
        }

    def _run(self, dashboard: str, target: str) -> None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium.EXECUTABLE, args=chromium.ARGS)
                page = browser.new_page(viewport=FIRST_SCREEN)
                open_live_page(page, dashboard, target)
                open_folded(page)
                page.set_viewport_size(VIEWPORT)
                while not self._stop.is_set():
                    self._read(page)
                browser.close()
        except BaseException as failed:  # handed to the walk's thread by finish()
            self._failed = failed

    def _span_at(self, t: float) -> _Span | None:
        return next((s for s in list(self._spans.values()) if s.began <= t < s.ends), None)

    def _read(self, page) -> None:
        """One read of the whole page, kept with the phase it began and ended in."""
        span = self._span_at(time.monotonic())
        shot = span.screenshot if span is not None and not span.reads else None
        found = page_problems(*read_whole_page(page, shot))
        if span is None or self._span_at(time.monotonic()) is not span:
            time.sleep(1)
            return
        span.reads += 1
        span.problems += [problem for problem in found if problem not in span.problems]
