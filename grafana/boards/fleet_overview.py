"""The fleet overview dashboard: every target's state, budget and batch at a glance."""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.builders import bargauge, table
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.grafana.boards.common import (
    EXPORTER,
    Source,
    build_dashboard,
    series_panel,
    state_query,
    target_variables,
)
from batchscope.grafana.boards.slo import fleet_slo_row
from batchscope.grafana.panels import (
    Query,
    dashed_line,
    targets,
    threshold_lines,
    thresholds,
)
from batchscope.grafana.rules import total_selector


def fleet_overview(source: Source, config: Mapping) -> dict:
    threshold = config["saturation_threshold"]
    if source is EXPORTER:
        total = total_selector(config, 'target=~"$target"')

        def per_target(name: str) -> str:
            return f"max by (target) ({name}{total})"

        states = Query(
            f"batchscope_diagnosis{total} == 1", instant=True, format=PromQueryFormat.TABLE
        )
        down = f"count({source.up}{total} == 0) or vector(0)"
    else:
        selector = '{target=~"$target"}'

        def per_target(name: str) -> str:
            return f"max by (target) ({name}{selector})"

        conditions = state_query(source, 'target=~"$target"', config).expr
        states = Query(
            f"max by (target, state) ({conditions}\n"
            f'or label_replace({source.up}{{target=~"$target"}} == 0, "state", "down", "", ""))',
            instant=True,
            format=PromQueryFormat.TABLE,
        )
        down = f'count({source.up}{{target=~"$target"}} == 0) or vector(0)'
    worst_first = (
        bargauge.Panel()
        .title("Budget utilisation, worst first")
        .description(
            "Each target's latency quantile over its budget, highest first (rules: the worst "
            f"engine of the target). At {threshold:.0%} for a minute a target is saturated."
        )
        .unit("percentunit")
        .min(0)
        .max(1.2)
        .thresholds(thresholds((None, "green"), (threshold, "red")))
        .targets(
            targets(
                [Query(f"sort_desc({per_target(source.utilization)})", "{{target}}", instant=True)]
            )
        )
    )
    state_table = (
        table.Panel()
        .title("State per target")
        .description(
            "The diagnosis of every target: down, budget_saturated, memory_bound and stalled "
            "need action (docs/runbook.md); healthy means running near the cap."
        )
        .targets(targets([states]))
    )
    saturated = (
        stat_panel.Panel()
        .title("Saturated targets")
        .description(f"Targets at or over {threshold:.0%} of their budget for a minute.")
        .unit("short")
        .thresholds(thresholds((None, "green"), (1, "red")))
        .targets(
            targets(
                [Query(f"count({per_target(source.saturated)} == 1) or vector(0)", instant=True)]
            )
        )
    )
    down_stat = (
        stat_panel.Panel()
        .title("Targets down")
        .description("Targets whose /metrics did not answer at the last scrape.")
        .unit("short")
        .thresholds(thresholds((None, "green"), (1, "red")))
        .targets(targets([Query(down, instant=True)]))
    )
    ratio = (
        series_panel(
            "Running vs cap per target",
            "Running batch over its cap per target; the fleet's median beside. Near 100% "
            "under load: batching is doing its job. Far under it while requests wait: "
            "memory or another limit holds the batch back.",
            "percentunit",
            Query(per_target(source.running_vs_cap), "{{target}}"),
            Query(f"quantile(0.5, {per_target(source.running_vs_cap)})", "fleet median"),
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )
    waiting = series_panel(
        "Waiting per target",
        "Requests waiting for a batch slot per target; the fleet total beside.",
        "short",
        Query(f"sum by (target) ({source.waiting}{_target_filter(source, config)})", "{{target}}"),
        Query(f"sum({source.waiting}{_target_filter(source, config)})", "fleet total"),
    ).min(0)
    utilization = (
        threshold_lines(
            series_panel(
                "Budget utilisation per target",
                "Latency quantile over budget per target, over time.",
                "percentunit",
                Query(per_target(source.utilization), "{{target}}"),
            )
        )
        .thresholds(thresholds((None, "green"), (threshold, "red")))
        .min(0)
    )
    saturation = series_panel(
        "Saturation per target",
        "1 while a target's budget utilisation has stayed at or over the threshold for a minute.",
        "bool",
        Query(per_target(source.saturated), "{{target}}"),
    ).min(0)
    return build_dashboard(
        f"batchscope-fleet-{source.key}",
        f"batchscope / fleet overview ({source.title})",
        f"Every target's batching at a glance, worst first. Filled from the {source.title}.",
        config,
        target_variables(source, multi_target=True)[:2],
        [
            [(saturated, 6), (down_stat, 6), (worst_first, 12)],
            [(state_table, 24)],
            [(ratio, 12), (waiting, 12)],
            [(utilization, 12), (saturation, 12)],
            fleet_slo_row(source, config, _target_filter(source, config)),
        ],
    )


def _target_filter(source: Source, config: Mapping) -> str:
    if source is EXPORTER:
        return total_selector(config, 'target=~"$target"')
    return '{target=~"$target"}'


# ---------------------------------------------------------------- in-house batcher
