"""The replica count as recording rules: the exporter's count (exporter/core/demand.py,
exporter/core/replicas.py) from vLLM's raw series, at fleet scale.

Per engine (target, model_name, engine): its demand, the requests it runs at once at its
binding limit, the time a request holds its slot, the headroom the queue needs within
the budget, and its capacity within the budget (labelled `limit`). Per model
(`model_name`): demand (with admission rejections, which vLLM counts per model), a
replica's capacity (the mean over the engines at a limit the metrics show, else over
all measured), the engines serving it, and the count now: demand over capacity rounded up, never
above today's where arrivals bind or one engine queues at its limit while another idles,
the minimum while idle, within the bounds `batchscope-rules` writes from the fleet file.
tests/grafana/test_rule_twins.py holds each equal to the exporter's on the same series;
test_replica_twins.py for a model of two data-parallel engines: routed, idle, bounded.

Two differences, documented: the held count is a `max_over_time` of the count over the
scale-down window (down once the lower count has held for it; up at once, where the
exporter waits for the saturation hold); and a model is its engines' `model_name` (the
fleet file's per-target `model:` is the exporter's alone). Where the engines of one
model are bound by different limits, the capacity is recorded once per limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from batchscope.exporter.alerts.fleet_rules import (
    BUDGET_RULE,
    CAP_RULE,
    MAX_REPLICAS_RULE,
    MIN_REPLICAS_RULE,
    MODEL_MAX_REPLICAS_RULE,
    MODEL_MIN_REPLICAS_RULE,
    RECORDED_QUANTILES,
    TOKEN_BUDGET_RULE,
    quantile_label,
)
from batchscope.exporter.core.demand import (
    AT_CAP,
    HELD_LIMITS,
    MIN_HEADROOM,
    QUEUED_KINDS,
    SHOWN_LIMITS,
    TINY_SLACK_SECONDS,
)
from batchscope.exporter.core.replicas import IDLE_SHARE, WHOLE
from batchscope.grafana.promql import instance_by, record, seconds
from batchscope.grafana.rules import (
    BINDING_LIMIT,
    LATENCY,
    LEVEL,
    REQUESTS,
    RUNNING,
    RUNNING_VS_CAP,
    SCRAPED,
    TOKENS_PER_STEP,
    WAITING,
    WAITING_NAMES,
)

MEAN_RUNNING = f"{LEVEL}:vllm_num_requests_running:avg"
DEMAND = f"{LEVEL}:vllm_demand:rate"
CONCURRENCY = f"{LEVEL}:vllm_replica_concurrency:requests"
SLOT = f"{LEVEL}:vllm_replica_slot:seconds"
AT_LIMIT = f"{LEVEL}:vllm_replica_capacity_at_limit:rate"
HEADROOM = f"{LEVEL}:vllm_replica_headroom:ratio"
CAPACITY = f"{LEVEL}:vllm_replica_capacity:rate"
# 1 for an engine queueing at its limit, and for one idling (`replicas.role_of`).
QUEUED = f"{LEVEL}:vllm_replica_queued:bool"
IDLE = f"{LEVEL}:vllm_replica_idle:bool"
MODEL = "model_name"
MODEL_DEMAND = f"{MODEL}:vllm_demand:rate"
MODEL_CAPACITY = f"{MODEL}:vllm_replica_capacity:rate"
MODEL_CAPACITY_MEAN = f"{MODEL}:vllm_replica_capacity:avg"
MODEL_REPLICAS = f"{MODEL}:vllm_replicas:count"
MODEL_NEEDED = f"{MODEL}:vllm_replicas_needed:ceil"
# Before the bounds (0 while idle), and at least the minimum.
MODEL_UNBOUNDED = f"{MODEL}:vllm_desired_replicas:unbounded"
MODEL_AT_LEAST = f"{MODEL}:vllm_desired_replicas:at_least_min"
# The count now (the exporter's batchscope_needed_replicas), and held over the window.
MODEL_COUNT = f"{MODEL}:vllm_desired_replicas:bounded"
MODEL_DESIRED = f"{MODEL}:vllm_desired_replicas:max_over_scale_down"

# The limits at which an engine runs its cap, the mean it ran, or that mean scaled by the
# token budget over the tokens a step carried (`demand.concurrency_at`); those the metrics
# show it full at, which a model's capacity is read from where any engine is at one.
SHOWN = tuple(limit for limit in SHOWN_LIMITS if limit != "batch_tokens")
FULL = SHOWN
REJECTIONS = "vllm:admission_rejections_total"


def _binds(limits: tuple[str, ...], by: str) -> str:
    return f'on ({by}) ({BINDING_LIMIT}{{limit=~"{"|".join(limits)}"}} == 1)'


def _engine_rules(config: Mapping) -> list[dict]:
    """Each engine's demand, concurrency at its limit, slot time and capacity at it."""
    by, window = instance_by(config), config["window"]
    span = _window_seconds(window)
    growth = " + ".join(
        f"sum by ({by}) (delta({name}{{{SCRAPED}}}[{window}]))"
        for name in ("vllm:num_requests_running", *WAITING_NAMES[:1])
    )
    running = f"sum by ({by}) (avg_over_time(vllm:num_requests_running{{{SCRAPED}}}[{window}]))"
    concurrency = (
        f"(({MEAN_RUNNING} * 0 + on (target) group_left () {CAP_RULE})\nand {_binds(AT_CAP, by)})"
        f"\nor ({MEAN_RUNNING} and {_binds(HELD_LIMITS, by)})"
        f"\nor ({MEAN_RUNNING} * on (target) group_left () {TOKEN_BUDGET_RULE} / {TOKENS_PER_STEP}"
        f"\nand {_binds(('token_budget',), by)})"
    )
    return [
        record(MEAN_RUNNING, running),
        # Swapped requests (V0) wait too, where an engine has them.
        record(
            DEMAND,
            f"clamp_min(\n{REQUESTS} + ({growth}\n"
            f"+ (sum by ({by}) (delta(vllm:num_requests_swapped{{{SCRAPED}}}[{window}])) or "
            f"{REQUESTS} * 0)) / {span!r},\n0)",
        ),
        record(CONCURRENCY, concurrency),
        record(SLOT, f"({MEAN_RUNNING} > 0) / ({REQUESTS} > 0)"),
        record(AT_LIMIT, f"({CONCURRENCY} > 0) / {SLOT}"),
    ]


