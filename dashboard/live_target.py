"""The Live page's panel of one target: its first screen (the state as a coloured chip
with a headline of at most 12 words, the binding limit against its bound, one chart of
the batch, the queue and budget used) and, folded below it, everything else: the full
reason, the limits, the numbers, the promise, the checklist, the advice, the charts.
"""

from __future__ import annotations

import datetime

import pandas as pd
import streamlit as st

from batchscope.dashboard import charts, ui
from batchscope.dashboard.episodes import saturation_episodes
from batchscope.dashboard.formatting import (
    MISSING,
    NOT_EXPOSED,
    exposed,
    percent,
    plain_markdown,
    seconds,
)
from batchscope.dashboard.frames import (
    TOTAL_CHOICE,
    batch_size_frame,
    history_frame,
    last_seconds,
    series_choices,
    series_points,
)
from batchscope.dashboard.headline import headline, replicas_line
from batchscope.dashboard.live_numbers import numbers_box
from batchscope.dashboard.next_steps import (
    advice_rows,
    checklist,
    device_time_note,
    limit_bars,
    next_step,
)
from batchscope.dashboard.slo_panel import slo_panel
from batchscope.dashboard.states import look
from batchscope.dashboard.time_frames import TimeFrames
from batchscope.exporter.alerts.specs import SLOW_SCRAPE_SECONDS
from batchscope.exporter.config.settings import DEFAULT_TIMEOUT_SECONDS
from batchscope.exporter.core.signals import SignalSettings

DEFAULTS = SignalSettings()
CHECK_MARKS = {
    True: ":green[:material/check_circle:]",
    False: ":orange[:material/error:]",
    None: ":gray[:material/help:]",
}
CHECKLIST_TITLE = "Is continuous batching doing its job?"
CHECKLIST_SOURCE = (
    'The checklist of "Continuous Batching: Why Your GPU Waits for the Slowest Request" '
    "(DEV Community), answered from this target's signals."
)


def _clock(t: float | None) -> str:
    if t is None:
        return MISSING
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S UTC")


def target_header(target: dict, now: float) -> tuple[str, dict]:
    """The target's name (its tooltip: where it is read from and when) and, for a target
    of several models, the model to show; why the target is not read, if so. Returns the
    model's name and its series (the total for one model)."""
    name = target.get("target", "")
    t = target.get("t")
    read = f"{target.get('url') or ''}; evaluated at {_clock(t)}" + (
        f" ({max(0.0, now - t):.0f} s ago)" if t is not None else ""
    )
    if len(series_choices(target)) > 2:
        title, models = st.columns([3, 2], vertical_alignment="bottom")
    else:  # one model: nothing to choose, the name takes the whole width
        title = models = st.container()
    title.subheader(f"Target {plain_markdown(name)}", help=plain_markdown(read), anchor=False)
    with models:
        choice, series = model_choice(target)
    if not target.get("up"):
        st.error(
            f"This target does not answer: {plain_markdown(target.get('error') or 'no reason')}."
            " Check the URL and port in the exporter's configuration, that the server runs, "
            "and the exporter's log. The charts show its last data."
        )
    elif (target.get("scrape_seconds") or 0.0) > SLOW_SCRAPE_SECONDS:
        st.warning(
            f"This target's /metrics is slow: the last scrape took "
            f"{seconds(target['scrape_seconds'])} (slow above "
            f"{seconds(SLOW_SCRAPE_SECONDS)}). A model server's /metrics slows down when "
            "it is overloaded; a scrape slower than the exporter's timeout "
            f"({seconds(DEFAULT_TIMEOUT_SECONDS)} by default) becomes a gap, which holds "
            "the target's states as they were until a scrape reads it again."
        )
    return choice, series


def model_choice(target: dict) -> tuple[str, dict]:
    """The model the panel shows (by name), and its series; the total for one model."""
    choices = series_choices(target)
    choice = TOTAL_CHOICE
    if len(choices) > 2:
        choice = st.selectbox("Model", list(choices), key="live_model")
    return choice, choices.get(choice) or choices[TOTAL_CHOICE]


# ---------------------------------------------------------------- the first screen


def state_line(series: dict, model: dict | None, frames: TimeFrames) -> None:
    """The state as a coloured chip (its tooltip: what the diagnosis read) and the
    headline; the replica count of the target's `model` under it where there is one."""
    state = (series.get("diagnosis") or {}).get("state", "")
    with st.container(horizontal=True, vertical_alignment="center", gap="small", key="live_state"):
        shown = look(state)
        st.badge(shown.words, color=shown.badge, help=frames.diagnosis(series))  # type: ignore[arg-type]
        st.markdown(f"**{plain_markdown(headline(series))}**", width="content")
    replicas = replicas_line(model)
    if replicas is not None:
        st.caption(plain_markdown(replicas))


