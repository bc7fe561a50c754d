"""Live: is batching doing its job? At 1400x900 one screen answers it: a line for each
saturated target, the fleet table (each row with its budget used's trend) and beside it
the selected target's state, headline, binding limit and one chart. Everything else is
folded below it, one click away.

Whatever the fleet's size, a refresh reads each target's summary row, and the full signals
and history of the one target shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batchscope.dashboard import ui
from batchscope.dashboard.formatting import MISSING, plain_markdown
from batchscope.dashboard.frames import (
    SORTS,
    TOTAL_CHOICE,
    FleetPage,
    first_matching,
    fleet_page,
    fleet_rows,
    fleet_table,
    with_row,
    with_target,
)
from batchscope.dashboard.headline import banner_title, model_of
from batchscope.dashboard.live_target import (
    first_screen,
    folded_details,
    history_for,
    target_header,
)
from batchscope.dashboard.time_frames import TimeFrames, banner_reason
from batchscope.dashboard.trends import BudgetTrends

RANGES = {"5 min": 300, "15 min": 900, "1 h": 3600, "all kept": None}
# Saturation banners shown before the rest are counted in one line.
BANNERS_SHOWN = 2
# The fleet table's columns, left to right: the ones to act on first.
FLEET_SHOWN = (
    "target",
    "state",
    "budget_percent",
    "budget_trend",
    "batch",
    "waiting",
    "kv_percent",
)
ROW_PIXELS = 35
# Rows the fleet table shows without scrolling inside it: the first screen's height.
ROWS_SHOWN = 10
# The trend column's scale: budget used from 0 to twice the budget (higher: at the top).
TREND_MAX_PERCENT = 200


def fleet_table_config(frames: TimeFrames) -> dict:
    """The fleet table's columns: widths that fit beside the target's panel, and each
    header's tooltip saying what it reads and why a cell may be a dash."""
    window = frames.window()
    return {
        "target": st.column_config.TextColumn("target", width=150, pinned=True),
        "state": st.column_config.TextColumn(
            "diagnosis",
            width=165,
            help="The diagnosis of the target (its worst model's); its reason is in the "
            "target's panel.",
        ),
        "budget_percent": st.column_config.NumberColumn(
            "budget used",
            width=85,
            format="%.0f%%",
            help=f"Latency quantile over {window} / the latency budget. A dash: no request "
            "finished in the window, no budget configured, or no latency exposed.",
        ),
        "budget_trend": st.column_config.LineChartColumn(
            "trend",
            width=95,
            y_min=0,
            y_max=TREND_MAX_PERCENT,
            help="Budget used at each refresh of this page over the time range (0 to "
            f"{TREND_MAX_PERCENT}%), since the page opened. Saturated: "
            f"{frames.saturation()}.",
        ),
        "batch": st.column_config.TextColumn(
            "running / cap",
            width=85,
            help=f"Running requests against the cap: {frames.peak()}, as the diagnosis "
            "judges it. A dash: the target is down, or the engine does not expose it.",
        ),
        "waiting": st.column_config.NumberColumn(
            "waiting", width=65, format="%d", help="Requests waiting, at the last scrape."
        ),
        "kv_percent": st.column_config.NumberColumn(
            "KV cache",
            width=70,
            format="%.0f%%",
            help="KV cache used, at the last scrape. A dash: not exposed by this engine.",
        ),
    }


# ---------------------------------------------------------------- the fleet


def saturation_banners(doc: dict, frames: TimeFrames) -> None:
    """A line for each of the targets longest saturated, the first BANNERS_SHOWN, the
    full reason folded in it; the rest counted."""
    saturated = sorted(
        (t for t in doc.get("targets", []) if (t.get("total") or {}).get("budget_saturated")),
        key=lambda t: -(t["total"].get("budget_saturated_seconds") or 0.0),
    )
    for target in saturated[:BANNERS_SHOWN]:
        with st.expander(f":red[{banner_title(target)}]", icon=":material/notifications_active:"):
            st.markdown(banner_reason(target, frames))
    if len(saturated) > BANNERS_SHOWN:
        st.error(
            f"**{len(saturated) - BANNERS_SHOWN} more targets have a saturated budget**: "
            'filter the fleet by "budget saturated" to list them.',
            icon=":material/notifications_active:",
        )


def fleet_controls() -> tuple[str, str, str, DeltaGenerator]:
    """The filter, the order and the time range, as the user set them, and the place
    for the target selector beside them."""
    text_column, sort_column, range_column, target_column = st.columns([3, 2, 3, 3])
    text = text_column.text_input(
        "Filter by target or diagnosis",
        key="live_filter",
        placeholder="a name, or a state such as over budget",
    )
    sort = sort_column.selectbox("Order", list(SORTS), key="live_sort")
    with range_column:
        range_name = (
            st.segmented_control("Time range", list(RANGES), default="15 min", key="live_range")
            or "15 min"
        )
    return text, sort, range_name, target_column


def chosen_target(rows: list[dict]) -> str | None:
    """The target the panel shows this run, before the widgets are drawn: the selector's
    choice while it matches the filter, else the first target in the table's order (the
    selector's default)."""
    return first_matching(
        rows,
        st.session_state.get("live_filter", ""),
        st.session_state.get("live_sort", next(iter(SORTS))),
        st.session_state.get("live_target"),
    )


