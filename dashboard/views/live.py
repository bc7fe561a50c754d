"""Live: the saturation banners, the fleet (filtered, ordered, a page at a time) and one
target's batching panel, one box a function, each saying which time frame it reads.

Whatever the fleet's size, a refresh reads each target's summary row, and the full signals
and history of the one target shown.
"""

from __future__ import annotations

import datetime
import time

import streamlit as st

from batchscope.dashboard import charts, ui
from batchscope.dashboard.episodes import saturation_episodes
from batchscope.dashboard.formatting import (
    MISSING,
    NOT_EXPOSED,
    count,
    exposed,
    number,
    percent,
    plain_markdown,
    seconds,
    tile,
)
from batchscope.dashboard.frames import (
    SORTS,
    TOTAL_CHOICE,
    FleetPage,
    batch_size_frame,
    first_matching,
    fleet_page,
    fleet_rows,
    fleet_table,
    history_frame,
    last_seconds,
    series_choices,
    series_points,
    with_row,
    with_target,
)
from batchscope.dashboard.next_steps import advice_rows, checklist, limit_bars, next_step
from batchscope.dashboard.slo_panel import slo_panel
from batchscope.dashboard.time_frames import TimeFrames, banner_text
from batchscope.exporter.alerts.specs import SLOW_SCRAPE_SECONDS
from batchscope.exporter.config.settings import DEFAULT_TIMEOUT_SECONDS
from batchscope.exporter.core.signals import SignalSettings

DEFAULTS = SignalSettings()
RANGES = {"5 min": 300, "15 min": 900, "1 h": 3600, "all kept": None}
CHECK_MARKS = {
    True: ":green[:material/check_circle:]",
    False: ":orange[:material/error:]",
    None: ":gray[:material/help:]",
}
# Saturation banners shown before the rest are counted in one line.
BANNERS_SHOWN = 3
# The fleet table's columns, left to right: the ones to act on first.
FLEET_SHOWN = (
    "target",
    "state",
    "batch",
    "waiting",
    "budget_percent",
    "kv_percent",
    "preemptions_per_second",
    "saturated_seconds",
    "reason",
)
ROW_PIXELS = 35


def fleet_table_config(frames: TimeFrames) -> dict:
    """The fleet table's columns: widths that fit a 1400 px window, and each header's
    tooltip saying what it reads and why a cell may be a dash."""
    window = frames.window()
    return {
        "target": st.column_config.TextColumn("target", width=150, pinned=True),
        "state": st.column_config.TextColumn(
            "diagnosis", width=150, help="The diagnosis of the target (its worst model's)."
        ),
        "batch": st.column_config.TextColumn(
            "running / cap",
            width=95,
            help=f"Running requests against the cap: {frames.peak()}, as the diagnosis "
            "judges it. A dash: the target is down, or the engine does not expose it.",
        ),
        "waiting": st.column_config.NumberColumn(
            "waiting", width=70, format="%d", help="Requests waiting, at the last scrape."
        ),
        "budget_percent": st.column_config.NumberColumn(
            "budget used",
            width=95,
            format="%.0f%%",
            help=f"Latency quantile over {window} / the latency budget. A dash: no request "
            "finished in the window, no budget configured, or no latency exposed.",
        ),
        "kv_percent": st.column_config.NumberColumn(
            "KV cache",
            width=75,
            format="%.0f%%",
            help="KV cache used, at the last scrape. A dash: not exposed by this engine.",
        ),
        "preemptions_per_second": st.column_config.NumberColumn(
            "preempt/s",
            width=80,
            format="%.2f",
            help=f"Preemptions per second over {window}. A dash: not exposed by this engine.",
        ),
        "saturated_seconds": st.column_config.NumberColumn(
            "at threshold",
            width=90,
            format="%.0f s",
            help=f"How long budget used has stayed at or above the threshold; saturated "
            f"{frames.saturation()}.",
        ),
        "reason": st.column_config.TextColumn("reason", width=400),
    }


def _clock(t: float | None) -> str:
    if t is None:
        return MISSING
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S UTC")


# ---------------------------------------------------------------- the fleet