def binding_bar(series: dict) -> None:
    """The limit that binds, filled to its reading against its bound."""
    headline_text, bars, unjudged = limit_bars(series.get("limits") or {})
    binding = next((bar for bar in bars if bar.binding), None)
    if binding is None:
        st.markdown(headline_text)
        return
    st.progress(binding.fill, text=plain_markdown(binding.short))


def overview(frame: pd.DataFrame, series: dict, name: str, now: float) -> None:
    """The one chart of the first screen, over the chosen range."""
    if frame.empty:
        st.info("No history for this target yet.")
        return
    figure = charts.overview_chart(
        frame,
        DEFAULTS.saturation_threshold,
        saturation_episodes(frame, name),
        now,
        budget=exposed(series, "budget_utilization"),
    )
    with st.container(key="live_overview"):
        # No zoom toolbar over the title: the folded charts below have it.
        st.plotly_chart(
            figure, width="stretch", key="chart_overview", config={"displayModeBar": False}
        )


def first_screen(
    target: dict,
    series: dict,
    model: dict | None,
    frame: pd.DataFrame,
    frames: TimeFrames,
    now: float,
) -> None:
    """What answers the question for this target, at a glance; `model`: the replica
    count of the model it serves (/api/v1/replicas), None where there is none."""
    state_line(series, model, frames)
    binding_bar(series)
    overview(frame, series, target.get("target", ""), now)


# ---------------------------------------------------------------- folded below


def reason_box(series: dict) -> None:
    diagnosis = series.get("diagnosis") or {}
    with st.expander("Why, and what to do next", key="live_reason"):
        st.markdown(plain_markdown(diagnosis.get("reason") or ""))
        st.markdown(f"**Next:** {next_step(diagnosis.get('state', ''))}")


def limits_box(series: dict) -> None:
    headline_text, bars, unjudged = limit_bars(series.get("limits") or {})
    not_judged = (
        "Not judged here: " + "; ".join(plain_markdown(u) for u in unjudged) if unjudged else None
    )
    with st.expander("What limits the batch, every limit against its bound", key="live_limits"):
        st.markdown(headline_text, help=not_judged)
        for bar in bars:
            st.progress(bar.fill, text=plain_markdown(bar.text))


def checklist_box(series: dict) -> None:
    with st.expander(CHECKLIST_TITLE, key="live_checklist"):
        st.caption(CHECKLIST_SOURCE)
        static = series.get("static_utilization")
        for check in checklist(series):
            detail = None
            if static and check.question.startswith("What would static batching waste"):
                detail = (
                    f"Bounds from the output-length histogram's bucket edges "
                    f"({percent(static['lower'])} to {percent(static['upper'])}); the "
                    "calculator page gives the exact number from logged lengths."
                )
            st.markdown(f"{CHECK_MARKS[check.ok]} **{check.question}** {check.answer}", help=detail)


def advice_box(series: dict, frames: TimeFrames) -> None:
    advice = series.get("advice") or {}
    with st.expander(f"What to change, from {frames.window(series)}", key="live_advice"):
        st.markdown(
            f"**Advice:** {plain_markdown(advice.get('summary') or 'none yet')}",
            help=f"The advice reads the whole window, {frames.window(series)}: what happened "
            "in it (requests that waited at the cap, say) may differ from the diagnosis, "
            "which reads the queue now.",
        )
        gap = device_time_note(series)
        if gap is not None:
            st.warning(plain_markdown(gap), icon=":material/timer:")
        rows = advice_rows(advice)
        if rows:
            st.dataframe(
                rows,
                hide_index=True,
                width="stretch",
                key="advice_table",
                column_config={
                    "inputs": st.column_config.TextColumn(
                        "inputs",
                        help="Each number's inputs; docs/metrics.md gives the formulas. The "
                        "same numbers: /api/v1/advice and batchscope_advice_value.",
                    )
                },
            )


def charts_box(frame: pd.DataFrame, series: dict, name: str, now: float, origin: str) -> None:
    """Every chart of the target over the chosen range, folded."""
    with st.expander("All charts over the range", key="live_charts"):
        st.caption(f"History from {origin}, {len(frame)} points, one per evaluation.")
        if frame.empty:
            st.info("No history for this target yet.")
            return
        charts_grid(frame, series, name, now)


def charts_grid(frame: pd.DataFrame, series: dict, name: str, now: float) -> None:
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


def folded_details(
    series: dict, frames: TimeFrames, frame: pd.DataFrame, name: str, now: float, origin: str
) -> None:
    """Everything the first screen does not show, one click away. Every box is keyed: a
    box the user opened stays open while a banner comes or goes above it, or its label's
    numbers change."""
    reason_box(series)
    limits_box(series)
    numbers_box(series, frames)
    slo_panel(series, frames)
    checklist_box(series)
    advice_box(series, frames)
    charts_box(frame, series, name, now, origin)


# ---------------------------------------------------------------- the history


def history_for(
    sources: ui.Sources, name: str, labels: dict | None, range_seconds: float | None, now: float
) -> tuple[pd.DataFrame, str]:
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