def _window_seconds(window: str) -> float:
    """A `64s`-style duration in seconds (the rules' window, as `seconds` writes it)."""
    return float(window.removesuffix("ms")) / 1000 if window.endswith("ms") else float(window[:-1])


def _headroom_rules(config: Mapping) -> list[dict]:
    """The headroom within each target's budget, for each quantile and queued latency kind
    (`demand.headroom`); 1 for a target without a budget or one no queue delays."""
    parts = []
    for quantile in RECORDED_QUANTILES:
        spread = math.log(1 / (1 - quantile))
        q = quantile_label(quantile)
        for kind, part in QUEUED_KINDS.items():
            budget = f'{BUDGET_RULE}{{quantile="{q}", histogram="{kind}"}}'
            if part is None:
                service = f"{SLOT} * 0"
            else:
                quantile_of = f'{LATENCY}{{quantile="{q}", histogram="{part}"}}'
                service = f"(max without (quantile, histogram) ({quantile_of}) or {SLOT})"
            slack = f"clamp_min({budget} - on (target) group_right () {service}, {TINY_SLACK_SECONDS!r})"
            parts.append(
                f"clamp(1 - {spread!r} * {SLOT} / (2 * {CONCURRENCY} * {slack}), "
                f"{MIN_HEADROOM!r}, 1)"
            )
    exprs = "\nor ".join(f"({p})" for p in parts)
    return [record(HEADROOM, f"{exprs}\nor ({SLOT} * 0 + 1)")]


def _role_rules(config: Mapping) -> list[dict]:
    """Queueing at a full limit, and idling (`replicas.role_of`), as 1 or 0 an engine."""
    by = instance_by(config)
    on = f"on ({by})"
    idle = (
        f"({WAITING} == 0)\nand (({RUNNING_VS_CAP} <= {IDLE_SHARE!r}) or ({RUNNING} == 0))\n"
        f'unless {on} ({BINDING_LIMIT}{{limit!="arrivals"}} == 1)'
    )
    return [
        record(QUEUED, _as_bool(f"({WAITING} > 0)\nand {_binds(FULL, by)}")),
        record(IDLE, _as_bool(idle)),
    ]


def _as_bool(condition: str) -> str:
    return f"clamp(\n{condition},\n1, 1)\nor {WAITING} * 0"