def saturation_banners(doc: dict, frames: TimeFrames) -> None:
    """A banner for each of the targets longest saturated, the first BANNERS_SHOWN; the
    rest counted."""
    saturated = sorted(
        (t for t in doc.get("targets", []) if (t.get("total") or {}).get("budget_saturated")),
        key=lambda t: -(t["total"].get("budget_saturated_seconds") or 0.0),
    )
    for target in saturated[:BANNERS_SHOWN]:
        st.error(banner_text(target, frames), icon=":material/notifications_active:")
    if len(saturated) > BANNERS_SHOWN:
        st.error(
            f"**{len(saturated) - BANNERS_SHOWN} more targets have a saturated budget**: "
            'filter the fleet table by "budget saturated" to list them.',
            icon=":material/notifications_active:",
        )


def fleet_controls() -> tuple[str, str]:
    """The filter and the order of the fleet table, as the user set them."""
    text_column, sort_column = st.columns([3, 2])
    text = text_column.text_input(
        "Filter by target or diagnosis",
        key="live_filter",
        placeholder="a name, or a state such as over budget",
    )
    sort = sort_column.selectbox("Order", list(SORTS), key="live_sort")
    return text, sort


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
    st.caption(text)
    st.caption(frames.fleet())


def fleet_overview(rows: list[dict], frames: TimeFrames) -> FleetPage:
    """The fleet table of these rows, one page of the targets matching the filter in the
    chosen order; returns that view."""
    text, sort = fleet_controls()
    st.subheader("Fleet, worst first" if sort == "worst first" else f"Fleet, by {sort}")
    matching = fleet_page(fleet_table(rows, sort), text)
    view = matching.at_page(page_picker(matching.pages))
    st.dataframe(
        view.rows,
        column_config=fleet_table_config(frames),
        column_order=FLEET_SHOWN,
        hide_index=True,
        width="stretch",
        height=ROW_PIXELS * (max(len(view.rows), 1) + 1) + 3,
        placeholder=MISSING,
    )
    fleet_caption(view, sort, frames)
    return view


# ---------------------------------------------------------------- one target


def target_header(target: dict, now: float) -> None:
    name = target.get("target", "")
    st.subheader(f"Target {plain_markdown(name)}")
    t = target.get("t")
    st.caption(
        f"{plain_markdown(target.get('url') or '')}; evaluated at {_clock(t)}"
        + (f" ({max(0.0, now - t):.0f} s ago)" if t is not None else "")
        + ". Every box below reads this one evaluation."
    )
    if not target.get("up"):
        st.error(
            f"This target does not answer: {plain_markdown(target.get('error') or 'no reason')}."
            " Check the URL and port in the exporter's configuration, that the server runs, "
            "and the exporter's log. The charts show its last data."
        )
    elif (target.get("scrape_seconds") or 0.0) > SLOW_SCRAPE_SECONDS:
        st.warning(
            f"This target's /metrics is slow: the last scrape took "
            f"{seconds(target['scrape_seconds'])} (slow above {seconds(SLOW_SCRAPE_SECONDS)}). "
            "A model server's /metrics slows down when it is overloaded; a scrape slower than "
            f"the exporter's timeout ({seconds(DEFAULT_TIMEOUT_SECONDS)} by default) becomes "
            "a gap, which holds the target's states as they were until a scrape reads it again."
        )


def model_choice(target: dict) -> tuple[str, dict]:
    """The model the panel shows (by name), and its series; the total for one model."""
    choices = series_choices(target)
    choice = TOTAL_CHOICE
    if len(choices) > 2:
        choice = st.selectbox("Model", list(choices), key="live_model")
    return choice, choices.get(choice) or choices[TOTAL_CHOICE]


def diagnosis_box(series: dict, frames: TimeFrames) -> None:
    diagnosis = series.get("diagnosis") or {}
    state = diagnosis.get("state", "")
    with st.container(border=True):
        ui.state_badge(state)
        st.markdown(plain_markdown(diagnosis.get("reason") or ""))
        st.markdown(f"**Next:** {next_step(state)}")
        st.caption(frames.diagnosis(series))


def limits_box(series: dict) -> None:
    headline, bars, unjudged = limit_bars(series.get("limits") or {})
    with st.expander("What limits the batch (the batch the diagnosis judged)", expanded=True):
        st.markdown(headline)
        for bar in bars:
            st.progress(bar.fill, text=plain_markdown(bar.text))
        if unjudged:
            st.caption("Not judged here: " + "; ".join(plain_markdown(u) for u in unjudged))


