"""Per-target constants as Prometheus recording rules, from the exporter's own config.

vLLM does not expose its `--max-num-seqs`, and the latency budget is the operator's
promise, so a Prometheus that computes the batching signals from vLLM's raw series
needs both from the same file the exporter reads. Each target becomes one rule group
whose constant series carry the `target` label the generic rules in
`grafana/prometheus/vllm-rules.yml` join on. Pure: settings in, rule groups out.

A target held to an SLO objective also gets the bucket edges its attainment is read at:
the edge at the budget (weight 1), or the two around it in vLLM's default buckets for
its histogram (weights that interpolate between them, as exporter/core/slo.py does).
Each edge is written in the spellings an `le` label takes (`2.0` as vLLM writes it, `2`
as Prometheus 3 normalises it): the rules join on the text.
"""

from __future__ import annotations

from collections.abc import Iterable

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.slo import BudgetEdges, budget_edges
from batchscope.exporter.engines.vllm import DEFAULT_LATENCY_BUCKETS

# The constants the generic rules join on; grafana/rules.py reads these names.
CAP_RULE = "target:vllm_max_num_seqs:config"
BUDGET_RULE = "target:latency_budget_seconds:config"
TOKEN_BUDGET_RULE = "target:vllm_max_num_batched_tokens:config"
# A target's SLO: its objective, the weight of each bucket edge its attainment reads, and
# how many edges that is (the rules count them: a missing bucket is no attainment).
SLO_OBJECTIVE_RULE = "target:slo_objective:config"
SLO_BUCKET_RULE = "target:slo_budget_bucket:config"
SLO_EDGES_RULE = "target:slo_budget_edges:config"
# The replica count's bounds: the fleet's, and a model's own (labelled model_name).
MIN_REPLICAS_RULE = "fleet:replicas_min:config"
MAX_REPLICAS_RULE = "fleet:replicas_max:config"
MODEL_MIN_REPLICAS_RULE = "model_name:replicas_min:config"
MODEL_MAX_REPLICAS_RULE = "model_name:replicas_max:config"
# Quantiles the generic rules record; a target's own quantile must be one of them.
RECORDED_QUANTILES = (0.5, 0.9, 0.95, 0.99)


class UnsupportedTarget(ValueError):
    """A target whose budget the generic rules cannot measure."""


def quantile_label(quantile: float) -> str:
    """The `quantile` label value, as the exporter writes it (`0.99`, `0.5`)."""
    return f"{quantile:g}"


def target_rules(target: Target) -> list[dict]:
    """The constant recording rules of one target; empty when it sets no cap, no token
    budget (`max_num_batched_tokens`) and no latency budget.

    The budget's series carries the target's `quantile` and `histogram` as labels, so the
    generic rules divide the matching latency quantile by it.
    """
    if target.quantile not in RECORDED_QUANTILES:
        raise UnsupportedTarget(
            f"target {target.name}: quantile {target.quantile:g} is not recorded by the "
            f"rules (one of {', '.join(map(quantile_label, RECORDED_QUANTILES))})"
        )
    rules = []
    if target.cap is not None:
        rules.append(
            {
                "record": CAP_RULE,
                "expr": f"vector({target.cap:g})",
                "labels": {"target": target.name},
            }
        )
    if target.max_num_batched_tokens is not None:
        rules.append(
            {
                "record": TOKEN_BUDGET_RULE,
                "expr": f"vector({target.max_num_batched_tokens:g})",
                "labels": {"target": target.name},
            }
        )
    if target.budget_seconds is not None:
        rules.append(
            {
                "record": BUDGET_RULE,
                "expr": f"vector({target.budget_seconds:g})",
                "labels": {
                    "target": target.name,
                    "quantile": quantile_label(target.quantile),
                    "histogram": target.histogram,
                },
            }
        )
    return rules + slo_rules(target)


def le_spellings(edge: float) -> tuple[str, ...]:
    """The texts an `le` label of this edge may hold: prometheus_client's (Python's repr,
    as vLLM writes it) and Prometheus 3's normalised float (no trailing `.0`)."""
    written = repr(float(edge))
    return tuple(dict.fromkeys((written, written.removesuffix(".0"))))


def edge_weights(edges: BudgetEdges) -> dict[float, float]:
    """Each edge the attainment reads, with its weight: the budget's own edge, else the
    lower and upper edges of its bucket (none at 0, where nothing is below; the lower alone
    when the budget is past the last finite edge)."""
    if edges.exact:
        return {edges.lower: 1.0}
    weights = {edges.lower: 1.0 - edges.weight, edges.upper: edges.weight}
    return {edge: w for edge, w in weights.items() if edge > 0 and edge != float("inf")}


def slo_rules(target: Target) -> list[dict]:
    """The SLO constants of a target with an objective (none without one)."""
    if target.slo_objective is None:
        return []
    if target.budget_seconds is None:
        raise UnsupportedTarget(
            f"target {target.name}: slo_objective needs budget_seconds (the latency the "
            "objective promises)"
        )
    labels = {"target": target.name, "histogram": target.histogram}
    edges = budget_edges(DEFAULT_LATENCY_BUCKETS[target.histogram], target.budget_seconds)
    weights = edge_weights(edges)
    rules = [
        {
            "record": SLO_OBJECTIVE_RULE,
            "expr": f"vector({target.slo_objective:g})",
            "labels": dict(labels),
        },
        {"record": SLO_EDGES_RULE, "expr": f"vector({len(weights)})", "labels": dict(labels)},
    ]
    for edge, weight in weights.items():
        for le in le_spellings(edge):
            rules.append(
                {
                    "record": SLO_BUCKET_RULE,
                    "expr": f"vector({weight!r})",
                    "labels": {**labels, "le": le, "edge": f"{edge:g}"},
                }
            )
    return rules


def model_rules(settings: Settings) -> list[dict]:
    """The replica count's bounds: the fleet's (no labels) and each model's of `models:`
    (labelled `model_name`), as grafana/replica_rules.py reads them."""
    rules = [{"record": MIN_REPLICAS_RULE, "expr": f"vector({settings.min_replicas})"}]
    if settings.max_replicas is not None:
        rules.append({"record": MAX_REPLICAS_RULE, "expr": f"vector({settings.max_replicas})"})
    for model, low, high in settings.models:
        for record, value in ((MODEL_MIN_REPLICAS_RULE, low), (MODEL_MAX_REPLICAS_RULE, high)):
            if value is not None:
                rules.append(
                    {"record": record, "expr": f"vector({value})", "labels": {"model_name": model}}
                )
    return rules


def fleet_rule_groups(targets: Iterable[Target], settings: Settings | None = None) -> dict:
    """A Prometheus rule file (as a dict) with one group per target that sets a constant,
    and with `settings`, one of the replica count's bounds."""
    groups = []
    for target in targets:
        rules = target_rules(target)
        if rules:
            groups.append({"name": f"batchscope-target-{target.name}", "rules": rules})
    if settings is not None:
        groups.append({"name": "batchscope-replica-bounds", "rules": model_rules(settings)})
    return {"groups": groups}
