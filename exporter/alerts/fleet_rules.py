"""Per-target constants as Prometheus recording rules, from the exporter's own config.

vLLM does not expose its `--max-num-seqs`, and the latency budget is the operator's
promise, so a Prometheus that computes the batching signals from vLLM's raw series
needs both from the same file the exporter reads. Each target becomes one rule group
whose constant series carry the `target` label the generic rules in
`grafana/prometheus/vllm-rules.yml` join on. Pure: settings in, rule groups out.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.config.settings import Target

# The constants the generic rules join on; grafana/rules.py reads these names.
CAP_RULE = "target:vllm_max_num_seqs:config"
BUDGET_RULE = "target:latency_budget_seconds:config"
TOKEN_BUDGET_RULE = "target:vllm_max_num_batched_tokens:config"
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
    return rules


def fleet_rule_groups(targets: Iterable[Target]) -> dict:
    """A Prometheus rule file (as a dict) with one group per target that sets a constant."""
    groups = []
    for target in targets:
        rules = target_rules(target)
        if rules:
            groups.append({"name": f"batchscope-target-{target.name}", "rules": rules})
    return {"groups": groups}
