"""Plotly figures for the pages: every axis with its unit, thresholds and the cap drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from batchscope.dashboard.calculator import IDLE, SlotPicture
from batchscope.dashboard.episodes import Episode
from batchscope.dashboard.states import CAP_HEX, SATURATED_SHADE, THRESHOLD_HEX, look

LINE_HEX = "#2563eb"
MEMORY_HEX = look("memory_bound").hex
TIME_AXIS = "time (UTC)"
HEIGHT = 260
EMPTY_TEMPLATE = go.layout.Template()


def _figure(
    title: str,
    y_title: str,
    traces: list,
    *,
    percent: bool = False,
    x_title: str = TIME_AXIS,
    height: int = HEIGHT,
    shapes: tuple = (),
    annotations: tuple = (),
    layout: dict | None = None,
) -> go.Figure:
    """One figure, built in one go: shapes as layout dicts and an empty template, since
    plotly's add_hline and its default template cost ~50 ms a figure, and Streamlit
    applies its own theme anyway."""
    return go.Figure(
        data=traces,
        layout={
            "template": EMPTY_TEMPLATE,
            "title": {"text": title, "font": {"size": 14}},
            "height": height,
            "margin": {"l": 10, "r": 10, "t": 40, "b": 10},
            "legend": {
                "orientation": "h",
                "x": 1,
                "xanchor": "right",
                "y": 1.0,
                "yanchor": "bottom",
            },
            "xaxis": {"title": {"text": x_title}},
            "yaxis": {
                "title": {"text": y_title},
                "rangemode": "tozero",
                **({"tickformat": ".0%"} if percent else {}),
            },
            "hovermode": "x unified",
            "shapes": list(shapes),
            "annotations": list(annotations),
            **(layout or {}),
        },
    )


def _hline(y: float, color: str, text: str, dash: str = "dash") -> tuple[dict, dict]:
    """A horizontal line across the plot at `y`, and its label."""
    shape = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": "y",
        "y0": y,
        "y1": y,
        "line": {"color": color, "dash": dash},
    }
    label = {
        "xref": "paper",
        "x": 1,
        "yref": "y",
        "y": y,
        "text": text,
        "showarrow": False,
        "xanchor": "right",
        "yanchor": "bottom",
        "font": {"color": color},
    }
    return shape, label


def _values(column: pd.Series) -> np.ndarray:
    """A column as floats, unknown values as NaN (a gap in the line)."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def _line(
    frame: pd.DataFrame,
    column: str,
    name: str,
    color: str = LINE_HEX,
    dash: str | None = None,
    shape: str = "linear",
) -> go.Scatter:
    return go.Scatter(
        x=frame["time"].to_numpy(),
        y=_values(frame[column]),
        name=name,
        mode="lines",
        line={"color": color, "dash": dash, "shape": shape},
        connectgaps=False,
    )


def running_chart(frame: pd.DataFrame) -> go.Figure:
    """Running requests over time with the cap as a dashed line."""
    traces = [_line(frame, "running", "running")]
    if frame["cap"].notna().any():
        traces.append(_line(frame, "cap", "cap", CAP_HEX, "dash", "hv"))
    return _figure("Running batch vs cap", "requests", traces)


def waiting_chart(frame: pd.DataFrame) -> go.Figure:
    return _figure("Waiting requests", "requests", [_line(frame, "waiting", "waiting")])


def preemptions_chart(frame: pd.DataFrame) -> go.Figure:
    return _figure(
        "Preemptions",
        "preemptions / s",
        [_line(frame, "preemptions_per_second", "preemptions/s", MEMORY_HEX)],
    )


def kv_chart(frame: pd.DataFrame, kv_high: float) -> go.Figure:
    """KV cache usage (0..1 shown as %), with the line where the diagnosis calls it full."""
    shape, label = _hline(kv_high, MEMORY_HEX, f"full ({kv_high:.0%})", "dot")
    return _figure(
        "KV cache usage",
        "KV cache used",
        [_line(frame, "kv_cache_usage", "KV cache", MEMORY_HEX)],
        percent=True,
        shapes=(shape,),
        annotations=(label,),
        layout={
            "yaxis": {"title": {"text": "KV cache used"}, "tickformat": ".0%", "range": [0, 1.05]}
        },
    )


