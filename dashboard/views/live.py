"""Live: the fleet worst first, the saturation banner, and one target's batching panel."""

from __future__ import annotations

import time

import streamlit as st

from dashboard import charts, ui
from dashboard.episodes import saturation_episodes
from dashboard.formatting import (
    MISSING,
    NOT_EXPOSED,
    exposed,
    number,
    percent,
    plain_markdown,
    seconds,
    shown,
)
from dashboard.frames import (
    TOTAL_CHOICE,
    batch_size_frame,
    find_target,
    fleet_frame,
    history_frame,
    last_seconds,
    series_choices,
    series_points,
)
from dashboard.next_steps import advice_rows, checklist, limit_bars, next_step
from dashboard.slo_panel import slo_panel
from exporter.alerts.specs import SLOW_SCRAPE_SECONDS
from exporter.config.settings import DEFAULT_TIMEOUT_SECONDS
from exporter.core.signals import SignalSettings

DEFAULTS = SignalSettings()
RANGES = {"5 min": 300, "15 min": 900, "1 h": 3600, "all kept": None}
CHECK_MARKS = {
    True: ":green[:material/check_circle:]",
    False: ":orange[:material/error:]",
    None: ":gray[:material/help:]",
}

FLEET_TABLE_CONFIG = {
    "target": st.column_config.TextColumn("target"),
    "up": st.column_config.CheckboxColumn("up"),
    "state": st.column_config.TextColumn("diagnosis"),
    "running": st.column_config.NumberColumn("running", format="%.0f"),
    "cap": st.column_config.NumberColumn("cap", format="%.0f"),
    "running_vs_cap": st.column_config.ProgressColumn(
        "running / cap", format="percent", min_value=0.0, max_value=1.0
    ),
    "waiting": st.column_config.NumberColumn("waiting", format="%.0f"),
    "preemptions_per_second": st.column_config.NumberColumn("preemptions/s", format="%.2f"),
    "kv_cache_usage": st.column_config.ProgressColumn(
        "KV cache", format="percent", min_value=0.0, max_value=1.0
    ),
    "budget_utilization": st.column_config.NumberColumn("budget used", format="percent"),
    "saturated_seconds": st.column_config.NumberColumn("at threshold (s)", format="%.0f"),
    "reason": st.column_config.TextColumn("reason", width="large"),
}


def saturation_banners(doc: dict) -> None:
    """Seed 001's banner for every target whose budget stays saturated."""
    for target in doc.get("targets", []):
        total = target.get("total") or {}
        if not total.get("budget_saturated"):
            continue
        if not target.get("up") or target.get("error"):
            # The last scrape read nothing: the episode is held, not measured now.
            level = (
                "the last scrape could not read the target; nothing read since has "
                "ended the episode"
            )
        else:
            level = (
                f"latency has stayed at {percent(total.get('budget_utilization'))} of the budget"
            )
        st.error(
            f"**Budget saturated: {plain_markdown(target.get('target', ''))}**. Saturated for "
            f"{seconds(total.get('budget_saturated_seconds'))} ({level}): the budget is too "
            "tight for this traffic, or the server needs more capacity.",
            icon=":material/notifications_active:",
        )


def fleet_overview(doc: dict) -> None:
    st.subheader("Fleet, worst first")
    st.dataframe(
        fleet_frame(doc), column_config=FLEET_TABLE_CONFIG, hide_index=True, width="stretch"
    )
    st.caption("The Alerts page charts every target's budget utilisation over time.")


def batch_cell(series: dict) -> tuple[str, str]:
    """The running batch against its cap, or the mean fired batch where an engine fires
    batches (no running gauge), or NOT_EXPOSED."""
    cap = number(series.get("cap"))
    if exposed(series, "running"):
        return "running / cap", f"{number(series.get('running'))} / {cap}"
    if exposed(series, "mean_batch_size"):
        return "mean batch / cap", f"{number(series.get('mean_batch_size'), 1)} / {cap}"
    return "running / cap", NOT_EXPOSED


