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
from tests.support import chromium
from tests.support.demo_phases import LLM, LOAD_STOPPED, SHOWS, Targets
from tests.support.live_page import (
    FIRST_SCREEN,
    WholePageReader,
    chip,
    first_screen_problems,
    open_live_page,
    read_first_screen,
    signals_problems,
)
from tests.support.network import free_port
from tests.support.paths import REPO

PHASE_LINE = re.compile(r"demo: phase (?P<name>[a-z ]+): .*, (?P<seconds>[0-9.]+) s$")
READY_LINE = "demo: dashboard ready"
# A phase is looked at from this share of its length (its load has started, the exporter
# has scraped it a few times) until this one; then it is saved as it is.
LOOK_FROM_SHARE = 1 / 3
LOOK_UNTIL_SHARE = 0.9
POLL_SECONDS = 1.0


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
        if time.monotonic() > started + seconds:
            late = time.monotonic() - started - seconds
            return [*looks, (round(late + seconds, 1), [f"looked at {late:.0f} s after it ended"])]
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


def view(page, exporter: str, phase: Phase, shot: Path) -> PhaseView:
    """One phase watched until it shows its name (or gives up), its first screen saved to
    `shot` and read, and the exporter's signals looked over."""
    looks = watch_phase(page, exporter, phase.name, phase.started, phase.seconds)
    first = read_first_screen(page, shot)
    seen = PhaseView(phase.name, shot, shown_state=first["chip"], headline=first["headline"])
    seen.looks, seen.unmet = looks, looks[-1][1]
    if not seen.unmet:  # still shown once drawn: the picture is of the phase shown
        seen.unmet = SHOWS[phase.name].page_unmet(first["chip"], first["text"])
    seen.problems = first_screen_problems(first) + signals_problems(exporter)
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
    its name; its whole page read over and over beside it (`WholePageReader`), the first
    read of each phase saved to `full_pages` where given."""
    from playwright.sync_api import sync_playwright

    views = []
    log: list[str] = []
    with running_demo(scale) as (dashboard, exporter, lines), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium.EXECUTABLE, args=chromium.ARGS)
        page = browser.new_page(viewport=FIRST_SCREEN)
        next_line(lines, time.monotonic() + 300, log, re.compile(re.escape(READY_LINE)))
        whole_pages = WholePageReader(dashboard, LLM)
        open_live_page(page, dashboard, LLM)
        deadline = time.monotonic() + 120
        for _ in range(phases):
            found, started = next_line(lines, deadline, log, PHASE_LINE)
            phase = Phase(found["name"], float(found["seconds"]), started)
            full = None if full_pages is None else full_pages / screenshot_name(phase.name)
            whole_pages.begin(phase.name, started, phase.seconds, full)
            views.append(view(page, exporter, phase, screenshots / screenshot_name(phase.name)))
            deadline = started + phase.seconds + 120
        next_line(lines, deadline, log, PHASE_LINE)  # the last phase ran to its end
        read = whole_pages.finish()
        browser.close()
    for seen, stopped in zip(views, stopped_loads(log, len(views)), strict=True):
        seen.stopped_load = stopped
        seen.problems += read[seen.phase]
    return views
