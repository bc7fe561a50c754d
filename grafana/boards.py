"""The batchscope dashboards, built with Grafana's typed builders (grafana-foundation-sdk).

Fleet overview and vLLM batching come in two fillings from one definition: from the
exporter's `batchscope_*` series, or from the recording rules over vLLM's raw series
(`grafana/prometheus/vllm-rules.yml`), for a fleet that outgrows one exporter. Latency
quantiles and the output-length heatmap read vLLM's histograms in both. The in-house
batcher dashboard reads the batcher's own series and the exporter's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, heatmap, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from exporter.engines.vllm import LATENCY_FAMILIES, OUTPUT_TOKENS
from exporter.fleet_rules import CAP_RULE
from grafana import rules
from grafana.panels import (
    Query,
    dashed_line,
    datasource_variable,
    layout,
    query_variable,
    saturated_stretches,
    targets,
    threshold_lines,
    thresholds,
    to_import_json,
)
from grafana.rules import total_selector

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


def _variables(source: Source, *, multi_target: bool) -> list:
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


def _dashboard(
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


def _series_panel(title: str, description: str, unit: str, *queries: Query):
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


def _budget_panel(description: str, utilization: Query, saturated: Query, threshold: float):
    """Budget utilisation against its threshold line, saturated stretches shaded behind."""
    return (
        threshold_lines(
            _series_panel("Budget utilisation", description, "percentunit", utilization, saturated)
        )
        .thresholds(thresholds((None, "green"), (threshold, "red")))
        .override_by_query(*saturated_stretches("B"))
        .min(0)
    )


# ---------------------------------------------------------------- vLLM batching


def _states(source: Source, selector: str, config: Mapping) -> Query:
    """The diagnosis as one row per state: the exporter's own, or the rules' conditions."""
    if source is EXPORTER:
        return Query(f"batchscope_diagnosis{{{selector}{source.series}}} == 1", "{{state}}")
    by = ", ".join(config["instance_labels"])
    named = [
        (rules.BUDGET_SATURATED_RULE, "budget_saturated"),
        (rules.MEMORY_BOUND_RULE, "memory_bound"),
        (rules.STALLED_RULE, "stalled"),
    ]
    parts = [
        f'label_replace(max by ({by}) ({name}{{{selector}}}) == 1, "state", "{state}", "", "")'
        for name, state in named
    ]
    return Query("\nor ".join(parts), "{{state}}")


def _latency_quantiles(selector: str) -> list[Query]:
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
        )  # fmt: skip
    ]


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
        _series_panel(
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
            _series_panel(
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
    waiting = _series_panel(
        "Waiting",
        "Requests waiting for a batch slot (vllm:num_requests_waiting, plus V0's swapped). "
        "Waiting with running near the cap: the server is full. Waiting with running well "
        "under the cap: memory or another limit holds the batch back.",
        "short",
        Query(f"{source.waiting}{{{series}}}", "waiting {{model_name}}"),
    ).min(0)
    preemptions = _series_panel(
        "Preemptions per second",
        "Rate of vllm:num_preemptions_total over the window (a restart is not a negative "
        "rate). When the KV cache fills, the scheduler pulls a running request out and "
        "requeues it. Climbing at a load the server used to handle: it is short of memory.",
        "ops",
        Query(f"{source.preemptions}{{{series}}}", "{{model_name}}"),
    ).min(0)
    kv = (
        threshold_lines(
            _series_panel(
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
    budget = _budget_panel(
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
            "One state at a time, first match wins: budget_saturated, memory_bound (waiting "
            "under the cap with KV full or preemptions), stalled (waiting, room in the "
            "batch and the cache, yet no tokens), healthy (running near the cap), "
            "batch_limited, underloaded, idle, down. docs/metrics.md explains each."
            + ("" if source is EXPORTER else " From the rules: the alerting conditions only.")
        )
        .targets(targets([_states(source, sel, config)]))
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
            _series_panel(
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
        static = _series_panel(
            "Mean output length",
            "Mean generated tokens per request over the window. The static-utilisation "
            "estimate needs E[max of B lengths] from the bucket edges, which PromQL cannot "
            "read as numbers: the exporter's dashboard shows it.",
            "short",
            Query(f"{rules.OUTPUT_TOKENS_MEAN}{{{sel}}}", "{{model_name}}"),
        )
    advice_rows = [[(_kv_advice_panel(series, cap), 12), (_advice_table(series), 12)]]
    latency = _series_panel(
        "Latency quantiles",
        "p99 of end-to-end latency, time to first token and queue time over "
        "$__rate_interval, per engine. When queue time is most of the end-to-end latency, "
        "requests wait for a slot rather than compute.",
        "s",
        *_latency_quantiles(sel),
    ).min(0)
    throughput = _series_panel(
        "Throughput",
        "Generated tokens per second. If it drops exactly when output lengths spread out, "
        "something in the stack still keeps finished requests in the batch.",
        "short",
        Query(f"{source.generation_tokens}{{{series}}}", "tokens/s {{model_name}}"),
    ).min(0)
    return _dashboard(
        f"batchscope-vllm-{source.key}",
        f"batchscope / vLLM batching ({source.title})",
        "Is continuous batching doing its job on this vLLM, and if not, what limits it? "
        f"Filled from the {source.title}.",
        config,
        _variables(source, multi_target=False),
        [
            [(running, 12), (waiting, 12)],
            [(ratio, 12), (kv, 12)],
            [(budget, 12), (preemptions, 12)],
            [(diagnosis, 24)],
            [(lengths, 12), (static, 12)],
            [(latency, 12), (throughput, 12)],
            *(advice_rows if source is EXPORTER else []),
        ],
    )


def _kv_advice_panel(series: str, cap: Query):
    """What the KV cache holds at today's lengths against the cap and the running batch."""
    return (
        _series_panel(
            "Advice: requests the KV cache holds vs the cap",
            "Sustainable concurrency: KV capacity (vllm:cache_config_info) over the tokens a "
            "running request holds (measured over the window, else from the prompt and output "
            "length mix). Below the cap (dashed) while requests wait: raising --max-num-seqs "
            "cannot help, the KV cache needs cap x tokens per request (the advice's "
            "kv_tokens_for_cap). Above it while requests wait at the cap: raising the cap helps "
            "up to this line. /api/v1/advice has the sentence and the inputs.",
            "short",
            Query(f'batchscope_advice_value{{kind="sustainable_concurrency", {series}}}',
                  "KV cache holds {{model_name}}"),
            cap,
            Query(f"batchscope_running_requests{{{series}}}", "running {{model_name}}"),
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )  # fmt: skip


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
            targets([Query(f"batchscope_advice_value{{{series}}}", instant=True,
                           format=PromQueryFormat.TABLE)])
        )
    )  # fmt: skip


