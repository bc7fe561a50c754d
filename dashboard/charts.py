"""Plotly figures for the pages: every axis with its unit, thresholds and the cap drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.calculator import IDLE, SlotPicture
from dashboard.episodes import Episode
from dashboard.states import CAP_HEX, SATURATED_SHADE, THRESHOLD_HEX, look

LINE_HEX = "#2563eb"
MEMORY_HEX = look("memory_bound").hex
TIME_AXIS = "time (UTC)"
HEIGHT = 260


def _figure(title: str, y_title: str, *, percent: bool = False, x_title: str = TIME_AXIS,
            height: int = HEIGHT) -> go.Figure:  # fmt: skip
    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "y": -0.25},
        xaxis_title=x_title,
        yaxis_title=y_title,
        hovermode="x unified",
        template="plotly_white",
    )
    if percent:
        fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    else:
        fig.update_yaxes(rangemode="tozero")
    return fig


def _line(frame: pd.DataFrame, column: str, name: str, color: str = LINE_HEX,
          dash: str | None = None, shape: str = "linear") -> go.Scatter:  # fmt: skip
    return go.Scatter(
        x=frame["time"], y=frame[column], name=name, mode="lines",
        line={"color": color, "dash": dash, "shape": shape}, connectgaps=False,
    )  # fmt: skip


def running_chart(frame: pd.DataFrame) -> go.Figure:
    """Running requests over time with the cap as a dashed line."""
    fig = _figure("Running batch vs cap", "requests")
    fig.add_trace(_line(frame, "running", "running"))
    if frame["cap"].notna().any():
        fig.add_trace(_line(frame, "cap", "cap", CAP_HEX, "dash", "hv"))
    return fig


def waiting_chart(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Waiting requests", "requests")
    fig.add_trace(_line(frame, "waiting", "waiting"))
    return fig


def preemptions_chart(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Preemptions", "preemptions / s")
    fig.add_trace(_line(frame, "preemptions_per_second", "preemptions/s", MEMORY_HEX))
    return fig


def kv_chart(frame: pd.DataFrame, kv_high: float) -> go.Figure:
    """KV cache usage (0..1 shown as %), with the line where the diagnosis calls it full."""
    fig = _figure("KV cache usage", "KV cache used", percent=True)
    fig.add_trace(_line(frame, "kv_cache_usage", "KV cache", MEMORY_HEX))
    fig.add_hline(y=kv_high, line={"color": MEMORY_HEX, "dash": "dot"},
                  annotation_text=f"full ({kv_high:.0%})")  # fmt: skip
    fig.update_yaxes(range=[0, 1.05])
    return fig


def shade_episodes(fig: go.Figure, episodes: list[Episode], now: float) -> None:
    """Shade the stretches of sustained saturation."""
    for e in episodes:
        fig.add_vrect(
            x0=pd.Timestamp(e.start, unit="s", tz="UTC"),
            x1=pd.Timestamp(now if e.end is None else e.end, unit="s", tz="UTC"),
            fillcolor=SATURATED_SHADE, line_width=0, layer="below",
        )  # fmt: skip


def budget_chart(frame: pd.DataFrame, threshold: float, episodes: list[Episode],
                 now: float) -> go.Figure:  # fmt: skip
    """Budget utilisation with the saturation threshold and the saturated stretches shaded."""
    fig = _figure("Latency budget utilisation (shaded: sustained saturation)",
                  "latency quantile / budget", percent=True)  # fmt: skip
    fig.add_trace(_line(frame, "budget_utilization", "utilisation"))
    fig.add_hline(y=threshold, line={"color": THRESHOLD_HEX, "dash": "dash"},
                  annotation_text=f"threshold {threshold:.0%}")  # fmt: skip
    shade_episodes(fig, episodes, now)
    return fig


def gain_chart(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Throughput gain vs unbatched", "x (items/s vs batch size 1)")
    fig.add_trace(_line(frame, "throughput_gain", "throughput gain"))
    fig.add_hline(y=1, line={"color": CAP_HEX, "dash": "dot"}, annotation_text="unbatched")
    return fig


def static_chart(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Static batching would use (estimate)", "useful slot-steps", percent=True)
    fig.add_trace(_line(frame, "static_utilization", "static utilisation"))
    fig.update_yaxes(range=[0, 1.05])
    return fig


def diagnosis_chart(frame: pd.DataFrame) -> go.Figure:
    """The diagnosis state at each evaluation, one colour per state."""
    fig = _figure("Diagnosis over time", "state", height=200)
    for state, points in frame.dropna(subset=["diagnosis"]).groupby("diagnosis", sort=False):
        shown = look(str(state))
        fig.add_trace(go.Scatter(
            x=points["time"], y=[shown.words] * len(points), mode="markers", name=shown.words,
            marker={"color": shown.hex, "size": 8, "symbol": "square"},
        ))  # fmt: skip
    fig.update_layout(hovermode="closest", showlegend=False)
    return fig


def batch_distribution_chart(distribution: pd.DataFrame, cap: float | None) -> go.Figure:
    fig = _figure("Batch size distribution (window)", "share of samples", percent=True,
                  x_title="batch size (requests)")  # fmt: skip
    fig.add_trace(go.Bar(x=distribution["size"], y=distribution["fraction"],
                         marker_color=LINE_HEX, name="share"))  # fmt: skip
    fig.update_xaxes(type="category")
    if cap is not None:
        fig.update_layout(title={"text": f"Batch size distribution (window; cap {cap:g})"})
    fig.update_layout(hovermode="closest")
    return fig


def fleet_budget_chart(history: pd.DataFrame, threshold: float) -> go.Figure:
    """Budget utilisation of every target, one line each, with the threshold."""
    fig = _figure("Budget utilisation, all targets", "latency quantile / budget", percent=True)
    for name, frame in history.groupby("target", sort=True):
        fig.add_trace(_line(frame, "budget_utilization", str(name), color=None))  # type: ignore[arg-type]
    fig.add_hline(y=threshold, line={"color": THRESHOLD_HEX, "dash": "dash"},
                  annotation_text=f"threshold {threshold:.0%}")  # fmt: skip
    return fig


def slots_chart(picture: SlotPicture, title: str, up_to_step: int, steps_axis: int) -> go.Figure:
    """Slots over steps: each request in its own colour, idle paid slots in grey."""
    grid = picture.grid.astype("float64")
    shown = grid.copy()
    shown[:, up_to_step:] = float("nan")
    idle = shown == IDLE
    shown[idle] = float("nan")
    fig = _figure(title, "batch slot", x_title="decode step", height=240)
    steps = list(range(1, grid.shape[1] + 1))
    slots = list(range(1, grid.shape[0] + 1))
    fig.add_trace(go.Heatmap(
        z=shown, x=steps, y=slots, colorscale="Turbo", showscale=False, xgap=1, ygap=1,
        hovertemplate="step %{x}, slot %{y}: request %{z}<extra></extra>",
    ))  # fmt: skip
    fig.add_trace(go.Heatmap(
        z=np.where(idle, 1.0, np.nan), x=steps, y=slots,
        colorscale=[[0, "#d1d5db"], [1, "#d1d5db"]], showscale=False, xgap=1, ygap=1,
        hovertemplate="step %{x}, slot %{y}: idle<extra></extra>",
    ))  # fmt: skip
    fig.update_xaxes(range=[0.5, steps_axis + 0.5])
    fig.update_yaxes(autorange="reversed", dtick=1)
    fig.update_layout(hovermode="closest")
    return fig


def _by_setting(runs: pd.DataFrame, title: str, y_title: str, columns: dict[str, str | None]
                ) -> go.Figure:  # fmt: skip
    fig = _figure(title, y_title, x_title="offered rate (requests/s)", height=320)
    for setting, frame in runs.groupby("setting", sort=True):
        for column, dash in columns.items():
            label = f"{setting} {column.removesuffix('_ms').removesuffix('_per_s')}"
            fig.add_trace(go.Scatter(x=frame["rate_per_s"], y=frame[column], name=label,
                                     mode="lines+markers", line={"dash": dash}))  # fmt: skip
    fig.update_layout(hovermode="closest")
    return fig


def latency_vs_rate_chart(runs: pd.DataFrame, slo_ms: float | None) -> go.Figure:
    fig = _by_setting(runs, "End-to-end latency vs rate (solid p99, dotted p50)",
                      "latency (ms)", {"p99_ms": None, "p50_ms": "dot"})  # fmt: skip
    if slo_ms is not None:
        fig.add_hline(y=slo_ms, line={"color": THRESHOLD_HEX, "dash": "dash"},
                      annotation_text=f"SLO {slo_ms:g} ms")  # fmt: skip
    return fig


def throughput_vs_rate_chart(runs: pd.DataFrame) -> go.Figure:
    return _by_setting(runs, "Throughput and goodput vs rate (solid throughput, dashed goodput)",
                       "requests / s", {"throughput_per_s": None, "goodput_per_s": "dash"})  # fmt: skip
