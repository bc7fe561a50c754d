"""What the dashboards share: where their signals come from (the exporter's series or the
recording rules), the variables, the dashboard frame and the panels more than one uses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync

from batchscope.grafana import rules
from batchscope.grafana.panels import (
    TIMESERIES,
    PanelSpec,
    Query,
    datasource_variable,
    layout,
    query_variable,
    to_import_json,
)


@dataclass(frozen=True, slots=True)
class Source:
    """Where a dashboard's signals come from: the exporter's series or the recording rules.

    Each field is a metric name; `series` is the extra matcher that picks one engine's
    series (the exporter also exports a target total, without model_name).
    """

    key: str
    title: str
    running: str
    waiting: str
    running_vs_cap: str
    preemptions: str
    kv_usage: str
    utilization: str
    saturated: str
    generation_tokens: str
    requests: str
    series: str
    up: str


EXPORTER = Source(
    key="exporter",
    title="exporter",
    running="batchscope_running_requests",
    waiting="batchscope_waiting_requests",
    running_vs_cap="batchscope_running_vs_cap_ratio",
    preemptions="batchscope_preemptions_per_second",
    kv_usage="batchscope_kv_cache_usage_ratio",
    utilization="batchscope_budget_utilization_ratio",
    saturated="batchscope_budget_saturated",
    generation_tokens="batchscope_generation_tokens_per_second",
    requests="batchscope_requests_per_second",
    series=', model_name!=""',
    up="batchscope_target_up",
)
RULES = Source(
    key="rules",
    title="Prometheus rules",
    running=rules.RUNNING,
    waiting=rules.WAITING,
    running_vs_cap=rules.RUNNING_VS_CAP,
    preemptions=rules.PREEMPTIONS,
    kv_usage=rules.KV_USAGE,
    utilization=rules.BUDGET_UTILIZATION,
    saturated=rules.BUDGET_SATURATED_RULE,
    generation_tokens=rules.GENERATION_TOKENS,
    requests=rules.REQUESTS,
    series="",
    up="up",
)


def target_variables(source: Source, *, multi_target: bool) -> list:
    return [
        datasource_variable(),
        query_variable(
            "target",
            "Target",
            f"label_values({source.running}, target)",
            multi=multi_target,
            include_all=multi_target,
        ),
        query_variable(
            "model",
            "Model",
            f'label_values({source.running}{{target=~"$target"}}, model_name)',
            multi=True,
            include_all=True,
        ),
    ]


def build_dashboard(
    uid: str, title: str, description: str, config: Mapping, variables: list, rows: list
) -> dict:
    """A dashboard with these variables and rows of panel specs, as Grafana imports it."""
    board = (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(config["dashboard_tags"]))
        .refresh(config["dashboard_refresh"])
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    for variable in variables:
        board = board.with_variable(variable)
    for panel in layout(rows):
        board = board.with_panel(panel)
    return to_import_json(board)


def budget_spec(description: str) -> PanelSpec:
    """Budget utilisation (the query named "utilization") against its threshold line, the
    saturated stretches ("saturated") shaded behind."""
    return PanelSpec(
        TIMESERIES,
        "Budget utilisation",
        description,
        ("utilization", "saturated"),
        unit="percentunit",
        min=0,
        steps=((None, "green"), ("saturation_threshold", "red")),
        lines=True,
        shaded="B",
    )


def state_query(source: Source, selector: str, config: Mapping) -> Query:
    """The diagnosis as one row per state: the exporter's own, or the rules' conditions."""
    if source is EXPORTER:
        return Query(f"batchscope_diagnosis{{{selector}{source.series}}} == 1", "{{state}}")
    by = ", ".join(config["instance_labels"])
    named = [
        (rules.BUDGET_SATURATED_RULE, "budget_saturated"),
        (rules.MEMORY_BOUND_RULE, "memory_bound"),
        (rules.TOKEN_BUDGET_BOUND_RULE, "token_budget_bound"),
        (rules.STALLED_RULE, "stalled"),
    ]
    parts = [
        f'label_replace(max by ({by}) ({name}{{{selector}}}) == 1, "state", "{state}", "", "")'
        for name, state in named
    ]
    return Query("\nor ".join(parts), "{{state}}")