def episode_shapes(episodes: list[Episode], now: float) -> list[dict]:
    """Shaded rectangles over the stretches of sustained saturation."""
    return [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "y0": 0,
            "y1": 1,
            "layer": "below",
            "x0": pd.Timestamp(e.start, unit="s"),
            "x1": pd.Timestamp(now if e.end is None else e.end, unit="s"),
            "fillcolor": SATURATED_SHADE,
            "line": {"width": 0},
        }
        for e in episodes
    ]


def budget_chart(
    frame: pd.DataFrame, threshold: float, episodes: list[Episode], now: float
) -> go.Figure:
    """Budget utilisation with the saturation threshold and the saturated stretches shaded."""
    shape, label = _hline(threshold, THRESHOLD_HEX, f"threshold {threshold:.0%}")
    return _figure(
        "Latency budget utilisation (shaded: sustained saturation)",
        "latency quantile / budget",
        [_line(frame, "budget_utilization", "utilisation")],
        percent=True,
        shapes=(shape, *episode_shapes(episodes, now)),
        annotations=(label,),
    )


BUDGET_HEX = "#7c3aed"
WAITING_HEX = "#f59e0b"
OVERVIEW_HEIGHT = 300


def _overview_layout(title: str) -> dict:
    """The title above the legend, both at the top: a narrow column keeps them whole."""
    return {
        "title": {"text": title, "font": {"size": 14}, "y": 0.98, "yanchor": "top"},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
        "margin": {"l": 10, "r": 10, "t": 70, "b": 10},
    }


def _highest(column: pd.Series) -> float:
    """The largest known value of a column; 0 with none."""
    values = _values(column)
    known = values[~np.isnan(values)]
    return float(known.max()) if known.size else 0.0


def _batch_line(frame: pd.DataFrame) -> go.Scatter:
    """The running batch; a batcher's mean fired batch where it has no running gauge."""
    if frame["running"].notna().any() or not frame["mean_batch_size"].notna().any():
        return _line(frame, "running", "running")
    return _line(frame, "mean_batch_size", "mean batch")


def overview_chart(
    frame: pd.DataFrame,
    threshold: float,
    episodes: list[Episode],
    now: float,
    budget: bool = True,
) -> go.Figure:
    """The first screen's one chart: the batch against its cap and the queue (requests,
    left axis), budget used (right axis, with the saturation threshold; `budget` False: an
    engine that exposes no latency), and the stretches of sustained saturation shaded."""
    traces = [_batch_line(frame)]
    if frame["cap"].notna().any():
        traces.append(_line(frame, "cap", "cap", CAP_HEX, "dash", "hv"))
    traces.append(_line(frame, "waiting", "waiting", WAITING_HEX))
    if not budget:
        title = "Batch and queue (budget used: not exposed by this engine)"
        return _figure(
            title,
            "requests",
            traces,
            x_title="",
            height=OVERVIEW_HEIGHT,
            layout=_overview_layout(title),
        )
    line = _line(frame, "budget_utilization", "budget used", BUDGET_HEX)
    line.yaxis = "y2"
    line.line.width = 3
    shape, label = _hline(threshold, THRESHOLD_HEX, f"saturated at {threshold:.0%}", "dot")
    shape["yref"] = label["yref"] = "y2"
    shape["line"]["width"] = 1
    label.update(x=0, xanchor="left")
    title = "Batch, queue and budget used (shaded: saturated)"
    return _figure(
        title,
        "requests",
        [*traces, line],
        x_title="",
        height=OVERVIEW_HEIGHT,
        shapes=(shape, *episode_shapes(episodes, now)),
        annotations=(label,),
        layout={
            **_overview_layout(title),
            "yaxis2": {
                "title": {"text": "budget used"},
                "overlaying": "y",
                "side": "right",
                "tickformat": ".0%",
                "range": [0, 1.1 * max(1.0, _highest(frame["budget_utilization"]))],
                "showgrid": False,
            },
        },
    )


def gain_chart(frame: pd.DataFrame) -> go.Figure:
    shape, label = _hline(1.0, CAP_HEX, "unbatched", "dot")
    return _figure(
        "Throughput gain vs unbatched",
        "x (items/s vs batch size 1)",
        [_line(frame, "throughput_gain", "throughput gain")],
        shapes=(shape,),
        annotations=(label,),
    )


