"""Alerts: every sustained budget saturation episode per target (start, end, peak)."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from dashboard.episodes import episodes_frame, fleet_episodes
from dashboard.formatting import plain_markdown
from dashboard.frames import fleet_history_frame, history_frame
from exporter.core.signals import SignalSettings

DEFAULTS = SignalSettings()
PROMETHEUS_RANGES = {"1 h": 3600, "6 h": 6 * 3600, "24 h": 86400, "7 d": 7 * 86400}
EPISODE_COLUMNS = {
    "target": st.column_config.TextColumn("target"),
    "start": st.column_config.DatetimeColumn("start (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "end": st.column_config.DatetimeColumn("end (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "ongoing": st.column_config.CheckboxColumn("ongoing"),
    "duration_seconds": st.column_config.NumberColumn("duration (s)", format="%.0f"),
    "peak_utilization": st.column_config.NumberColumn("peak budget used", format="percent"),
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
    "needs more capacity."
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


alerts()
