"""A dashboard's panels as data, and the one builder that turns them into Grafana's JSON.

A panel is a `PanelSpec`: a row of plain data (kind, title, description in the operator's
terms, queries, unit, width, thresholds, ...). `build_panel` makes it with
grafana-foundation-sdk's typed builders; `layout` places rows of them on Grafana's
24-column grid and numbers them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DynamicConfigValue,
    GridPos,
    Threshold,
    ThresholdsMode,
    ValueMap,
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


def targets(queries: Sequence[Query | str]) -> list[prometheus.Dataquery]:
    """Grafana's queries, refs A, B, ... in order; a name left unresolved is a bug."""
    built = []
    for ref, q in zip("ABCDEFGH", queries, strict=False):
        if not isinstance(q, Query):
            raise TypeError(f"query {q!r} was not resolved to a Query")
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


# The panel kinds, by Grafana's plugin id.
TIMESERIES = "timeseries"
STAT = "stat"
TIMELINE = "state-timeline"
HEATMAP = "heatmap"
TABLE = "table"
BARGAUGE = "bargauge"
_BUILDERS = {
    TIMESERIES: timeseries.Panel,
    STAT: stat.Panel,
    TIMELINE: statetimeline.Panel,
    HEATMAP: heatmap.Panel,
    TABLE: table.Panel,
    BARGAUGE: bargauge.Panel,
}


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """One panel as data. `queries` are `Query`s, or names a board resolves (`resolved`);
    `description` may name config keys as `{near_cap:.0%}`. `steps`: threshold steps,
    (None, base colour) first, a value given as a config key where it is one; `lines`
    draws them over a time series. `dashed`: the ref
    id drawn as a dashed reference line; `shaded`: the ref id of a 0/1 series drawn as
    shaded stretches. `show_values`: a state timeline writes its states in the bars."""

    kind: str
    title: str
    description: str
    queries: tuple[Query | str, ...]
    width: int = 12
    unit: str | None = None
    min: float | None = None
    max: float | None = None
    steps: tuple[tuple[float | str | None, str], ...] = ()
    lines: bool = False
    dashed: str | None = None
    shaded: str | None = None
    mappings: tuple[ValueMap, ...] = ()
    stacked: bool = False
    show_values: bool = False

    def resolved(self, queries: Mapping[str, Query], words: Mapping[str, object]) -> PanelSpec:
        """This panel with its named queries looked up, and `words` (the config) filled
        into its text and its threshold steps."""
        return replace(
            self,
            description=self.description.format_map(words),
            queries=tuple(queries[q] if isinstance(q, str) else q for q in self.queries),
            steps=tuple((words[v] if isinstance(v, str) else v, c) for v, c in self.steps),
        )


def build_panel(spec: PanelSpec):
    """The SDK builder of one panel spec (its place and id come from `layout`)."""
    panel = _BUILDERS[spec.kind]().title(spec.title).description(spec.description)
    panel = panel.targets(targets(spec.queries))
    if spec.kind == TIMESERIES:
        panel = panel.legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
    if spec.unit is not None:
        panel = panel.unit(spec.unit)
    if spec.lines:
        panel = threshold_lines(panel)
    if spec.steps:
        panel = panel.thresholds(thresholds(*spec.steps))
    if spec.shaded is not None:
        panel = panel.override_by_query(*saturated_stretches(spec.shaded))
    if spec.dashed is not None:
        panel = panel.override_by_query(*dashed_line(spec.dashed))
    if spec.min is not None:
        panel = panel.min(spec.min)
    if spec.max is not None:
        panel = panel.max(spec.max)
    if spec.mappings:
        panel = panel.mappings(list(spec.mappings))
    if spec.stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if spec.kind == TIMELINE:
        shown = common.VisibilityMode.AUTO if spec.show_values else common.VisibilityMode.NEVER
        panel = panel.show_value(shown)
    if spec.kind == HEATMAP:
        panel = panel.calculate(False)
    return panel


def layout(rows: Sequence[Sequence[PanelSpec]]) -> list:
    """Build and place panels row by row, left to right; ids follow reading order."""
    placed = []
    y = 0
    for row in rows:
        x = 0
        for spec in row:
            placed.append(
                build_panel(spec)
                .id(len(placed) + 1)
                .no_value(NO_VALUE)
                .datasource(DATASOURCE)
                .grid_pos(GridPos(h=PANEL_HEIGHT, w=spec.width, x=x, y=y))
            )
            x += spec.width
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