def _at_least(series: str) -> str:
    """`series` (by model_name) at least each model's minimum, else the fleet's (1 where
    `batchscope-rules` wrote none)."""
    on = f"on ({MODEL})"
    return (
        f"({series} >= {on} {MODEL_MIN_REPLICAS_RULE})\n"
        f"or {on} ({MODEL_MIN_REPLICAS_RULE} and {on} {series})\n"
        f"or {on} clamp_min({series}, scalar({MIN_REPLICAS_RULE} or vector(1)))"
    )


def _at_most(series: str) -> str:
    """`series` (by model_name) at most each model's maximum, else the fleet's (none
    where `batchscope-rules` wrote none)."""
    on = f"on ({MODEL})"
    return (
        f"({series} <= {on} {MODEL_MAX_REPLICAS_RULE})\n"
        f"or {on} ({MODEL_MAX_REPLICAS_RULE} and {on} {series})\n"
        f"or {on} clamp_max({series}, scalar({MAX_REPLICAS_RULE} or vector(Inf)))"
    )


def _model_rules(config: Mapping) -> list[dict]:
    """Each model's demand, a replica's capacity, its engines and its count."""
    by, window = instance_by(config), config["window"]
    on = f"on ({MODEL})"
    limited = {
        kind: f'{CAPACITY} * on ({by}) group_left (limit) ({BINDING_LIMIT}{{limit{op}"{"|".join(SHOWN)}"}} == 1)'
        for kind, op in (("at_limit", "=~"), ("not_shown", "!~"))
    }
    demand = f"sum by ({MODEL}) ({DEMAND})"
    rejections = f"sum by ({MODEL}) (rate({REJECTIONS}{{{SCRAPED}}}[{window}]))"
    routing = f"(sum by ({MODEL}) ({QUEUED}) > 0)\nand {on} (sum by ({MODEL}) ({IDLE}) > 0)"
    # Every engine at a limit, measured or not (`replicas.count_model`).
    bound = f'count by ({MODEL}) ({BINDING_LIMIT}{{limit!="arrivals"}} == 1)'
    arrivals_only = f"{MODEL_NEEDED} unless {on} {bound}"
    fewer = (
        f"({MODEL_NEEDED} < {on} {MODEL_REPLICAS})\n"
        f"or {on} ({MODEL_REPLICAS} and {on} {MODEL_NEEDED})"
    )
    return [
        record(CAPACITY, f"{AT_LIMIT} * {HEADROOM}"),
        record(MODEL_DEMAND, f"({demand} + {on} {rejections})\nor {demand}"),
        record(
            MODEL_CAPACITY,
            f"avg by ({MODEL}, limit) ({limited['at_limit']})\n"
            f"or {on} avg by ({MODEL}, limit) ({limited['not_shown']})",
        ),
        record(
            MODEL_CAPACITY_MEAN,
            f"avg by ({MODEL}) ({limited['at_limit']})\n"
            f"or {on} avg by ({MODEL}) ({limited['not_shown']})",
        ),
        record(MODEL_REPLICAS, f"count by ({MODEL}) ({RUNNING})"),
        record(
            MODEL_NEEDED,
            f"clamp_min(ceil({MODEL_DEMAND} / {MODEL_CAPACITY_MEAN} - {WHOLE!r}), 1)",
        ),
        # Never above today's where routing is the problem or arrivals bind; 0 while idle.
        record(
            MODEL_UNBOUNDED,
            f"(({fewer})\nand {on} (({routing})\nor {on} ({arrivals_only})))\n"
            f"or {on} {MODEL_NEEDED}\n"
            f"or {on} ({MODEL_REPLICAS} * 0 unless {on} ({BINDING_LIMIT} == 1))",
        ),
        record(MODEL_AT_LEAST, _at_least(MODEL_UNBOUNDED)),
        record(MODEL_COUNT, _at_most(MODEL_AT_LEAST)),
        record(
            MODEL_DESIRED,
            f"max_over_time({MODEL_COUNT}[{seconds(config['scale_down_seconds'])}])",
        ),
    ]


def replica_recording_rules(config: Mapping) -> list[dict]:
    """The replica count's rules, in the signals' group: they read its series at the same
    evaluation, and Prometheus orders rules within a group only."""
    return [
        *_engine_rules(config),
        *_headroom_rules(config),
        *_role_rules(config),
        *_model_rules(config),
    ]