def now_tiles(series: dict, frames: TimeFrames) -> list[tuple[str, str, str]]:
    """(label, value, tooltip) of the tiles read at the last scrape(s)."""
    last = "At the last scrape"
    tiles = []
    if exposed(series, "running"):
        peak = series.get("running_peak", series.get("running"))
        frame = f"Running requests, {frames.peak()} (as the diagnosis judges it), against the cap"
        value = f"{number(peak)} / {number(series.get('cap'))}"
        tiles.append(("running / cap", *tile(series, "running", value, frame)))
    tiles += [
        ("waiting", *tile(series, "waiting", count(series.get("waiting")), last)),
        (
            "KV cache",
            *tile(series, "kv_cache_usage", percent(series.get("kv_cache_usage")), last),
        ),
    ]
    if series.get("token_cap") is not None:
        tokens = f"{number(series.get('batch_tokens'))} / {number(series.get('token_cap'))}"
        tiles.append(("batch tokens / token cap", *tile(series, "batch_tokens", tokens, last)))
    return tiles


def window_tiles(series: dict, frames: TimeFrames) -> list[tuple[str, str, str]]:
    """(label, value, tooltip) of the tiles measured over the window; a batcher's mean
    fired batch (it has no running gauge) among them."""
    over = f"Over {frames.window(series)}"
    statistic = (
        "mean"
        if series.get("latency_statistic") == "mean"
        else f"p{series.get('latency_quantile', 0.99) * 100:g}"
    )
    gain = series.get("throughput_gain")
    static = series.get("static_utilization")
    tiles = []
    if not exposed(series, "running"):
        value = f"{number(series.get('mean_batch_size'), 1)} / {number(series.get('cap'))}"
        frame = f"{over}: the mean fired batch against the max batch size"
        tiles.append(("mean batch / cap", *tile(series, "mean_batch_size", value, frame)))
    return tiles + [
        (
            "preemptions/s",
            *tile(
                series,
                "preemptions_per_second",
                number(series.get("preemptions_per_second"), 2),
                over,
            ),
        ),
        (
            f"{statistic} latency",
            *tile(series, "latency_seconds", seconds(series.get("latency_seconds")), over),
        ),
        (
            "budget used",
            *tile(
                series,
                "budget_utilization",
                percent(series.get("budget_utilization")),
                f"{over}: the latency against a {seconds(series.get('budget_seconds'))} budget",
            ),
        ),
        (
            "throughput gain",
            *tile(series, "throughput_gain", MISSING if gain is None else f"{gain:.1f}x", over),
        ),
        (
            "static batching would use",
            *tile(
                series,
                "static_utilization",
                percent(static["estimate"]) if static else MISSING,
                f"{over}: the share of slot-steps a static batch at the cap would use",
            ),
        ),
    ]


def metric_tiles(series: dict, frames: TimeFrames) -> None:
    """The numbers, in two rows by time frame: now, and over the window."""
    for title, tiles in (
        (f"**Now** (the last scrape; running: {frames.peak()})", now_tiles(series, frames)),
        (f"**Over {frames.window(series)}**", window_tiles(series, frames)),
    ):
        st.markdown(title)
        for column, (label, value, why) in zip(st.columns(len(tiles)), tiles, strict=True):
            column.metric(label, value, help=why)


def checklist_box(series: dict) -> None:
    with st.expander("Seed 003's checklist, answered from these signals", expanded=True):
        for check in checklist(series):
            st.markdown(f"{CHECK_MARKS[check.ok]} **{check.question}** {check.answer}")
        static = series.get("static_utilization")
        if static:
            st.caption(
                f"Static-utilisation estimate at this cap: {percent(static['estimate'])} "
                f"(bounds {percent(static['lower'])} to {percent(static['upper'])}, from the "
                "output-length histogram's bucket edges); continuous batching gains "
                f"{static['continuous_batching_gain']:.2f}x. The calculator page gives the "
                "exact number from logged lengths."
            )


