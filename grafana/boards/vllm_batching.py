"""The vLLM batching dashboard: one target's batch, queue, KV cache, latency budget and advice."""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.builders import heatmap, statetimeline, table
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.exporter.alerts.fleet_rules import CAP_RULE
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from batchscope.exporter.engines.vllm import OUTPUT_TOKENS
from batchscope.grafana import rules
from batchscope.grafana.boards.common import (
    EXPORTER,
    PER_ENGINE,
    Source,
    budget_panel,
    build_dashboard,
    latency_quantiles,
    series_panel,
    state_index_query,
    state_mappings,
    target_variables,
)
from batchscope.grafana.boards.slo import engine_slo_row
from batchscope.grafana.panels import (
    Query,
    dashed_line,
    targets,
    threshold_lines,
    thresholds,
)

# The binding-limit row where no limit binds: idle, or requests ran between scrapes.
NO_LIMIT = "none (the gauges read no request)"


def vllm_batching(source: Source, config: Mapping) -> dict:
    sel = PER_ENGINE
    series = f"{sel}{source.series}"
    threshold = config["saturation_threshold"]
    near_cap, kv_high = config["near_cap"], config["kv_high"]
    cap = (
        Query(f"batchscope_batch_cap{{{series}}}", "cap {{model_name}}")
        if source is EXPORTER
        else Query(f'{CAP_RULE}{{target="$target"}}', "cap (--max-num-seqs)")
    )
    running = (
        series_panel(
            "Running vs cap",
            "Requests in the running batch (vllm:num_requests_running) against the cap "
            "(--max-num-seqs, from the target's config: vLLM does not expose it). Under real "
            "traffic the batch should sit near the cap. Far below it while requests wait: "
            "something else limits the batch, almost always KV cache memory.",
            "short",
            Query(f"{source.running}{{{series}}}", "running {{model_name}}"),
            cap,
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )
    ratio = (
        threshold_lines(
            series_panel(
                "Running / cap",
                f"The running batch as a share of its cap. At or over {near_cap:.0%} "
                "continuous batching is doing its job and the next limit is elsewhere.",
                "percentunit",
                Query(f"{source.running_vs_cap}{{{series}}}", "{{model_name}}"),
            )
        )
        .thresholds(thresholds((None, "orange"), (near_cap, "green")))
        .min(0)
    )
    waiting = series_panel(
        "Waiting",
        "Requests waiting for a batch slot (vllm:num_requests_waiting, plus V0's swapped). "
        "Waiting with running near the cap: the server is full. Waiting with running well "
        "under the cap: memory or another limit holds the batch back.",
        "short",
        Query(f"{source.waiting}{{{series}}}", "waiting {{model_name}}"),
    ).min(0)
    preemptions = series_panel(
        "Preemptions per second",
        "Rate of vllm:num_preemptions_total over the window (a restart is not a negative "
        "rate). When the KV cache fills, the scheduler pulls a running request out and "
        "requeues it. Climbing at a load the server used to handle: it is short of memory.",
        "ops",
        Query(f"{source.preemptions}{{{series}}}", "{{model_name}}"),
    ).min(0)
    kv = (
        threshold_lines(
            series_panel(
                "KV cache usage",
                "Share of the KV cache in use (vllm:kv_cache_usage_perc; "
                "vllm:gpu_cache_usage_perc before 0.9). Raise --max-num-seqs only when this "
                f"has room: at {kv_high:.0%} or more, KV memory decides how many requests fit.",
                "percentunit",
                Query(f"{source.kv_usage}{{{series}}}", "{{model_name}}"),
            )
        )
        .thresholds(thresholds((None, "green"), (kv_high, "red")))
        .min(0)
        .max(1)
    )
    if source is EXPORTER:
        limit_ratios = [
            Query(
                f'batchscope_limit_ratio{{{series}, limit=~"requests|kv_cache|token_budget"}}',
                "{{limit}} {{model_name}}",
            )
        ]
        # Every binding-limit line at 0: its own row, not a gap, whatever the diagnosis.
        binding = Query(
            f"batchscope_binding_limit{{{series}}} == 1\nor label_replace("
            f"max without (limit) (batchscope_binding_limit{{{series}}}) == 0, "
            f'"limit", "{NO_LIMIT}", "", "")',
            "{{limit}}",
        )
    else:
        # One query, each recorded ratio labelled with its limit: a limit the target does
        # not configure (no token budget) is a missing line, not an empty query.
        limit_ratios = [
            Query(
                "\nor ".join(
                    f'label_replace({name}{{{sel}}}, "limit", "{limit}", "", "")'
                    for name, limit in (
                        (rules.RUNNING_VS_CAP, "requests"),
                        (rules.KV_USAGE, "kv_cache"),
                        (rules.TOKEN_BUDGET_RATIO, "token_budget"),
                    )
                ),
                "{{limit}} {{model_name}}",
            )
        ]
        binding = Query(
            f"max by (limit) ({rules.BINDING_LIMIT}{{{sel}}}) == 1\nor label_replace("
            f"max by (target) ({rules.RUNNING}{{{sel}}} + {rules.WAITING}{{{sel}}}) == 0, "
            f'"limit", "{NO_LIMIT}", "", "")',
            "{{limit}}",
        )
    limits = (
        threshold_lines(
            series_panel(
                "What limits the batch: each limit against its bound",
                "Each limit vLLM applies, as a share of its bound: requests (running / "
                "--max-num-seqs), kv_cache (KV cache usage), token_budget (tokens per engine "
                "step / --max-num-batched-tokens, from the target's config: vLLM does not "
                f"expose it). At or over {near_cap:.0%} a limit is at its bound. A line that "
                "is missing is a limit this engine or configuration does not let batchscope "
                "judge (no cap, no max_num_batched_tokens, an older vLLM).",
                "percentunit",
                *limit_ratios,
            )
        )
        .thresholds(thresholds((None, "green"), (near_cap, "orange")))
        .min(0)
    )
    binding_panel = (
        statetimeline.Panel()
        .title("The binding limit")
        .description(
            "The limit that binds the batch now, first match: kv_cache (full or preempting "
            "below the cap), token_budget (steps at the token budget below the cap, KV with "
            "room), requests (at the cap), arrivals (nothing waits), unexplained (requests "
            "wait and no limit the metrics show is at its bound), none while the gauges read "
            "nothing running or waiting (idle, or requests that ran between scrapes: the "
            'diagnosis says which). docs/metrics.md, "What limits the batch".'
        )
        .targets(targets([binding]))
        .show_value(common.VisibilityMode.NEVER)
    )
    budget = budget_panel(
        "The window's latency quantile (p99 of end-to-end latency unless configured) over "
        f"the latency budget. Shaded: saturated, at or over {threshold:.0%} for a minute. "
        "That usually means the budget is too tight for the traffic and throughput is being "
        "left on the table.",
        Query(f"{source.utilization}{{{series}}}", "utilisation {{model_name}}"),
        Query(f"{source.saturated}{{{series}}}", "saturated {{model_name}}"),
        threshold,
    )
    diagnosis = (
        statetimeline.Panel()
        .title("Diagnosis")
        .description(
            "One state at a time per model, first match wins, in this order: "
            + ", ".join(DIAGNOSIS_STATES)
            + ". budget_saturated: at the threshold for the hold; stalled: waiting, room in "
            "the batch and the cache, yet no tokens; memory_bound: waiting under the cap with "
            "KV full or preemptions; token_budget_bound: waiting under the cap, steps at the "
            "token budget, KV with room; preempting: preemptions in the window; work_too_slow: over budget with nothing waiting and "
            "small batches (batching cannot help); over_budget: over budget, not yet for the "
            "hold; healthy: running near the cap. docs/metrics.md explains each."
            + (
                ""
                if source is EXPORTER
                else " From the rules: the conditions they record (the alerting ones, and "
                "over budget); no row while none holds."
            )
        )
        .targets(targets([state_index_query(source, sel, config)]))
        .mappings(state_mappings())
        .show_value(common.VisibilityMode.NEVER)
    )
    lengths = (
        heatmap.Panel()
        .title("Output length (tokens)")
        .description(
            "How many tokens each finished request generated (vllm:request_generation_tokens). "
            "The wider the spread, the more a static batch wastes waiting for its longest "
            "request, and the more continuous batching gains."
        )
        .targets(
            targets(
                [
                    Query(
                        f"sum by (le) (rate({OUTPUT_TOKENS}_bucket{{{sel}}}[$__rate_interval]))",
                        "{{le}}",
                        format=PromQueryFormat.HEATMAP,
                    )
                ]
            )
        )
        .calculate(False)
    )
    if source is EXPORTER:
        static = (
            series_panel(
                "Static utilisation estimate",
                "The share of slot-steps that would do useful work if this window's traffic "
                "were batched statically at the cap: sum(lengths) / (B × max(lengths)) per "
                "group of B, from the output-length histogram, with bounds from the bucket "
                "edges. 52% means a static batcher would idle 48% of its slots; 1/estimate "
                "is what continuous batching gains.",
                "percentunit",
                Query(
                    f"batchscope_static_utilization_ratio{{{series}}}", "{{bound}} {{model_name}}"
                ),
            )
            .min(0)
            .max(1)
        )
    else:
        static = series_panel(
            "Mean output length",
            "Mean generated tokens per request over the window. The static-utilisation "
            "estimate needs E[max of B lengths] from the bucket edges, which PromQL cannot "
            "read as numbers: the exporter's dashboard shows it.",
            "short",
            Query(f"{rules.OUTPUT_TOKENS_MEAN}{{{sel}}}", "{{model_name}}"),
        )
    advice_rows = [[(_kv_advice_panel(series, cap), 12), (_advice_table(series), 12)]]
    latency = series_panel(
        "Latency quantiles",
        "p99 of end-to-end latency, time to first token and queue time over "
        "$__rate_interval, per engine. When queue time is most of the end-to-end latency, "
        "requests wait for a slot rather than compute.",
        "s",
        *latency_quantiles(sel),
    ).min(0)
    throughput = series_panel(
        "Throughput",
        "Generated tokens per second. If it drops exactly when output lengths spread out, "
        "something in the stack still keeps finished requests in the batch.",
        "short",
        Query(f"{source.generation_tokens}{{{series}}}", "tokens/s {{model_name}}"),
    ).min(0)
    return build_dashboard(
        f"batchscope-vllm-{source.key}",
        f"batchscope / vLLM batching ({source.title})",
        "Is continuous batching doing its job on this vLLM, and if not, what limits it? "
        f"Filled from the {source.title}.",
        config,
        target_variables(source, multi_target=False),
        [
            [(running, 12), (waiting, 12)],
            [(ratio, 12), (kv, 12)],
            [(limits, 12), (binding_panel, 12)],
            [(budget, 12), (preemptions, 12)],
            engine_slo_row(source, series, config),
            [(diagnosis, 24)],
            [(lengths, 12), (static, 12)],
            [(latency, 12), (throughput, 12)],
            *(advice_rows if source is EXPORTER else []),
        ],
    )


def _kv_advice_panel(series: str, cap: Query):
    """What the KV cache holds at today's lengths against the cap and the running batch."""
    return (
        series_panel(
            "Advice: requests the KV cache holds vs the cap",
            "Sustainable concurrency: KV capacity (vllm:cache_config_info) over the tokens a "
            "running request holds (measured over the window, else from the prompt and output "
            "length mix). Below the cap (dashed) while requests wait: raising --max-num-seqs "
            "cannot help, the KV cache needs cap x tokens per request (the advice's "
            "kv_tokens_for_cap). Above it while requests wait at the cap: raising the cap helps "
            "up to this line. /api/v1/advice has the sentence and the inputs.",
            "short",
            Query(
                f'batchscope_advice_value{{kind="sustainable_concurrency", {series}}}',
                "KV cache holds {{model_name}}",
            ),
            cap,
            Query(f"batchscope_running_requests{{{series}}}", "running {{model_name}}"),
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )


def _advice_table(series: str):
    return (
        table.Panel()
        .title("Advice, with the numbers")
        .description(
            "Every advice number now, by kind (docs/metrics.md gives each formula): KV "
            "capacity and tokens per request, sustainable concurrency, raise_cap_helps (1: a "
            "higher cap helps, 0: memory-bound, it cannot), kv_tokens_for_cap, the "
            "continuous-batching gain. docs/runbook.md says what to change."
        )
        .targets(
            targets(
                [
                    Query(
                        f"batchscope_advice_value{{{series}}}",
                        instant=True,
                        format=PromQueryFormat.TABLE,
                    )
                ]
            )
        )
    )


# ---------------------------------------------------------------- fleet overview
