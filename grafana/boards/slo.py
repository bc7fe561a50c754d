"""The SLO rows: is the latency promise kept, and how fast is its error budget burning?

One row for one target's engines (vLLM batching) and one for the fleet, from the
exporter's `batchscope_slo_*` series or the SLO recording rules. Only targets that set
an `slo_objective` have burn rates and an error budget; attainment and goodput are the
exporter's for every target with a budget, the rules' for targets with an objective.
"""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.builders import bargauge
from grafana_foundation_sdk.builders import stat as stat_panel

from batchscope.exporter.alerts.fleet_rules import SLO_OBJECTIVE_RULE
from batchscope.exporter.core.slo import WINDOW_PAIRS
from batchscope.grafana import rules
from batchscope.grafana.boards.common import EXPORTER, Source, series_panel
from batchscope.grafana.panels import Query, dashed_line, targets, threshold_lines, thresholds


def pairs_text(speed: str | None = None) -> str:
    """The window pairs (of one speed, or all) as a panel says them: "1h/5m over 14.4x"."""
    return ", ".join(
        f"{p.long}/{p.short} over {p.factor:g}x"
        for p in WINDOW_PAIRS
        if speed is None or p.speed == speed
    )


def _burn_steps():
    """The pairs' factors as threshold steps: green under 1x, red from the fast page."""
    return thresholds((None, "green"), (1, "yellow"), (6, "orange"), (14.4, "red"))


def engine_slo_row(source: Source, selector: str, config: Mapping) -> list[tuple[object, int]]:
    """Attainment against the objective, goodput, the burn rate by window and the error
    budget left, per engine of the chosen target (`selector` picks its series)."""
    if source is EXPORTER:
        attained = Query(
            f"batchscope_slo_attainment_ratio{{{selector}}}", "{{bound}} {{model_name}}"
        )
        objective = Query(f"batchscope_slo_objective_ratio{{{selector}}}", "objective")
        goodput = Query(
            f'batchscope_goodput_requests_per_second{{{selector}, bound="estimate"}}',
            "within the budget {{model_name}}",
        )
        requests = Query(
            f"batchscope_requests_per_second{{{selector}}}", "all finished {{model_name}}"
        )
        burn = Query(f"batchscope_slo_burn_rate_ratio{{{selector}}}", "{{window}} {{model_name}}")
        left = Query(
            f"batchscope_slo_error_budget_remaining_ratio{{{selector}}}", "left {{model_name}}"
        )
    else:
        attained = Query(
            f'{rules.SLO_ATTAINMENT}{{{selector}, window=""}}', "estimate {{model_name}}"
        )
        objective = Query(f'{SLO_OBJECTIVE_RULE}{{target="$target"}}', "objective")
        goodput = Query(
            f'{rules.SLO_WITHIN}{{{selector}, window=""}}',
            "within the budget {{model_name}}",
        )
        requests = Query(f'{rules.SLO_REQUESTS}{{{selector}, window=""}}', "all {{model_name}}")
        burn = Query(f"{rules.SLO_BURN_RATE}{{{selector}}}", "{{window}} {{model_name}}")
        left = Query(f"{rules.SLO_ERROR_BUDGET}{{{selector}}}", "left {{model_name}}")
    attainment = (
        series_panel(
            "SLO: attainment against the objective",
            "Share of the window's requests within the latency budget, from the latency "
            "histogram's buckets: exact when the budget is a bucket edge, else between the "
            "lower and upper bounds (the exporter shows all three; the rules the estimate). "
            "Under the objective (dashed) the promise is being broken: see the burn rate.",
            "percentunit",
            attained,
            objective,
        )
        .override_by_query(*dashed_line("B"))
        .max(1)
    )
    goodput_panel = series_panel(
        "SLO: goodput",
        "Requests per second within the latency budget, beside all finished requests: the "
        "gap between the two is the traffic that broke the promise.",
        "reqps",
        goodput,
        requests,
    ).min(0)
    burn_panel = (
        threshold_lines(
            series_panel(
                "SLO: burn rate by window",
                "How fast the error budget burns over each standard window: 1 spends it "
                f"exactly over the compliance period. The alerts need both windows of a pair: "
                f"{pairs_text()} (BatchingSLOBurnFast pages on the first two, BatchingSLOBurnSlow "
                "opens a ticket on the last). Only for targets with an slo_objective.",
                "short",
                burn,
            )
        )
        .thresholds(_burn_steps())
        .min(0)
    )
    budget_left = (
        threshold_lines(
            series_panel(
                "SLO: error budget left",
                "Share of the compliance period's error budget left (negative: overspent). "
                "The exporter shows it once its own history covers the period; the rules "
                "over what Prometheus keeps of it.",
                "percentunit",
                left,
            )
        )
        .thresholds(thresholds((None, "red"), (0.25, "orange"), (0.5, "green")))
        .max(1)
    )
    return [(attainment, 6), (goodput_panel, 6), (burn_panel, 6), (budget_left, 6)]


def fleet_slo_row(source: Source, config: Mapping, total: str) -> list[tuple[object, int]]:
    """Every target's burn rate over the hour, worst first, how many are burning, and
    their attainment over time. `total`: the selector of each target's total (exporter)
    or of its engines (rules), with `$target`."""
    inner = total[1:-1]
    if source is EXPORTER:
        hour = f'max by (target) (batchscope_slo_burn_rate_ratio{{{inner}, window="1h"}})'
        paging = (
            f'count(max by (target) (batchscope_slo_burning{{{inner}, speed="fast"}}) == 1)'
            " or vector(0)"
        )
        attainment = (
            f'min by (target) (batchscope_slo_attainment_ratio{{{inner}, bound="estimate"}})'
        )
    else:
        hour = f'max by (target) ({rules.SLO_BURN_RATE}{{{inner}, window="1h"}})'
        paging = f"count(max by (target) ({rules.vllm_burning('fast', config)})) or vector(0)"
        attainment = f'min by (target) ({rules.SLO_ATTAINMENT}{{{inner}, window=""}})'
    worst = (
        bargauge.Panel()
        .title("SLO: burn rate over the hour, worst first")
        .description(
            "Each target's error budget burn rate over the last hour (the worst engine). "
            "Over 14.4x with the 5-minute window too, BatchingSLOBurnFast pages. Targets "
            "without an slo_objective are not listed."
        )
        .unit("short")
        .min(0)
        .max(20)
        .thresholds(_burn_steps())
        .targets(targets([Query(f"sort_desc({hour})", "{{target}}", instant=True)]))
    )
    burning = (
        stat_panel.Panel()
        .title("SLO: targets paging")
        .description(
            f"Targets whose error budget burns fast now ({pairs_text('fast')}): the "
            "promise to users is being broken, not only the batcher at its ceiling."
        )
        .unit("short")
        .thresholds(thresholds((None, "green"), (1, "red")))
        .targets(targets([Query(paging, instant=True)]))
    )
    over_time = (
        series_panel(
            "SLO: attainment per target",
            "Share of each target's requests within its latency budget over the window "
            "(the worst engine).",
            "percentunit",
            Query(attainment, "{{target}}"),
        )
        .min(0)
        .max(1)
    )
    return [(burning, 6), (worst, 6), (over_time, 12)]