def page_picker(pages: int) -> int:
    """The page of the fleet table to show (0-based); none to pick on a one-page fleet."""
    if pages <= 1:
        return 0
    if st.session_state.get("live_page", 1) > pages:
        st.session_state["live_page"] = pages
    return int(st.number_input(f"Page (of {pages})", 1, pages, key="live_page")) - 1


def fleet_caption(view: FleetPage, sort: str, frames: TimeFrames) -> None:
    shown = len(view.rows)
    matched = len(view.matching)
    of = (
        f"{matched:,} matching the filter, of {view.total:,}"
        if matched < view.total
        else f"{matched:,}"
    )
    text = (
        f"Targets {view.first:,}–{view.first + shown - 1:,} of {of}, {sort}."
        if shown
        else "No target matches the filter."
    )
    rest = view.rest_by_state()
    if rest:
        text += (
            " Not on this page: " + ", ".join(f"{n:,} {state}" for state, n in rest.items()) + "."
        )
    st.caption(text, help=frames.fleet())


def trends_of(doc: dict, rows: list[dict]) -> BudgetTrends:
    """The session's budget-used trends, this refresh's summary rows added."""
    trends = st.session_state.setdefault("live_trends", BudgetTrends())
    generated = doc.get("generated_at")
    if generated is not None:
        trends.add(generated, {row["target"]: row["budget_percent"] for row in rows})
    return trends


def fleet_overview(
    matching: FleetPage,
    sort: str,
    frames: TimeFrames,
    trend_of: Callable[[str], list[float]],
) -> FleetPage:
    """One page of the fleet table's matching targets in the chosen order, each with its
    trend; returns that view."""
    st.subheader("Fleet, worst first" if sort == "worst first" else f"Fleet, by {sort}")
    view = matching.at_page(page_picker(matching.pages))
    shown = view.rows.assign(budget_trend=[trend_of(name) for name in view.rows["target"]])
    st.dataframe(
        shown,
        column_config=fleet_table_config(frames),
        column_order=FLEET_SHOWN,
        hide_index=True,
        width="stretch",
        height=ROW_PIXELS * (min(max(len(view.rows), 1), ROWS_SHOWN) + 1) + 3,
        placeholder=MISSING,
    )
    fleet_caption(view, sort, frames)
    return view


# ---------------------------------------------------------------- the page


def target_selector(view: FleetPage, default: str | None) -> str | None:
    names = view.matching["target"].tolist()
    if not names:
        return None
    index = names.index(default) if default in names else 0
    return st.selectbox(f"Target ({len(names):,} matching)", names, index=index, key="live_target")


def full_signals(name: str | None, now: float) -> dict | None:
    """The named target's full signals (the last received, with why, when a fetch fails)."""
    if name is None:
        return None
    loaded = ui.target_signals(page_sources.exporter, name)
    ui.show_problem(loaded, now)
    return loaded.data if isinstance(loaded.data, dict) else None


def target_panel(
    target: dict, frames: TimeFrames, range_name: str, now: float
) -> tuple[dict, pd.DataFrame, str]:
    """The selected target's first screen; returns what its folded details read: the
    series shown, its history over the range and where that came from."""
    choice, series = target_header(target, now)
    labels = None if choice == TOTAL_CHOICE else series.get("labels")
    name = target.get("target", "")
    frame, origin = history_for(page_sources, name, labels, RANGES[range_name], now)
    # An exporter without the replica count (or a failed fetch) shows no replica line.
    replicas = ui.replicas(page_sources.exporter).data
    model = model_of(name, replicas if isinstance(replicas, dict) else None)
    first_screen(target, series, model, frame, frames, now)
    return series, frame, origin


st.title("Is batching doing its job?")
page_sources = ui.sources()


@st.fragment(run_every=ui.REFRESH_SECONDS)
def live() -> None:
    now = time.time()
    loaded = ui.fleet_summary(page_sources.exporter)
    ui.show_problem(loaded, now)
    doc = loaded.data
    if not isinstance(doc, dict):
        return
    if not doc.get("targets"):
        st.info("The exporter has no target with signals yet: it needs a scrape or two.")
        return
    frames = TimeFrames.of(doc)
    # The shown target's full signals first: its row then reads the panel's evaluation.
    rows = fleet_rows(doc)
    chosen = chosen_target(rows)
    target = full_signals(chosen, now)
    if target is not None:
        doc = with_target(doc, target)
        rows = with_row(rows, target)
    trends = trends_of(doc, rows)
    saturation_banners(doc, frames)
    text, sort, range_name, picker = fleet_controls()
    matching = fleet_page(fleet_table(rows, sort), text)
    with picker:
        name = target_selector(matching, chosen)
    if name != chosen:
        target = full_signals(name, now)
    since = None if RANGES[range_name] is None else now - RANGES[range_name]
    left, right = st.columns([3, 2], gap="medium")
    with left:
        fleet_overview(matching, sort, frames, lambda n: trends.trend(n, since))
        st.caption(
            f"From {plain_markdown(page_sources.exporter)}; refreshes every {ui.REFRESH_SECONDS} s."
        )
    if target is None:
        return
    with right:
        series, frame, origin = target_panel(target, frames, range_name, now)
    folded_details(series, frames, frame, target.get("target", ""), now, origin)


live()