def static_chart(frame: pd.DataFrame) -> go.Figure:
    return _figure(
        "Static batching would use (estimate)",
        "useful slot-steps",
        [_line(frame, "static_utilization", "static utilisation")],
        layout={
            "yaxis": {
                "title": {"text": "useful slot-steps"},
                "tickformat": ".0%",
                "range": [0, 1.05],
            }
        },
    )


def diagnosis_chart(frame: pd.DataFrame) -> go.Figure:
    """The diagnosis state at each evaluation, one colour per state."""
    traces = []
    for state, points in frame.dropna(subset=["diagnosis"]).groupby("diagnosis", sort=False):
        shown = look(str(state))
        traces.append(
            go.Scatter(
                x=points["time"].to_numpy(),
                y=[shown.words] * len(points),
                mode="markers",
                name=shown.words,
                marker={"color": shown.hex, "size": 8, "symbol": "square"},
            )
        )
    return _figure(
        "Diagnosis over time",
        "state",
        traces,
        height=200,
        layout={"hovermode": "closest", "showlegend": False},
    )


def batch_distribution_chart(distribution: pd.DataFrame, cap: float | None) -> go.Figure:
    title = "Batch size distribution (window" + (f"; cap {cap:g})" if cap is not None else ")")
    bars = go.Bar(
        x=distribution["size"], y=distribution["fraction"], marker_color=LINE_HEX, name="share"
    )
    return _figure(
        title,
        "share of samples",
        [bars],
        percent=True,
        x_title="batch size (requests)",
        layout={
            "hovermode": "closest",
            "xaxis": {"title": {"text": "batch size (requests)"}, "type": "category"},
        },
    )


def fleet_budget_chart(
    history: pd.DataFrame, threshold: float, episodes: list[Episode], now: float
) -> go.Figure:
    """Budget utilisation of every target, one line each, with the threshold and every
    target's saturated stretches shaded."""
    traces = [
        go.Scatter(
            x=frame["time"].to_numpy(),
            y=_values(frame["budget_utilization"]),
            name=str(name),
            mode="lines",
        )
        for name, frame in history.groupby("target", sort=True)
    ]
    shape, label = _hline(threshold, THRESHOLD_HEX, f"threshold {threshold:.0%}")
    return _figure(
        "Budget utilisation, all targets (shaded: sustained saturation)",
        "latency quantile / budget",
        traces,
        percent=True,
        shapes=(shape, *episode_shapes(episodes, now)),
        annotations=(label,),
    )


def slots_chart(picture: SlotPicture, title: str, up_to_step: int, steps_axis: int) -> go.Figure:
    """Slots over steps: each request in its own colour, idle paid slots in grey."""
    grid = picture.grid.astype("float64")
    shown = grid.copy()
    shown[:, up_to_step:] = float("nan")
    idle = shown == IDLE
    shown[idle] = float("nan")
    steps = list(range(1, grid.shape[1] + 1))
    slots = list(range(1, grid.shape[0] + 1))
    traces = [
        go.Heatmap(
            z=shown,
            x=steps,
            y=slots,
            colorscale="Turbo",
            showscale=False,
            xgap=1,
            ygap=1,
            hovertemplate="step %{x}, slot %{y}: request %{z}<extra></extra>",
        ),
        go.Heatmap(
            z=np.where(idle, 1.0, np.nan),
            x=steps,
            y=slots,
            colorscale=[[0, "#d1d5db"], [1, "#d1d5db"]],
            showscale=False,
            xgap=1,
            ygap=1,
            hovertemplate="step %{x}, slot %{y}: idle<extra></extra>",
        ),
    ]
    return _figure(
        title,
        "batch slot",
        traces,
        x_title="decode step",
        height=240,
        layout={
            "hovermode": "closest",
            "xaxis": {"title": {"text": "decode step"}, "range": [0.5, steps_axis + 0.5]},
            "yaxis": {"title": {"text": "batch slot"}, "autorange": "reversed", "dtick": 1},
        },
    )


