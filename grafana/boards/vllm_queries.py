"""The vLLM batching board's queries by name, from the exporter's series or the rules'.

`vllm_queries` gives every name the board's panel table (`vllm_batching.ROWS`) uses. Most
read the same signal from either source's series (`Source`); the diagnosis, the limits,
the static-utilisation estimate and the advice differ in shape, and are built apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from grafana_foundation_sdk.models.dashboard import ValueMap, ValueMappingResult
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.dashboard.states import look
from batchscope.exporter.alerts.fleet_rules import CAP_RULE
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES, OVER_BUDGET
from batchscope.exporter.core.limits import BINDING_CHOICES
from batchscope.exporter.engines.vllm import LATENCY_FAMILIES, OUTPUT_TOKENS
from batchscope.grafana import rules
from batchscope.grafana.boards.common import EXPORTER, Source
from batchscope.grafana.boards.slo import engine_slo_queries
from batchscope.grafana.panels import Query

# One target's engines: the board's variables pick the target and its models.
PER_ENGINE = 'target="$target", model_name=~"$model"'
# vLLM's histograms, kept apart per target, model and engine (never `sum by (le)` alone).
BY_ENGINE = "le, target, model_name, engine"
# The binding-limit timeline's words where no limit binds: idle, or requests ran
# between scrapes (the diagnosis says which).
NO_LIMIT = "none (the gauges read no request)"
# Each binding limit coloured as the diagnosis state it goes with (the Live page's).
LIMIT_COLOURS = {
    NO_LIMIT: look("idle").hex,
    "requests": look("healthy").hex,
    "kv_cache": look("memory_bound").hex,
    "token_budget": look("token_budget_bound").hex,
    "batch_tokens": look("token_budget_bound").hex,
    "deferred": look("queueing").hex,
    "max_wait": look("batch_limited").hex,
    "latency_budget": look("over_budget").hex,
    "arrivals": look("underloaded").hex,
    "unexplained": look("stalled").hex,
}
# The binding limit's value in the timeline: 0 for none, then BINDING_CHOICES in order.
BINDING_VALUES = (NO_LIMIT, *BINDING_CHOICES)
# The limits with a ratio the rules record, each by its recorded series.
RULE_RATIOS = (
    (rules.RUNNING_VS_CAP, "requests"),
    (rules.KV_USAGE, "kv_cache"),
    (rules.TOKEN_BUDGET_RATIO, "token_budget"),
)


def state_mappings() -> tuple[ValueMap, ...]:
    """Each diagnosis state's place in DIAGNOSIS_STATES (first match first) mapped to its
    words and colour, as the Live page shows them (`batchscope.dashboard.states`)."""
    return (
        ValueMap(
            {
                str(index): ValueMappingResult(look(state).words, look(state).hex, index=index)
                for index, state in enumerate(DIAGNOSIS_STATES)
            }
        ),
    )


def binding_mappings() -> tuple[ValueMap, ...]:
    """Each binding limit's value (`BINDING_VALUES`) mapped to its name and colour."""
    return (
        ValueMap(
            {
                str(index): ValueMappingResult(limit, LIMIT_COLOURS[limit], index=index)
                for index, limit in enumerate(BINDING_VALUES)
            }
        ),
    )


def binding_index_query(name: str, limits: tuple[str, ...], selector: str, by: str) -> Query:
    """The binding limit as one row per engine series whose value is its place in
    BINDING_VALUES: the exporter's `batchscope_binding_limit` and the rules' record a 1
    for the limit that binds and a 0 for each other (`limits`), so their weighted sum is
    the binding one's place, 0 where none binds."""
    terms = [
        f'{name}{{{selector}, limit="{limit}"}} * {BINDING_VALUES.index(limit)}' for limit in limits
    ]
    return Query(f"sum by ({by}) (\n  " + "\nor ".join(terms) + "\n)", "{{model_name}}")


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


