"""Alerts: every sustained budget saturation episode per target (start, end, peak), and
every SLO burn episode (the burn alerts' conditions: start, end, lowest attainment)."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from batchscope.dashboard import charts, ui
from batchscope.dashboard.episodes import (
    SPEED_ALERTS,
    burn_episodes_frame,
    episodes_frame,
    fleet_burn_episodes,
    fleet_episodes,
)
from batchscope.dashboard.formatting import plain_markdown
from batchscope.dashboard.frames import fleet_history_frame, history_frame
from batchscope.exporter.core.signals import SignalSettings

DEFAULTS = SignalSettings()
PROMETHEUS_RANGES = {"1 h": 3600, "6 h": 6 * 3600, "24 h": 86400, "7 d": 7 * 86400}
# The columns every episode table has: where, when, how long.
WHEN_COLUMNS = {
    "target": st.column_config.TextColumn("target"),
    "start": st.column_config.DatetimeColumn("start (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "end": st.column_config.DatetimeColumn("end (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "ongoing": st.column_config.CheckboxColumn("ongoing"),
    "duration_seconds": st.column_config.NumberColumn("duration (s)", format="%.0f"),
}
EPISODE_COLUMNS = {
    **WHEN_COLUMNS,
    "peak_utilization": st.column_config.NumberColumn("peak budget used", format="percent"),
}
BURN_COLUMNS = {
    **WHEN_COLUMNS,
    "alert": st.column_config.TextColumn("alert"),
    "lowest": st.column_config.NumberColumn("lowest attainment", format="percent"),
}


def history_from_prometheus(base: str, seconds: float, now: float) -> pd.DataFrame | None:
    loaded = ui.prometheus_targets(base)
    ui.show_problem(loaded, now)
    if loaded.data is None:
        return None
    frames = []
    for name in loaded.data:
        history = ui.prometheus_history(base, name, seconds, now)
        if history.error:
            st.warning(plain_markdown(history.error))
        frames.append(history_frame(history.data or []).assign(target=name))
    return pd.concat(frames, ignore_index=True) if frames else history_frame([]).assign(target="")


st.title("Saturation episodes")
st.markdown(
    "Stretches where the latency budget stayed saturated (utilisation at or above the "
    "threshold for the hold time): the budget is too tight for the traffic, or the server "
    "needs more capacity. Below them, the SLO burn episodes: where the promise itself was "
    "being broken."
)
page_sources = ui.sources()


@st.fragment(run_every=ui.REFRESH_SECONDS)
def alerts() -> None:
    now = time.time()
    if page_sources.prometheus:
        range_name = (
            st.segmented_control(
                "Time range", list(PROMETHEUS_RANGES), default="6 h", key="alerts_range"
            )
            or "6 h"
        )
        st.caption(f"From Prometheus at {plain_markdown(page_sources.prometheus)}.")
        history = history_from_prometheus(
            page_sources.prometheus, PROMETHEUS_RANGES[range_name], now
        )
    else:
        loaded = ui.history(page_sources.exporter)
        ui.show_problem(loaded, now)
        history = None if loaded.data is None else fleet_history_frame(loaded.data)
        st.caption(
            f"From the history kept by the exporter at "
            f"{plain_markdown(page_sources.exporter)} (set a Prometheus URL for "
            "longer spans)."
        )
    if history is None:
        return
    saturation_section(history, now)
    burn_section(history, now)


def saturation_section(history: pd.DataFrame, now: float) -> None:
    """The fleet's budget over time with its saturation episodes, and their table."""
    episodes = fleet_episodes(history)
    if not history.empty:
        st.plotly_chart(
            charts.fleet_budget_chart(history, DEFAULTS.saturation_threshold, episodes, now),
            width="stretch",
            key="fleet_budget",
        )
    ongoing = [e for e in episodes if e.end is None]
    for e in ongoing:
        since = pd.Timestamp(e.start, unit="s", tz="UTC")
        st.error(
            f"**{plain_markdown(e.target)}** is saturated now (since {since:%H:%M:%S} UTC).",
            icon=":material/notifications_active:",
        )
    if not episodes:
        st.success(
            f"No saturation episode in the {history['target'].nunique()} target(s)' history."
        )
        return
    st.dataframe(
        episodes_frame(episodes, now),
        column_config=EPISODE_COLUMNS,
        hide_index=True,
        width="stretch",
    )


def burn_section(history: pd.DataFrame, now: float) -> None:
    """SLO burn episodes: where the latency promise was being broken (running at the
    ceiling is the saturation above; this is requests missing the budget faster than the
    objective allows)."""
    st.subheader("SLO burn episodes")
    st.caption(
        "Stretches where the error budget burned fast enough for "
        + " or ".join(f"{name} (a {ask})" for name, ask in SPEED_ALERTS.values())
        + ": more requests missed the latency budget than the target's slo_objective "
        "allows. Targets without an objective have none."
    )
    episodes = fleet_burn_episodes(history)
    for e in episodes:
        if e.end is None:
            since = pd.Timestamp(e.start, unit="s", tz="UTC")
            st.error(
                f"**{plain_markdown(e.target)}** is breaking its latency promise now "
                f"({e.speed} burn, since {since:%H:%M:%S} UTC).",
                icon=":material/notifications_active:",
            )
    if not episodes:
        st.success("No SLO burn episode in the history.")
        return
    st.dataframe(
        burn_episodes_frame(episodes, now),
        column_config=BURN_COLUMNS,
        hide_index=True,
        width="stretch",
        key="burn_episodes",
    )


alerts()