# ---------------------------------------------------------------- fleet overview


def fleet_overview(source: Source, config: Mapping) -> dict:
    threshold = config["saturation_threshold"]
    if source is EXPORTER:
        total = total_selector(config, 'target=~"$target"')

        def per_target(name: str) -> str:
            return f"max by (target) ({name}{total})"

        states = Query(f"batchscope_diagnosis{total} == 1", instant=True,
                       format=PromQueryFormat.TABLE)  # fmt: skip
        down = f"count({source.up}{total} == 0) or vector(0)"
    else:
        selector = '{target=~"$target"}'

        def per_target(name: str) -> str:
            return f"max by (target) ({name}{selector})"

        conditions = _states(source, 'target=~"$target"', config).expr
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
        )  # fmt: skip
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
        )  # fmt: skip
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
        _series_panel(
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
    waiting = _series_panel(
        "Waiting per target",
        "Requests waiting for a batch slot per target; the fleet total beside.",
        "short",
        Query(f"sum by (target) ({source.waiting}{_target_filter(source, config)})", "{{target}}"),
        Query(f"sum({source.waiting}{_target_filter(source, config)})", "fleet total"),
    ).min(0)
    utilization = (
        threshold_lines(
            _series_panel(
                "Budget utilisation per target",
                "Latency quantile over budget per target, over time.",
                "percentunit",
                Query(per_target(source.utilization), "{{target}}"),
            )
        )
        .thresholds(thresholds((None, "green"), (threshold, "red")))
        .min(0)
    )
    saturation = _series_panel(
        "Saturation per target",
        "1 while a target's budget utilisation has stayed at or over the threshold for a minute.",
        "bool",
        Query(per_target(source.saturated), "{{target}}"),
    ).min(0)
    return _dashboard(
        f"batchscope-fleet-{source.key}",
        f"batchscope / fleet overview ({source.title})",
        f"Every target's batching at a glance, worst first. Filled from the {source.title}.",
        config,
        _variables(source, multi_target=True)[:2],
        [
            [(saturated, 6), (down_stat, 6), (worst_first, 12)],
            [(state_table, 24)],
            [(ratio, 12), (waiting, 12)],
            [(utilization, 12), (saturation, 12)],
        ],
    )


def _target_filter(source: Source, config: Mapping) -> str:
    if source is EXPORTER:
        return total_selector(config, 'target=~"$target"')
    return '{target=~"$target"}'


# ---------------------------------------------------------------- in-house batcher


def inhouse_batcher(config: Mapping) -> dict:
    threshold = config["saturation_threshold"]
    # A batcher is named by its code (BatcherMetrics("name")): its raw series, scraped by
    # Prometheus, and the exporter's series about it meet on that name.
    sel = 'batcher="$batcher"'
    sizes = (
        heatmap.Panel()
        .title("Batch size distribution")
        .description(
            "How many items each fired batch held (batchscope_batcher_batch_size). Batches "
            "that never fill under load mean the batcher fires on its timer: every request "
            "pays the max wait for a small batch."
        )
        .targets(
            targets(
                [
                    Query(
                        "sum by (le) (increase(batchscope_batcher_batch_size_bucket"
                        f"{{{sel}}}[$__rate_interval]))",
                        "{{le}}",
                        format=PromQueryFormat.HEATMAP,
                    )
                ]
            )
        )
        .calculate(False)
    )
    queue_wait = _series_panel(
        "Queue wait",
        "Time a request waited for its batch to fire, p50 and p99. Every millisecond of "
        "waiting lands on the latency of the first request in.",
        "s",
        *[
            Query(
                f"histogram_quantile({q}, sum by (le, target, batcher) "
                f"(rate(batchscope_batcher_queue_wait_seconds_bucket{{{sel}}}[$__rate_interval])))",
                f"p{int(q * 100)} {{{{instance}}}}",
            )
            for q in (0.5, 0.99)
        ],
    ).min(0)
    budget = _budget_panel(
        "How close batches run to the latency budget (the window's p99 over the batcher's "
        f"budget). At {threshold:.0%} for more than a minute the budget is too tight for the "
        "traffic and throughput is being left on the table.",
        Query(f"batchscope_budget_utilization_ratio{{{sel}}}", "utilisation {{target}}"),
        Query(f"batchscope_budget_saturated{{{sel}}}", "saturated {{target}}"),
        threshold,
    )
    triggers = (
        _series_panel(
            "What fired each batch",
            "Batches per second by trigger: full (the batch reached its max size), timeout "
            "(the max wait ran out) or budget (the latency budget would be exceeded). Mostly "
            "timeout under load: shorten max_wait or let a latency target decide.",
            "ops",
            Query(
                f"sum by (trigger) (rate(batchscope_batcher_batches_total{{{sel}}}"
                "[$__rate_interval]))",
                "{{trigger}}",
            ),
        )
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
        .min(0)
    )
    gain = _series_panel(
        "Throughput gain vs unbatched",
        "Items per second of execution at the observed batch sizes over items per second "
        "at batch size 1. An encoder on a GPU can gain tens of times; on a CPU whose cost "
        "grows linearly with batch size, batching barely helps.",
        "x",
        Query(f"batchscope_throughput_gain_ratio{{{sel}}}", "{{target}}"),
    ).min(0)
    mean_size = (
        _series_panel(
            "Mean batch size vs max",
            "Mean executed batch size over the window against the batcher's max batch size.",
            "short",
            Query(f"batchscope_mean_batch_size{{{sel}}}", "mean {{target}}"),
            Query(f"batchscope_batch_cap{{{sel}}}", "max {{target}}"),
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )
    return _dashboard(
        "batchscope-inhouse",
        "batchscope / in-house batcher",
        "Dynamic batching in an in-house batcher (exporter.instrumentation): batch sizes, "
        "queue wait, budget utilisation, what fired each batch and the gain over unbatched.",
        config,
        [
            datasource_variable(),
            query_variable(
                "batcher",
                "Batcher",
                "label_values(batchscope_batcher_queue_depth, batcher)",
                multi=False,
                include_all=False,
            ),
        ],
        [
            [(sizes, 12), (queue_wait, 12)],
            [(budget, 12), (triggers, 12)],
            [(gain, 12), (mean_size, 12)],
        ],
    )


DASHBOARDS: dict[str, Callable[[Mapping], dict]] = {
    "fleet-overview": lambda config: fleet_overview(EXPORTER, config),
    "fleet-overview-rules": lambda config: fleet_overview(RULES, config),
    "vllm-batching": lambda config: vllm_batching(EXPORTER, config),
    "vllm-batching-rules": lambda config: vllm_batching(RULES, config),
    "inhouse-batcher": inhouse_batcher,
}