def _by_setting(
    runs: pd.DataFrame,
    title: str,
    y_title: str,
    columns: dict[str, str | None],
    shapes: tuple = (),
    annotations: tuple = (),
) -> go.Figure:
    traces = []
    for setting, frame in runs.groupby("setting", sort=True):
        for column, dash in columns.items():
            label = f"{setting} {column.removesuffix('_ms').removesuffix('_per_s')}"
            traces.append(
                go.Scatter(
                    x=frame["rate_per_s"],
                    y=frame[column],
                    name=label,
                    mode="lines+markers",
                    line={"dash": dash},
                )
            )
    return _figure(
        title,
        y_title,
        traces,
        x_title="offered rate (requests/s)",
        height=320,
        shapes=shapes,
        annotations=annotations,
        layout={"hovermode": "closest"},
    )


# Height (share of the plot) of one setting's band of binding limits along the x axis.
BAND_HEIGHT = 0.06


def _vline(x: float, color: str, text: str, dash: str, y: float = 1.0) -> tuple[dict, dict]:
    """A vertical line across the plot at `x`, and its label at height `y` (paper)."""
    shape = {
        "type": "line",
        "xref": "x",
        "x0": x,
        "x1": x,
        "yref": "paper",
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "dash": dash},
    }
    label = {
        "xref": "x",
        "x": x,
        "yref": "paper",
        "y": y,
        "text": text,
        "showarrow": False,
        "xanchor": "left",
        "yanchor": "top",
    }
    return shape, label


def binding_bands(runs: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """Per setting with `batching`, a band along the bottom of the plot: one segment per
    step (from midway to the rate before to midway to the next), coloured by the step's
    dominant diagnosis and labelled with its binding limit. Returns (shapes, labels)."""
    shapes: list[dict] = []
    labels: list[dict] = []
    if "diagnosis" not in runs:
        return shapes, labels
    watched = runs[runs["diagnosis"].notna() & runs["rate_per_s"].notna()]
    for row, (_, frame) in enumerate(watched.groupby("setting", sort=True)):
        rates = list(frame["rate_per_s"])
        edges = [
            *(rates[:1]),
            *((a + b) / 2 for a, b in zip(rates, rates[1:], strict=False)),
            *(rates[-1:]),
        ]
        y0, y1 = row * BAND_HEIGHT, (row + 1) * BAND_HEIGHT
        for i, step in enumerate(frame.itertuples()):
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "x0": edges[i],
                    "x1": edges[i + 1] if edges[i + 1] > edges[i] else edges[i] * 1.02,
                    "yref": "paper",
                    "y0": y0,
                    "y1": y1,
                    "fillcolor": look(str(step.diagnosis)).hex,
                    "opacity": 0.35,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
            labels.append(
                {
                    "xref": "x",
                    "x": step.rate_per_s,
                    "yref": "paper",
                    "y": (y0 + y1) / 2,
                    "text": str(step.binding_limit or look(str(step.diagnosis)).words),
                    "showarrow": False,
                    "font": {"size": 9},
                }
            )
    return shapes, labels


def latency_vs_rate_chart(
    runs: pd.DataFrame,
    slo_ms: float | None,
    knee_rates: dict[str, float] | None = None,
    capacity_rates: dict[str, float] | None = None,
) -> go.Figure:
    """p99 and p50 against the offered rate per setting, the SLO line, each knee
    (`knee_rates`: setting -> rate) and capacity (label -> rate) marked, and a band per
    watched setting coloured by each step's diagnosis, labelled with its binding limit."""
    lines = () if slo_ms is None else _hline(slo_ms, THRESHOLD_HEX, f"SLO {slo_ms:g} ms")
    shapes, annotations = binding_bands(runs)
    for setting, rate in (knee_rates or {}).items():
        shape, label = _vline(rate, THRESHOLD_HEX, f"knee {setting}".strip(), "dash")
        shapes.append(shape)
        annotations.append(label)
    for name, rate in (capacity_rates or {}).items():
        shape, label = _vline(rate, CAP_HEX, f"capacity {name}".strip(), "dot", y=0.9)
        shapes.append(shape)
        annotations.append(label)
    return _by_setting(
        runs,
        "End-to-end latency vs rate (solid p99, dotted p50)",
        "latency (ms)",
        {"p99_ms": None, "p50_ms": "dot"},
        shapes=(*lines[:1], *shapes),
        annotations=(*lines[1:], *annotations),
    )


def throughput_vs_rate_chart(runs: pd.DataFrame) -> go.Figure:
    return _by_setting(
        runs,
        "Throughput and goodput vs rate (solid throughput, dashed goodput)",
        "requests / s",
        {"throughput_per_s": None, "goodput_per_s": "dash"},
    )
