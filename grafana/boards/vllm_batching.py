"""The vLLM batching dashboard: one target's batch, queue, KV cache, latency budget and advice.

A table of panels (`ROWS`, by source) over the queries `vllm_queries` names; the exporter's
board adds the static-utilisation estimate and the advice, which only the exporter computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from batchscope.exporter.core.catalog import CACHES, SERIES
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from batchscope.grafana.boards.common import (
    EXPORTER,
    RULES,
    Source,
    budget_spec,
    build_dashboard,
    target_variables,
)
from batchscope.grafana.boards.slo import ENGINE_ROW
from batchscope.grafana.boards.vllm_queries import (
    PER_ENGINE,
    binding_mappings,
    state_mappings,
    vllm_queries,
)
from batchscope.grafana.panels import (
    BARGAUGE,
    HEATMAP,
    STAT,
    TABLE,
    TIMELINE,
    TIMESERIES,
    PanelSpec,
    Query,
)

RUNNING = PanelSpec(
    TIMESERIES,
    "Running vs cap",
    "Requests in the running batch (vllm:num_requests_running) against the cap "
    "(--max-num-seqs, from the target's config: vLLM does not expose it). Under real "
    "traffic the batch should sit near the cap. Far below it while requests wait: "
    "something else limits the batch, almost always KV cache memory.",
    ("running", "cap"),
    unit="short",
    min=0,
    dashed="B",
)
RATIO = PanelSpec(
    TIMESERIES,
    "Running / cap",
    "The running batch as a share of its cap. At or over {near_cap:.0%} continuous "
    "batching is doing its job and the next limit is elsewhere.",
    ("running vs cap",),
    width=8,
    unit="percentunit",
    min=0,
    steps=((None, "orange"), ("near_cap", "green")),
    lines=True,
)
WAITING = PanelSpec(
    TIMESERIES,
    "Waiting",
    "Requests waiting for a batch slot (vllm:num_requests_waiting, plus V0's swapped). "
    "Waiting with running near the cap: the server is full. Waiting with running well "
    "under the cap: memory or another limit holds the batch back.",
    ("waiting",),
    unit="short",
    min=0,
)
PREEMPTIONS = PanelSpec(
    TIMESERIES,
    "Preemptions per second",
    "Rate of vllm:num_preemptions_total over the window (a restart is not a negative "
    "rate). When the KV cache fills, the scheduler pulls a running request out and "
    "requeues it. Climbing at a load the server used to handle: it is short of memory.",
    ("preemptions",),
    width=8,
    unit="ops",
    min=0,
)
KV = PanelSpec(
    TIMESERIES,
    "KV cache usage",
    "Share of the KV cache in use (vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc "
    "before 0.9). Raise --max-num-seqs only when this has room: at {kv_high:.0%} or more, "
    "KV memory decides how many requests fit.",
    ("kv",),
    width=8,
    unit="percentunit",
    min=0,
    max=1,
    steps=((None, "green"), ("kv_high", "red")),
    lines=True,
)
LIMITS = PanelSpec(
    TIMESERIES,
    "What limits the batch: each limit against its bound",
    "Each limit vLLM applies, as a share of its bound: requests (running / "
    "--max-num-seqs), kv_cache (KV cache usage), token_budget (tokens per engine "
    "step / --max-num-batched-tokens, from the target's config: vLLM does not "
    "expose it). At or over {near_cap:.0%} a limit is at its bound. A line that "
    "is missing is a limit this engine or configuration does not let batchscope "
    "judge (no cap, no max_num_batched_tokens, an older vLLM).",
    ("limit ratios",),
    unit="percentunit",
    min=0,
    steps=((None, "green"), ("near_cap", "orange")),
    lines=True,
)
BINDING = PanelSpec(
    TIMELINE,
    "The binding limit",
    "The limit that binds the batch now, per model, first match: kv_cache (full or "
    "preempting below the cap), token_budget (steps at the token budget below the cap, KV "
    "with room), requests (at the cap: batching is doing its job), arrivals (nothing "
    "waits), deferred, unexplained (requests wait and no limit the metrics show is at its "
    "bound), none while the gauges read nothing running or waiting (idle, or requests that "
    'ran between scrapes: the diagnosis says which). docs/metrics.md, "What limits the '
    'batch".',
    ("binding",),
    width=6,
    mappings=binding_mappings(),
    show_values=True,
)
LIMITS_NOW = PanelSpec(
    BARGAUGE,
    "Each limit against its bound, now",
    "requests (running / --max-num-seqs), kv_cache (KV cache usage) and token_budget "
    "(tokens per step / --max-num-batched-tokens) as a share of their bound; orange from "
    "{near_cap:.0%}, where a limit is at its bound. A missing bar: a limit this engine or "
    "configuration does not let batchscope judge.",
    ("limit ratios now",),
    width=5,
    unit="percentunit",
    min=0,
    max=1,
    steps=((None, "green"), ("near_cap", "orange")),
)
BUDGET_USED = PanelSpec(
    STAT,
    "Budget used",
    "The window's latency quantile (p99 of end-to-end latency unless configured) over the "
    "latency budget, per model, with its trend: red from {saturation_threshold:.0%}, "
    "where a minute there is a saturated budget.",
    ("budget used",),
    width=5,
    unit="percentunit",
    steps=((None, "green"), ("saturation_threshold", "red")),
)
BUDGET = budget_spec(
    "The window's latency quantile (p99 of end-to-end latency unless configured) over "
    "the latency budget. Shaded: saturated, at or over {saturation_threshold:.0%} for a "
    "minute. That usually means the budget is too tight for the traffic and throughput is "
    "being left on the table."
)
DIAGNOSIS = PanelSpec(
    TIMELINE,
    "Diagnosis",
    "One state at a time per model, first match wins, in this order: "
    + ", ".join(DIAGNOSIS_STATES)
    + ". budget_saturated: at the threshold for the hold; stalled: waiting, room in "
    "the batch and the cache, yet no tokens; memory_bound: waiting under the cap with "
    "KV full or preemptions; token_budget_bound: waiting under the cap, steps at the "
    "token budget, KV with room; preempting: preemptions in the window; work_too_slow: "
    "over budget with nothing waiting and small batches (batching cannot help); "
    "over_budget: over budget, not yet for the hold; healthy: running near the cap. "
    "docs/metrics.md explains each.",
    ("state",),
    width=8,
    mappings=state_mappings(),
    show_values=True,
)
DIAGNOSIS_FROM_RULES = replace(
    DIAGNOSIS,
    description=DIAGNOSIS.description + " From the rules: the conditions they record (the "
    "alerting ones, and over budget); no row while none holds.",
)
LENGTHS = PanelSpec(
    HEATMAP,
    "Output length (tokens)",
    "How many tokens each finished request generated (vllm:request_generation_tokens). "
    "The wider the spread, the more a static batch wastes waiting for its longest "
    "request, and the more continuous batching gains.",
    ("lengths",),
)
STATIC = PanelSpec(
    TIMESERIES,
    "Static utilisation estimate",
    "The share of slot-steps that would do useful work if this window's traffic "
    "were batched statically at the cap: sum(lengths) / (B × max(lengths)) per "
    "group of B, from the output-length histogram, with bounds from the bucket "
    "edges. 52% means a static batcher would idle 48% of its slots; 1/estimate "
    "is what continuous batching gains.",
    ("static",),
    unit="percentunit",
    min=0,
    max=1,
)
MEAN_OUTPUT = PanelSpec(
    TIMESERIES,
    "Mean output length",
    "Mean generated tokens per request over the window. The static-utilisation "
    "estimate needs E[max of B lengths] from the bucket edges, which PromQL cannot "
    "read as numbers: the exporter's dashboard shows it.",
    ("mean output",),
    unit="short",
)
LATENCY = PanelSpec(
    TIMESERIES,
    "Latency quantiles",
    "p99 of end-to-end latency, time to first token and queue time over "
    "$__rate_interval, per engine. When queue time is most of the end-to-end latency, "
    "requests wait for a slot rather than compute.",
    ("p99 e2e", "p99 ttft", "p99 queue"),
    unit="s",
    min=0,
)
THROUGHPUT = PanelSpec(
    TIMESERIES,
    "Throughput",
    "Generated tokens per second. If it drops exactly when output lengths spread out, "
    "something in the stack still keeps finished requests in the batch.",
    ("throughput",),
    unit="short",
    min=0,
)
KV_ADVICE = PanelSpec(
    TIMESERIES,
    "Advice: requests the KV cache holds vs the cap",
    "Sustainable concurrency: KV capacity (vllm:cache_config_info) over the tokens a "
    "running request holds (measured over the window, else from the prompt and output "
    "length mix). Below the cap (dashed) while requests wait: raising --max-num-seqs "
    "cannot help, the KV cache needs cap x tokens per request (the advice's "
    "kv_tokens_for_cap). Above it while requests wait at the cap: raising the cap helps "
    "up to this line. /api/v1/advice has the sentence and the inputs.",
    ("sustainable", "cap", "running"),
    unit="short",
    min=0,
    dashed="B",
)
ADVICE = PanelSpec(
    TABLE,
    "Advice, with the numbers",
    "Every advice number now, by kind (docs/metrics.md gives each formula): KV "
    "capacity and tokens per request, sustainable concurrency, raise_cap_helps (1: a "
    "higher cap helps, 0: memory-bound, it cannot), kv_tokens_for_cap, the "
    "continuous-batching gain. docs/runbook.md says what to change.",
    ("advice",),
)

# The catalog's caches group, as the Live page shows it: one panel a signal, a row of their
# own, from the exporter's series or the recorded one (the signal's `rule`).
CACHE_SIGNALS = tuple(s for s in SERIES if s.live == CACHES)
CACHE_ROW = tuple(
    PanelSpec(
        TIMESERIES,
        s.title[:1].upper() + s.title[1:],
        s.help,
        (s.name,),
        width=24 // len(CACHE_SIGNALS),
        unit="percentunit",
        min=0,
        max=1,
    )
    for s in CACHE_SIGNALS
)


def cache_queries(source: Source) -> dict[str, Query]:
    """The caches row's queries: each signal's series, one line a model."""
    return {
        s.name: Query(
            f"{s.metric if source is EXPORTER else s.rule}{{{PER_ENGINE}{source.series}}}",
            "{{model_name}}",
        )
        for s in CACHE_SIGNALS
    }


# The first row answers the question (the state, what binds, the budget); detail below.
DETAIL = ((RUNNING, WAITING), (RATIO, KV, PREEMPTIONS), (LIMITS, BUDGET), ENGINE_ROW)
# Each source's rows, top to bottom; a panel's width is in its spec (12 unless said).
ROWS = {
    EXPORTER.key: (
        (DIAGNOSIS, BINDING, LIMITS_NOW, BUDGET_USED),
        *DETAIL,
        (LENGTHS, STATIC),
        (LATENCY, THROUGHPUT),
        CACHE_ROW,
        (KV_ADVICE, ADVICE),
    ),
    RULES.key: (
        (DIAGNOSIS_FROM_RULES, BINDING, LIMITS_NOW, BUDGET_USED),
        *DETAIL,
        (LENGTHS, MEAN_OUTPUT),
        (LATENCY, THROUGHPUT),
        CACHE_ROW,
    ),
}


def vllm_batching(source: Source, config: Mapping) -> dict:
    queries = {**vllm_queries(source, config), **cache_queries(source)}
    rows = [[spec.resolved(queries, config) for spec in row] for row in ROWS[source.key]]
    return build_dashboard(
        f"batchscope-vllm-{source.key}",
        f"batchscope / vLLM batching ({source.title})",
        "Is continuous batching doing its job on this vLLM, and if not, what limits it? "
        f"Filled from the {source.title}.",
        config,
        target_variables(source, multi_target=False),
        rows,
    )
