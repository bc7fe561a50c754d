"""Small builders over grafana-foundation-sdk that every batchscope dashboard shares.

A panel is built from a title, a description in the operator's terms, its queries and a
unit; `layout` places panels on Grafana's 24-column grid and numbers them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DynamicConfigValue,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

# Panels name the datasource through the variable: no uid is written into the JSON.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana 11's dashboard schema; the import screen migrates anything older.
SCHEMA_VERSION = 39
PANEL_HEIGHT = 8
# What an empty panel says: an engine may not publish the signal at all (llama.cpp has
# no latency histogram, Triton no KV cache), which is not a zero.
NO_VALUE = "not exposed by this engine, or no data yet"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and how its series are named in the legend."""

    expr: str
    legend: str = ""
    instant: bool = False
    format: PromQueryFormat = PromQueryFormat.TIME_SERIES


def targets(queries: Sequence[Query]) -> list[prometheus.Dataquery]:
    built = []
    for ref, q in zip("ABCDEFGH", queries, strict=False):
        query = (
            prometheus.Dataquery()
            .expr(q.expr)
            .legend_format(q.legend or "__auto")
            .ref_id(ref)
            .datasource(DATASOURCE)
            .format(q.format)
        )
        built.append(query.instant() if q.instant else query.range())
    return built


def thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    """Absolute thresholds: (None, base colour) first, then (value, colour) upward."""
    return (
        dash.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(
    name: str, label: str, query: str, *, multi: bool, include_all: bool
) -> dash.QueryVariable:
    variable = (
        dash.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
    )
    if include_all:
        variable = variable.include_all(True).all_value(".*")
    return variable


def saturated_stretches(ref_id: str) -> tuple[str, list[DynamicConfigValue]]:
    """Override for a 0/1 series drawn as shaded stretches behind a ratio."""
    return (
        ref_id,
        [
            DynamicConfigValue("custom.fillOpacity", 25),
            DynamicConfigValue("custom.lineWidth", 0),
            DynamicConfigValue("custom.lineInterpolation", "stepAfter"),
            DynamicConfigValue("custom.axisPlacement", "hidden"),
            DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}),
            DynamicConfigValue("unit", "bool"),
        ],
    )


def dashed_line(ref_id: str) -> tuple[str, list[DynamicConfigValue]]:
    """Override for a reference line (the cap) drawn dashed over the measured series."""
    return (
        ref_id,
        [
            DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
            DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "orange"}),
        ],
    )


def threshold_lines(panel):
    """Draw the panel's thresholds as a line over a shaded area."""
    return panel.thresholds_style(
        common_builders.GraphThresholdsStyleConfig().mode(
            common.GraphTresholdsStyleMode.LINE_AND_AREA
        )
    )


def layout(rows: Sequence[Sequence[tuple[object, int]]]) -> list:
    """Place panels row by row, each (panel, width) left to right; ids follow reading order."""
    placed = []
    y = 0
    for row in rows:
        x = 0
        for panel, width in row:
            placed.append(
                panel.id(len(placed) + 1)
                .no_value(NO_VALUE)
                .datasource(DATASOURCE)
                .grid_pos(GridPos(h=PANEL_HEIGHT, w=width, x=x, y=y))
            )
            x += width
        y += PANEL_HEIGHT
    return placed


# The panel plugins the dashboards use, by id, with the names Grafana's import lists.
PANEL_PLUGINS = {
    "bargauge": "Bar gauge",
    "heatmap": "Heatmap",
    "stat": "Stat",
    "state-timeline": "State timeline",
    "table": "Table",
    "timeseries": "Time series",
}


def to_import_json(builder: dash.Dashboard) -> dict:
    """The built dashboard as Grafana's import screen takes it.

    `__inputs` asks for a Prometheus datasource (DS_PROMETHEUS), which becomes the
    datasource variable's default; `__requires` lists Grafana and the panel plugins used.
    """
    board = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    board["schemaVersion"] = SCHEMA_VERSION
    board["id"] = None
    for variable in board["templating"]["list"]:
        if variable["type"] == "datasource":
            variable["current"] = {"text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ]
    requires += [
        {"type": "panel", "id": kind, "name": PANEL_PLUGINS[kind], "version": ""}
        for kind in sorted({panel["type"] for panel in board["panels"]})
    ]
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus that scrapes the batchscope exporter (and vLLM)",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": requires,
        **board,
    }