def metrics_row(series: dict) -> None:
    static = series.get("static_utilization")
    statistic = (
        "mean"
        if series.get("latency_statistic") == "mean"
        else (f"p{series.get('latency_quantile', 0.99) * 100:g}")
    )
    gain = series.get("throughput_gain")
    cells = [
        batch_cell(series),
        ("waiting", shown(series, "waiting", number(series.get("waiting")))),
        (
            "preemptions/s",
            shown(
                series, "preemptions_per_second", number(series.get("preemptions_per_second"), 2)
            ),
        ),
        ("KV cache", shown(series, "kv_cache_usage", percent(series.get("kv_cache_usage")))),
        (
            f"{statistic} latency",
            shown(series, "latency_seconds", seconds(series.get("latency_seconds"))),
        ),
        (
            "budget used",
            shown(series, "budget_utilization", percent(series.get("budget_utilization"))),
        ),
        (
            "throughput gain",
            shown(series, "throughput_gain", MISSING if gain is None else f"{gain:.1f}x"),
        ),
        (
            "static batching would use",
            shown(series, "static_utilization", percent(static["estimate"]) if static else MISSING),
        ),
    ]
    if series.get("token_cap") is not None:
        cells.insert(
            1,
            (
                "batch tokens / token cap",
                shown(
                    series,
                    "batch_tokens",
                    f"{number(series.get('batch_tokens'))} / {number(series.get('token_cap'))}",
                ),
            ),
        )
    for row in (cells[:-4], cells[-4:]):
        for column, (label, value) in zip(st.columns(len(row)), row, strict=True):
            column.metric(label, value)


def diagnosis_box(series: dict) -> None:
    diagnosis = series.get("diagnosis") or {}
    state = diagnosis.get("state", "")
    with st.container(border=True):
        ui.state_badge(state)
        st.markdown(plain_markdown(diagnosis.get("reason") or ""))
        st.markdown(f"**Next:** {next_step(state)}")


def limits_box(series: dict) -> None:
    headline, bars, unjudged = limit_bars(series.get("limits") or {})
    with st.expander("What limits the batch", expanded=True):
        st.markdown(headline)
        for bar in bars:
            st.progress(bar.fill, text=plain_markdown(bar.text))
        if unjudged:
            st.caption("Not judged here: " + "; ".join(plain_markdown(u) for u in unjudged))


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


def advice_box(series: dict) -> None:
    advice = series.get("advice") or {}
    with st.expander("What to change, with the numbers", expanded=True):
        st.markdown(f"**Advice:** {plain_markdown(advice.get('summary') or 'none yet')}")
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


def target_panel(sources: ui.Sources, target: dict, now: float) -> None:
    name = target.get("target", "")
    st.subheader(f"Target {plain_markdown(name)}")
    st.caption(plain_markdown(target.get("url") or ""))
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
    choices = series_choices(target)
    choice = TOTAL_CHOICE
    if len(choices) > 2:
        choice = st.selectbox("Model", list(choices), key="live_model")
    series = choices.get(choice) or choices[TOTAL_CHOICE]
    diagnosis_box(series)
    limits_box(series)
    metrics_row(series)
    slo_panel(series)
    checklist_box(series)
    advice_box(series)
    range_name = (
        st.segmented_control("Time range", list(RANGES), default="15 min", key="live_range")
        or "15 min"
    )
    labels = None if choice == TOTAL_CHOICE else series.get("labels")
    frame, origin = history_for(sources, name, labels, RANGES[range_name], now)
    st.caption(f"History from {origin}, {len(frame)} points.")
    if frame.empty:
        st.info("No history for this target yet.")
        return
    charts_grid(frame, series, name, now)


st.title("Is batching doing its job?")
page_sources = ui.sources()


@st.fragment(run_every=ui.REFRESH_SECONDS)
def live() -> None:
    now = time.time()
    loaded = ui.signals(page_sources.exporter)
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
    saturation_banners(doc)
    fleet_overview(doc)
    names = fleet_frame(doc)["target"].tolist()
    name = st.selectbox("Target", names, key="live_target")
    target = find_target(doc, name) if name else None
    if target is not None:
        target_panel(page_sources, target, now)


live()
