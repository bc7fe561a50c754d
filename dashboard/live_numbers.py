"""The Live page's numbers of one series, in the catalog's groups (`Signal.live`): now,
over the window, the caches. A tile's label is the signal's title and its tooltip the
frame it reads and the signal's help, so a signal added to the catalog shows here with
no change to the dashboard. A few read better against their bound ("3 / 8"); those ways
of showing are the only names this module knows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from batchscope.dashboard.formatting import (
    MISSING,
    NOT_EXPOSED,
    count,
    exposed,
    missing_reason,
    number,
    percent,
    seconds,
)
from batchscope.dashboard.headline import statistic
from batchscope.dashboard.time_frames import TimeFrames
from batchscope.exporter.core.catalog import CACHES, NOW, SERIES, WINDOW
from batchscope.exporter.core.declare import Signal

# Tiles in one row at most: a 1400 px page keeps every value whole.
TILES_A_ROW = 6


@dataclass(frozen=True, slots=True)
class Tile:
    """One number as a tile: its label, value, tooltip and, where the number needs it to
    be read right, a note shown under the value."""

    label: str
    value: str
    help: str = ""
    note: str | None = None


@dataclass(frozen=True, slots=True)
class _Shown:
    """How a signal reads on its tile: `frame` replaces its group's frame where the
    number reads another (the running batch's peak); `meaning` adds to the tooltip."""

    label: str
    value: str
    frame: str | None = None
    meaning: str = ""
    note: str | None = None


def _value(signal: Signal, value: object) -> str:
    """A value in its unit's words."""
    if value is None:
        return MISSING
    if signal.unit == "ratio":
        return percent(value)  # type: ignore[arg-type]
    if signal.unit == "per_second":
        return number(value, 2)  # type: ignore[arg-type]
    if signal.unit == "seconds":
        return seconds(value)  # type: ignore[arg-type]
    if signal.unit in ("requests", "tokens"):
        return count(value)  # type: ignore[arg-type]
    return str(value)


def gain_note(gain: float | None) -> str | None:
    """What a throughput gain below 1 means, in the words shown beside it."""
    if gain is None or gain >= 1:
        return None
    return "below 1: batching costs here"


def gain_meaning(gain: float) -> str:
    """The tooltip's sentence for a gain below 1."""
    return (
        f"Below 1: items per second at the batch sizes this batcher fired are {gain:.0%} of "
        "those at batch size 1, so each item costs more in a batch than alone. Batching is "
        "costing here, not paying: a device whose cost grows with the batch (a CPU), or a "
        "model that pads. Smaller batches serve more; a GPU pays for batching."
    )


def _running(signal: Signal, series: dict, frames: TimeFrames) -> _Shown:
    peak = series.get("running_peak", series.get("running"))
    return _Shown(
        "running / cap",
        f"{number(peak)} / {number(series.get('cap'))}",
        f"Running requests, {frames.peak()} (as the diagnosis judges it), against the cap",
    )


def _mean_batch(signal: Signal, series: dict, frames: TimeFrames) -> _Shown:
    value = f"{number(series.get('mean_batch_size'), 1)} / {number(series.get('cap'))}"
    frame = f"Over {frames.window(series)}: the mean fired batch against the max batch size"
    return _Shown("mean batch / cap", value, frame)


def _batch_tokens(signal: Signal, series: dict, frames: TimeFrames) -> _Shown:
    if series.get("token_cap") is None:
        return _Shown(signal.title, _value(signal, series.get(signal.name)))
    tokens = f"{number(series.get('batch_tokens'))} / {number(series.get('token_cap'))}"
    return _Shown("batch tokens / token cap", tokens)


def _latency(signal: Signal, series: dict, frames: TimeFrames) -> _Shown:
    return _Shown(f"{statistic(series)} latency", _value(signal, series.get(signal.name)))


def _gain(signal: Signal, series: dict, frames: TimeFrames) -> _Shown:
    gain = series.get(signal.name)
    if gain is None:
        return _Shown(signal.title, MISSING)
    meaning = gain_meaning(gain) if gain < 1 else ""
    return _Shown(signal.title, f"{gain:.1f}x", meaning=meaning, note=gain_note(gain))


# The signals that read better their own way than as their unit writes them.
SHOWN_AS: dict[str, Callable[[Signal, dict, TimeFrames], _Shown]] = {
    "running": _running,
    "mean_batch_size": _mean_batch,
    "batch_tokens": _batch_tokens,
    "latency_seconds": _latency,
    "throughput_gain": _gain,
}


# A signal that stands in for another: the batch is a batcher's mean fired batch where it
# has no running gauge, and a token cap's batch tokens where it has one. Where the other is
# shown, the one not exposed goes unsaid.
STANDS_IN_FOR = {
    "mean_batch_size": "running",
    "running": "mean_batch_size",
    "batch_tokens": "running",
}


def tile_of(signal: Signal, series: dict, frames: TimeFrames) -> Tile:
    """One signal's tile: its value, and a tooltip of the frame it reads, the signal's
    help and, for a dash, why."""
    own = SHOWN_AS.get(signal.name)
    shown = (
        own(signal, series, frames)
        if own is not None
        else _Shown(signal.title, _value(signal, series.get(signal.name)))
    )
    frame = shown.frame or (
        "At the last scrape" if signal.live == NOW else f"Over {frames.window(series)}"
    )
    why = missing_reason(series, signal.name)
    help_text = " ".join(
        part
        for part in (
            f"{frame}.",
            signal.help,
            shown.meaning,
            f"{MISSING}: {why}." if why is not None else "",
        )
        if part
    )
    return Tile(shown.label, MISSING if why else shown.value, help_text, shown.note)


def group_tiles(group: str, series: dict, frames: TimeFrames) -> tuple[list[Tile], list[str]]:
    """The tiles of one catalog group for this series, and the titles of the group's
    signals the series' engine does not expose. A signal without a `published` check
    shows only with a value: it is not a number every engine gives."""
    tiles, absent = [], []
    for signal in SERIES:
        if signal.live != group:
            continue
        if not exposed(series, signal.name):
            other = STANDS_IN_FOR.get(signal.name)
            if other is None or not exposed(series, other):
                absent.append(signal.title)
        elif signal.published is not None or series.get(signal.name) is not None:
            tiles.append(tile_of(signal, series, frames))
    return tiles, absent


def group_heading(group: str, series: dict, frames: TimeFrames) -> tuple[str, str]:
    """(heading, tooltip) of a group: which frame its numbers read."""
    if group == NOW:
        return "**Now**", f"The last scrape; running: {frames.peak()}."
    if group == CACHES:
        return f"**Caches, over {frames.window(series)}**", "What the engine's caches saved."
    return f"**Over {frames.window(series)}**", "Rates, latency and batch sizes over the window."


def tile_row(tiles: list[Tile]) -> None:
    """Tiles in rows of at most TILES_A_ROW."""
    for start in range(0, len(tiles), TILES_A_ROW):
        row = tiles[start : start + TILES_A_ROW]
        for column, tile in zip(st.columns(TILES_A_ROW), row, strict=False):
            column.metric(
                tile.label,
                tile.value,
                delta=tile.note,
                delta_color="inverse" if tile.note else "normal",
                delta_arrow="off",
                help=tile.help,
            )


def numbers_box(series: dict, frames: TimeFrames) -> None:
    """Every group of numbers of the series, folded."""
    with st.expander("The numbers: now, over the window, the caches", key="live_numbers"):
        for group in (NOW, WINDOW, CACHES):
            tiles, absent = group_tiles(group, series, frames)
            heading, why = group_heading(group, series, frames)
            st.markdown(heading, help=why)
            tile_row(tiles)
            if absent:
                engine = series.get("engine") or "unknown engine"
                st.caption(f"{NOT_EXPOSED.capitalize()} ({engine}): {', '.join(absent)}.")
