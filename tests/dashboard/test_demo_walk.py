"""`make demo`'s four phases walked in Chromium at 1400x900, each showing its name: light
underloaded, heavy the LLM at its cap with a queue (and the embeddings in large batches
within their budget), long answers the KV cache binding, overload the budget saturated
with its banner (`tests.support.demo_phases` holds each check), on the exporter's
signals and on the page's state chip. Each phase's load runs to its end: a load generator
that stops early fails the test. Once shown, each phase's first screen (1400x900, no
scroll) has its state chip, a headline of at most 12 words, the chart drawn, banners of
one line and no "seed" or "None"; and, its folded boxes opened, the page has no "None", no
cut-off tile, no "nothing to fix" beside a budget used above 100% (nor does any target's
diagnosis the exporter gives), and a fleet table that fits the page.

The demo runs at half length (`--phase-scale 0.5`: the exporter's interval, window and
hold shrink with the phases; the loads do not), so the walk takes about three minutes;
`scripts/demo_walk.py` walks it at full length for the README's screenshots.
"""

from __future__ import annotations

import struct

import pytest

from tests.support.demo_phases import PHASE_NAMES
from tests.support.demo_walk import screenshot_name, walk
from tests.support.live_page import FIRST_SCREEN, VIEWPORT

pytestmark = pytest.mark.slow

PHASE_SCALE = 0.5


def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_each_phase_of_the_demo_shows_its_name_on_the_live_page(tmp_path) -> None:
    full_pages = tmp_path / "full"
    full_pages.mkdir()
    views = walk(PHASE_SCALE, tmp_path, full_pages=full_pages)
    assert [v.phase for v in views] == list(PHASE_NAMES)
    for view in views:
        assert view.stopped_load == [], (view.phase, view.stopped_load)
        assert view.unmet == [], (view.phase, view.shown_state, view.looks)
        assert view.problems == [], (view.phase, view.shown_state, view.problems)
        first = (FIRST_SCREEN["width"], FIRST_SCREEN["height"])
        assert png_size(view.screenshot) == first, view.phase
        width, height = png_size(full_pages / screenshot_name(view.phase))
        assert width == VIEWPORT["width"] and height >= VIEWPORT["height"], view.phase
