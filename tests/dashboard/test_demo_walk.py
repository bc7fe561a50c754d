"""`make demo`'s four phases walked in Chromium at 1400 px: two thirds into
each phase the Live page shows no "None", no cut-off tile, no "nothing to fix" beside a
budget used above 100% (nor does any target's diagnosis the exporter gives), and a fleet
table that fits the page.

The demo runs at half length (`--phase-scale 0.5`, its documented setting: the exporter's
interval, window and hold shrink with the phases), so the walk takes under two minutes;
`scripts/demo_walk.py` walks it at full length for the README's screenshots.
"""

from __future__ import annotations

import struct

import pytest

from tests.support.demo_walk import VIEWPORT, walk

pytestmark = pytest.mark.slow

PHASE_SCALE = 0.5


def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_the_live_page_tells_one_story_through_the_demos_four_phases(tmp_path) -> None:
    views = walk(PHASE_SCALE, tmp_path)
    assert [v.phase for v in views] == ["light", "heavy", "long answers", "overload"]
    for view in views:
        assert view.problems == [], (view.phase, view.shown_state, view.problems)
        assert view.shown_state, view.phase  # a diagnosis was on the page
        width, height = png_size(view.screenshot)
        assert width == VIEWPORT["width"] and height >= VIEWPORT["height"], view.phase
