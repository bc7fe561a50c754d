"""What the dashboards share: where their signals come from (the exporter's series or the
recording rules), the variables, the dashboard frame and the panels more than one uses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    ValueMap,
    ValueMappingResult,
)

from batchscope.dashboard.states import look
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES, OVER_BUDGET
from batchscope.exporter.engines.vllm import LATENCY_FAMILIES
from batchscope.grafana import rules
from batchscope.grafana.panels import (
    Query,
    datasource_variable,
    layout,
    query_variable,
    saturated_stretches,
    targets,
    threshold_lines,
    thresholds,
    to_import_json,
)

PER_ENGINE = 'target="$target", model_name=~"$model"'
# vLLM's histograms, kept apart per target, model and engine (never `sum by (le)` alone).
BY_ENGINE = "le, target, model_name, engine"


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
    """A dashboard with these variables and rows of (panel, width), as Grafana imports it."""
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


def series_panel(title: str, description: str, unit: str, *queries: Query):
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .targets(targets(queries))
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
    )


def budget_panel(description: str, utilization: Query, saturated: Query, threshold: float):
    """Budget utilisation against its threshold line, saturated stretches shaded behind."""
    return (
        threshold_lines(
            series_panel("Budget utilisation", description, "percentunit", utilization, saturated)
        )
        .thresholds(thresholds((None, "green"), (threshold, "red")))
        .override_by_query(*saturated_stretches("B"))
        .min(0)
    )


# ---------------------------------------------------------------- vLLM batching


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


def state_mappings() -> list[ValueMap]:
    """Each diagnosis state's place in DIAGNOSIS_STATES (first match first) mapped to its
    words and colour, as the Live page shows them (`batchscope.dashboard.states`)."""
    return [
        ValueMap(
            {
                str(index): ValueMappingResult(look(state).words, look(state).hex, index=index)
                for index, state in enumerate(DIAGNOSIS_STATES)
            }
        )
    ]


def state_index_query(source: Source, selector: str, config: Mapping) -> Query:
    """The diagnosis as one row per engine series whose value is its state's place in
    DIAGNOSIS_STATES (`state_mappings` names it). The exporter's: its one current state
    (every other state reads 0). The rules': the first of the conditions they record that
    holds, in the diagnosis' order, over budget included."""
    by = ", ".join(config["instance_labels"])
    if source is EXPORTER:
        terms = [
            f'batchscope_diagnosis{{{selector}{source.series}, state="{state}"}} * {index}'
            for index, state in enumerate(DIAGNOSIS_STATES)
        ]
        return Query(f"sum by ({by}) (\n  " + "\nor ".join(terms) + "\n)", "{{model_name}}")

    def worst(name: str) -> str:
        return f"max by ({by}) ({name}{{{selector}}})"

    over = f"{worst(rules.BUDGET_UTILIZATION)} > {OVER_BUDGET:g}"
    conditions = {
        "budget_saturated": f"{worst(rules.BUDGET_SATURATED_RULE)} == 1",
        "stalled": f"{worst(rules.STALLED_RULE)} == 1",
        "memory_bound": f"{worst(rules.MEMORY_BOUND_RULE)} == 1",
        "token_budget_bound": f"{worst(rules.TOKEN_BUDGET_BOUND_RULE)} == 1",
        "preempting": f"{worst(rules.PREEMPTIONS)} > 0",
        "work_too_slow": f"{over} and on ({by}) {worst(rules.WAITING)} == 0 "
        f"and on ({by}) {worst(rules.RUNNING_VS_CAP)} < {config['near_cap']:g}",
        "over_budget": over,
    }
    parts = [
        f"({conditions[state]}) * 0 + {index}"
        for index, state in enumerate(DIAGNOSIS_STATES)
        if state in conditions
    ]
    return Query("\nor ".join(parts), "{{model_name}}")


def latency_quantiles(selector: str) -> list[Query]:
    return [
        Query(
            f"histogram_quantile(0.99, sum by ({BY_ENGINE}) "
            f"(rate({LATENCY_FAMILIES[kind]}_bucket{{{selector}}}[$__rate_interval])))",
            f"p99 {label} {{{{model_name}}}}",
        )
        for kind, label in (
            ("e2e", "end-to-end"),
            ("ttft", "time to first token"),
            ("queue", "queue"),
        )
    ]
