"""The SLO rows: is the latency promise kept, and how fast is its error budget burning?

One row for one target's engines (vLLM batching) and one for the fleet, from the
exporter's `batchscope_slo_*` series or the SLO recording rules. Only targets that set
an `slo_objective` have burn rates and an error budget; attainment and goodput are the
exporter's for every target with a budget, the rules' for targets with an objective.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchscope.exporter.alerts.fleet_rules import SLO_OBJECTIVE_RULE
from batchscope.exporter.core.slo import WINDOW_PAIRS
from batchscope.grafana import rules
from batchscope.grafana.boards.common import EXPORTER, Source
from batchscope.grafana.panels import BARGAUGE, STAT, TIMESERIES, PanelSpec, Query


def pairs_text(speed: str | None = None) -> str:
    """The window pairs (of one speed, or all) as a panel says them: "1h/5m over 14.4x"."""
    return ", ".join(
        f"{p.long}/{p.short} over {p.factor:g}x"
        for p in WINDOW_PAIRS
        if speed is None or p.speed == speed
    )


# The pairs' factors as threshold steps: green under 1x, red from the fast page.
BURN_STEPS = ((None, "green"), (1, "yellow"), (6, "orange"), (14.4, "red"))

# Attainment against the objective, goodput, the burn rate by window and the error budget
# left, per engine of the chosen target (`engine_slo_queries`).
ENGINE_ROW = (
    PanelSpec(
        TIMESERIES,
        "SLO: attainment against the objective",
        "Share of the window's requests within the latency budget, from the latency "
        "histogram's buckets: exact when the budget is a bucket edge, else between the "
        "lower and upper bounds (the exporter shows all three; the rules the estimate). "
        "Under the objective (dashed) the promise is being broken: see the burn rate.",
        ("attained", "objective"),
        width=6,
        unit="percentunit",
        max=1,
        dashed="B",
    ),
    PanelSpec(
        TIMESERIES,
        "SLO: goodput",
        "Requests per second within the latency budget, beside all finished requests: the "
        "gap between the two is the traffic that broke the promise.",
        ("goodput", "requests"),
        width=6,
        unit="reqps",
        min=0,
    ),
    PanelSpec(
        TIMESERIES,
        "SLO: burn rate by window",
        "How fast the error budget burns over each standard window: 1 spends it "
        "exactly over the compliance period. The alerts need both windows of a pair: "
        f"{pairs_text()} (BatchingSLOBurnFast pages on the first two, BatchingSLOBurnSlow "
        "opens a ticket on the last). Only for targets with an slo_objective.",
        ("burn",),
        width=6,
        unit="short",
        min=0,
        steps=BURN_STEPS,
        lines=True,
    ),
    PanelSpec(
        TIMESERIES,
        "SLO: error budget left",
        "Share of the compliance period's error budget left (negative: overspent). "
        "The exporter shows it once its own history covers the period; the rules "
        "over what Prometheus keeps of it.",
        ("left",),
        width=6,
        unit="percentunit",
        max=1,
        steps=((None, "red"), (0.25, "orange"), (0.5, "green")),
        lines=True,
    ),
)


def engine_slo_queries(source: Source, selector: str) -> dict[str, Query]:
    """The engine row's queries (ENGINE_ROW's names), from the exporter's series or the
    rules', for the series `selector` picks."""
    if source is EXPORTER:
        return {
            "attained": Query(
                f"batchscope_slo_attainment_ratio{{{selector}}}", "{{bound}} {{model_name}}"
            ),
            "objective": Query(f"batchscope_slo_objective_ratio{{{selector}}}", "objective"),
            "goodput": Query(
                f'batchscope_goodput_requests_per_second{{{selector}, bound="estimate"}}',
                "within the budget {{model_name}}",
            ),
            "requests": Query(
                f"batchscope_requests_per_second{{{selector}}}", "all finished {{model_name}}"
            ),
            "burn": Query(
                f"batchscope_slo_burn_rate_ratio{{{selector}}}", "{{window}} {{model_name}}"
            ),
            "left": Query(
                f"batchscope_slo_error_budget_remaining_ratio{{{selector}}}", "left {{model_name}}"
            ),
        }
    return {
        "attained": Query(
            f'{rules.SLO_ATTAINMENT}{{{selector}, window=""}}', "estimate {{model_name}}"
        ),
        "objective": Query(f'{SLO_OBJECTIVE_RULE}{{target="$target"}}', "objective"),
        "goodput": Query(
            f'{rules.SLO_WITHIN}{{{selector}, window=""}}', "within the budget {{model_name}}"
        ),
        "requests": Query(f'{rules.SLO_REQUESTS}{{{selector}, window=""}}', "all {{model_name}}"),
        "burn": Query(f"{rules.SLO_BURN_RATE}{{{selector}}}", "{{window}} {{model_name}}"),
        "left": Query(f"{rules.SLO_ERROR_BUDGET}{{{selector}}}", "left {{model_name}}"),
    }


FLEET_ROW = (
    PanelSpec(
        STAT,
        "SLO: targets paging",
        f"Targets whose error budget burns fast now ({pairs_text('fast')}): the "
        "promise to users is being broken, not only the batcher at its ceiling.",
        ("paging",),
        width=6,
        unit="short",
        steps=((None, "green"), (1, "red")),
    ),
    PanelSpec(
        BARGAUGE,
        "SLO: burn rate over the hour, worst first",
        "Each target's error budget burn rate over the last hour (the worst engine). "
        "Over 14.4x with the 5-minute window too, BatchingSLOBurnFast pages. Targets "
        "without an slo_objective are not listed.",
        ("hour",),
        width=6,
        unit="short",
        min=0,
        max=20,
        steps=BURN_STEPS,
    ),
    PanelSpec(
        TIMESERIES,
        "SLO: attainment per target",
        "Share of each target's requests within its latency budget over the window "
        "(the worst engine).",
        ("attainment",),
        unit="percentunit",
        min=0,
        max=1,
    ),
)


def _fleet_queries(source: Source, config: Mapping, inner: str) -> dict[str, Query]:
    """The fleet row's queries; `inner`: the matchers of each target's total (exporter)
    or of its engines (rules)."""
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
    return {
        "hour": Query(f"sort_desc({hour})", "{{target}}", instant=True),
        "paging": Query(paging, instant=True),
        "attainment": Query(attainment, "{{target}}"),
    }


def fleet_slo_row(source: Source, config: Mapping, total: str) -> list[PanelSpec]:
    """Every target's burn rate over the hour, worst first, how many are burning, and
    their attainment over time. `total`: the selector of each target's total (exporter)
    or of its engines (rules), with `$target`."""
    queries = _fleet_queries(source, config, total[1:-1])
    return [spec.resolved(queries, config) for spec in FLEET_ROW]