def advice_box(series: dict, frames: TimeFrames) -> None:
    advice = series.get("advice") or {}
    with st.expander(f"What to change, from {frames.window(series)}", expanded=True):
        st.markdown(f"**Advice:** {plain_markdown(advice.get('summary') or 'none yet')}")
        st.caption(
            f"The advice reads the whole window, {frames.window(series)}: what happened in "
            "it (requests that waited at the cap, say) may differ from the diagnosis, which "
            "reads the queue now."
        )
        rows = advice_rows(advice)
        if rows:
            st.dataframe(rows, hide_index=True, width="stretch", key="advice_table")
            st.caption(
                "Each number names its inputs and how far to trust it; docs/metrics.md gives "
                "the formulas. The same numbers: /api/v1/advice and batchscope_advice_value."
            )


def history_for(
    sources: ui.Sources, name: str, labels: dict | None, range_seconds: float | None, now: float
):
    """The history over the range of one series (labels) or the target total (None):
    from Prometheus when configured (totals), else the exporter; and where it came from."""
    if sources.prometheus and range_seconds is not None:
        loaded = ui.prometheus_history(sources.prometheus, name, range_seconds, now)
        origin = f"Prometheus at {sources.prometheus}"
        points = loaded.data or []
    else:
        loaded = ui.history(sources.exporter, name)
        origin = "the exporter's history"
        points = loaded.data.get("points", []) if isinstance(loaded.data, dict) else []
        picked = series_points(points, labels) if labels is not None else []
        if picked:
            return last_seconds(history_frame(picked), range_seconds, now), f"{origin}, this model"
    if loaded.error:
        st.warning(plain_markdown(loaded.error))
    return last_seconds(history_frame(points), range_seconds, now), f"{origin}, target total"


def charts_grid(frame, series: dict, name: str, now: float) -> None:
    episodes = saturation_episodes(frame, name)
    distribution = batch_size_frame(series.get("batch_size_distribution") or [])
    # (the signal a chart draws, the chart): the same panels for every engine
    figures = [
        (
            "budget_utilization",
            charts.budget_chart(frame, DEFAULTS.saturation_threshold, episodes, now),
        ),
        ("running", charts.running_chart(frame)),
        ("waiting", charts.waiting_chart(frame)),
        ("kv_cache_usage", charts.kv_chart(frame, DEFAULTS.kv_high)),
        ("preemptions_per_second", charts.preemptions_chart(frame)),
        ("", charts.batch_distribution_chart(distribution, series.get("cap"))),
        ("throughput_gain", charts.gain_chart(frame)),
        ("static_utilization", charts.static_chart(frame)),
    ]
    columns = st.columns(2)
    for i, (field, figure) in enumerate(figures):
        if exposed(series, field):
            columns[i % 2].plotly_chart(figure, width="stretch", key=f"chart_{i}")
        else:
            columns[i % 2].info(
                f"**{figure.layout.title.text}**: {NOT_EXPOSED} "
                f"({plain_markdown(series.get('engine') or '')})."
            )
    st.plotly_chart(charts.diagnosis_chart(frame), width="stretch", key="chart_diagnosis")


def history_box(
    sources: ui.Sources, name: str, labels: dict | None, series: dict, now: float
) -> None:
    """The charts of the one target shown, over the chosen range of its history."""
    range_name = (
        st.segmented_control("Time range", list(RANGES), default="15 min", key="live_range")
        or "15 min"
    )
    frame, origin = history_for(sources, name, labels, RANGES[range_name], now)
    st.caption(f"History from {origin}, {len(frame)} points, one per evaluation.")
    if frame.empty:
        st.info("No history for this target yet.")
        return
    charts_grid(frame, series, name, now)


def target_panel(sources: ui.Sources, target: dict, frames: TimeFrames, now: float) -> None:
    target_header(target, now)
    choice, series = model_choice(target)
    diagnosis_box(series, frames)
    limits_box(series)
    metric_tiles(series, frames)
    slo_panel(series, frames)
    checklist_box(series)
    advice_box(series, frames)
    labels = None if choice == TOTAL_CHOICE else series.get("labels")
    history_box(sources, target.get("target", ""), labels, series, now)


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
    st.caption(
        f"From {plain_markdown(page_sources.exporter)}; refreshes every {ui.REFRESH_SECONDS} s."
    )
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
    saturation_banners(doc, frames)
    view = fleet_overview(rows, frames)
    name = target_selector(view, chosen)
    if name != chosen:
        target = full_signals(name, now)
    if target is not None:
        target_panel(page_sources, target, frames, now)


live()
