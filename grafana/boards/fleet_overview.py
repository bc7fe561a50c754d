"""The fleet overview dashboard: every target's state, budget and batch at a glance."""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.grafana.boards.common import (
    EXPORTER,
    Source,
    build_dashboard,
    state_query,
    target_variables,
)
from batchscope.grafana.boards.slo import fleet_slo_row
from batchscope.grafana.exporter_series import total_selector
from batchscope.grafana.panels import BARGAUGE, STAT, TABLE, TIMESERIES, PanelSpec, Query

ROWS = (
    (
        PanelSpec(
            STAT,
            "Saturated targets",
            "Targets at or over {saturation_threshold:.0%} of their budget for a minute.",
            ("saturated count",),
            width=6,
            unit="short",
            steps=((None, "green"), (1, "red")),
        ),
        PanelSpec(
            STAT,
            "Targets down",
            "Targets whose /metrics did not answer at the last scrape.",
            ("down",),
            width=6,
            unit="short",
            steps=((None, "green"), (1, "red")),
        ),
        PanelSpec(
            BARGAUGE,
            "Budget utilisation, worst first",
            "Each target's latency quantile over its budget, highest first (rules: the worst "
            "engine of the target). At {saturation_threshold:.0%} for a minute a target is "
            "saturated.",
            ("worst first",),
            unit="percentunit",
            min=0,
            max=1.2,
            steps=((None, "green"), ("saturation_threshold", "red")),
        ),
    ),
    (
        PanelSpec(
            TABLE,
            "State per target",
            "The diagnosis of every target: down, budget_saturated, memory_bound and stalled "
            "need action (docs/runbook.md); healthy means running near the cap.",
            ("states",),
            width=24,
        ),
    ),
    (
        PanelSpec(
            TIMESERIES,
            "Running vs cap per target",
            "Running batch over its cap per target; the fleet's median beside. Near 100% "
            "under load: batching is doing its job. Far under it while requests wait: "
            "memory or another limit holds the batch back.",
            ("running vs cap", "median running vs cap"),
            unit="percentunit",
            min=0,
            dashed="B",
        ),
        PanelSpec(
            TIMESERIES,
            "Waiting per target",
            "Requests waiting for a batch slot per target; the fleet total beside.",
            ("waiting", "fleet waiting"),
            unit="short",
            min=0,
        ),
    ),
    (
        PanelSpec(
            TIMESERIES,
            "Budget utilisation per target",
            "Latency quantile over budget per target, over time.",
            ("utilization",),
            unit="percentunit",
            min=0,
            steps=((None, "green"), ("saturation_threshold", "red")),
            lines=True,
        ),
        PanelSpec(
            TIMESERIES,
            "Saturation per target",
            "1 while a target's budget utilisation has stayed at or over the threshold for a "
            "minute.",
            ("saturated",),
            unit="bool",
            min=0,
        ),
    ),
)


def _target_filter(source: Source, config: Mapping) -> str:
    """The selector of each target's total (exporter) or of its engines (rules)."""
    if source is EXPORTER:
        return total_selector(config, 'target=~"$target"')
    return '{target=~"$target"}'


def _states(source: Source, config: Mapping, selector: str) -> Query:
    """Every target's diagnosis now: the exporter's, or the conditions the rules record."""
    if source is EXPORTER:
        return Query(
            f"batchscope_diagnosis{selector} == 1", instant=True, format=PromQueryFormat.TABLE
        )
    conditions = state_query(source, 'target=~"$target"', config).expr
    return Query(
        f"max by (target, state) ({conditions}\n"
        f'or label_replace({source.up}{selector} == 0, "state", "down", "", ""))',
        instant=True,
        format=PromQueryFormat.TABLE,
    )


def _queries(source: Source, config: Mapping) -> dict[str, Query]:
    selector = _target_filter(source, config)

    def per_target(name: str) -> str:
        return f"max by (target) ({name}{selector})"

    return {
        "saturated count": Query(
            f"count({per_target(source.saturated)} == 1) or vector(0)", instant=True
        ),
        "down": Query(f"count({source.up}{selector} == 0) or vector(0)", instant=True),
        "worst first": Query(
            f"sort_desc({per_target(source.utilization)})", "{{target}}", instant=True
        ),
        "states": _states(source, config, selector),
        "running vs cap": Query(per_target(source.running_vs_cap), "{{target}}"),
        "median running vs cap": Query(
            f"quantile(0.5, {per_target(source.running_vs_cap)})", "fleet median"
        ),
        "waiting": Query(f"sum by (target) ({source.waiting}{selector})", "{{target}}"),
        "fleet waiting": Query(f"sum({source.waiting}{selector})", "fleet total"),
        "utilization": Query(per_target(source.utilization), "{{target}}"),
        "saturated": Query(per_target(source.saturated), "{{target}}"),
    }


def fleet_overview(source: Source, config: Mapping) -> dict:
    queries = _queries(source, config)
    rows = [[spec.resolved(queries, config) for spec in row] for row in ROWS]
    return build_dashboard(
        f"batchscope-fleet-{source.key}",
        f"batchscope / fleet overview ({source.title})",
        f"Every target's batching at a glance, worst first. Filled from the {source.title}.",
        config,
        target_variables(source, multi_target=True)[:2],
        [*rows, fleet_slo_row(source, config, _target_filter(source, config))],
    )