def latency_quantiles(selector: str) -> dict[str, Query]:
    """p99 of end-to-end latency, time to first token and queue time, per engine."""
    return {
        f"p99 {kind}": Query(
            f"histogram_quantile(0.99, sum by ({BY_ENGINE}) "
            f"(rate({LATENCY_FAMILIES[kind]}_bucket{{{selector}}}[$__rate_interval])))",
            f"p99 {label} {{{{model_name}}}}",
        )
        for kind, label in (
            ("e2e", "end-to-end"),
            ("ttft", "time to first token"),
            ("queue", "queue"),
        )
    }


def _exporter_only(series: str) -> dict[str, Query]:
    """What only the exporter computes (the cap it judges by, the limits breakdown, the
    static-utilisation estimate, the advice), over one target's engine series."""
    return {
        "cap": Query(f"batchscope_batch_cap{{{series}}}", "cap {{model_name}}"),
        "limit ratios": Query(
            f'batchscope_limit_ratio{{{series}, limit=~"requests|kv_cache|token_budget"}}',
            "{{limit}} {{model_name}}",
        ),
        "static": Query(
            f"batchscope_static_utilization_ratio{{{series}}}", "{{bound}} {{model_name}}"
        ),
        "sustainable": Query(
            f'batchscope_advice_value{{kind="sustainable_concurrency", {series}}}',
            "KV cache holds {{model_name}}",
        ),
        "advice": Query(
            f"batchscope_advice_value{{{series}}}", instant=True, format=PromQueryFormat.TABLE
        ),
    }


def _rules_only(sel: str) -> dict[str, Query]:
    """The same readings from the recording rules, where they take another shape."""
    return {
        "cap": Query(f'{CAP_RULE}{{target="$target"}}', "cap (--max-num-seqs)"),
        # One query, each recorded ratio labelled with its limit: a limit the target does
        # not configure (no token budget) is a missing line, not an empty query.
        "limit ratios": Query(
            "\nor ".join(
                f'label_replace({name}{{{sel}}}, "limit", "{limit}", "", "")'
                for name, limit in RULE_RATIOS
            ),
            "{{limit}} {{model_name}}",
        ),
        "mean output": Query(f"{rules.OUTPUT_TOKENS_MEAN}{{{sel}}}", "{{model_name}}"),
    }


def vllm_queries(source: Source, config: Mapping) -> dict[str, Query]:
    """Every query of the vLLM board, by the name its panel table uses."""
    sel = PER_ENGINE
    series = f"{sel}{source.series}"
    by = ", ".join(config["instance_labels"])
    only = _exporter_only(series) if source is EXPORTER else _rules_only(sel)
    return {
        "running": Query(f"{source.running}{{{series}}}", "running {{model_name}}"),
        "waiting": Query(f"{source.waiting}{{{series}}}", "waiting {{model_name}}"),
        "running vs cap": Query(f"{source.running_vs_cap}{{{series}}}", "{{model_name}}"),
        "preemptions": Query(f"{source.preemptions}{{{series}}}", "{{model_name}}"),
        "kv": Query(f"{source.kv_usage}{{{series}}}", "{{model_name}}"),
        "utilization": Query(f"{source.utilization}{{{series}}}", "utilisation {{model_name}}"),
        "budget used": Query(f"{source.utilization}{{{series}}}", "{{model_name}}"),
        "saturated": Query(f"{source.saturated}{{{series}}}", "saturated {{model_name}}"),
        "state": state_index_query(source, sel, config),
        "lengths": Query(
            f"sum by (le) (rate({OUTPUT_TOKENS}_bucket{{{sel}}}[$__rate_interval]))",
            "{{le}}",
            format=PromQueryFormat.HEATMAP,
        ),
        "throughput": Query(f"{source.generation_tokens}{{{series}}}", "tokens/s {{model_name}}"),
        **latency_quantiles(sel),
        **engine_slo_queries(source, series),
        "binding": (
            binding_index_query("batchscope_binding_limit", BINDING_CHOICES, series, by)
            if source is EXPORTER
            else binding_index_query(rules.BINDING_LIMIT, rules.BINDING_LIMITS, sel, by)
        ),
        "limit ratios now": replace(only["limit ratios"], instant=True),
        **only,
    }
