"""The families of the exporter's /metrics: names, help, types and the labels each adds.

One list, `FAMILIES`, in the order /metrics writes them: the exporter's writer
(`batchscope.exporter.serve.exposition.render_metrics`) and the reference writer the tests hold it
to walk it, and the configuration reserves every label a family declares
(`batchscope.exporter.config.reserved_labels`).
"""

from __future__ import annotations

from dataclasses import dataclass

# (metric name, help, attribute of SeriesSignals)
SERIES_GAUGES = (
    (
        "batchscope_running_requests",
        "Requests in the running batch (vLLM num_requests_running).",
        "running",
    ),
    ("batchscope_waiting_requests", "Requests waiting for a batch slot.", "waiting"),
    ("batchscope_batch_cap", "Maximum batch size (configured cap or the batcher's own).", "cap"),
    (
        "batchscope_running_vs_cap_ratio",
        "Running batch over its cap (in-house: mean batch size over max batch size).",
        "running_vs_cap",
    ),
    (
        "batchscope_batch_tokens",
        "Tokens the running batch holds or reserves (TGI).",
        "batch_tokens",
    ),
    (
        "batchscope_token_cap",
        "Token budget of the running batch (configured token_cap).",
        "token_cap",
    ),
    ("batchscope_tokens_vs_cap_ratio", "Batch tokens over the token budget.", "tokens_vs_cap"),
    ("batchscope_mean_batch_size", "Mean executed batch size over the window.", "mean_batch_size"),
    (
        "batchscope_preemptions_per_second",
        "Preemptions per second over the window.",
        "preemptions_per_second",
    ),
    ("batchscope_kv_cache_usage_ratio", "KV cache usage, 0..1.", "kv_cache_usage"),
    (
        "batchscope_requests_per_second",
        "Finished requests per second over the window.",
        "requests_per_second",
    ),
    (
        "batchscope_generation_tokens_per_second",
        "Generated tokens per second over the window.",
        "generation_tokens_per_second",
    ),
    (
        "batchscope_budget_seconds",
        "Latency budget the utilisation is measured against.",
        "budget_seconds",
    ),
    (
        "batchscope_budget_utilization_ratio",
        "Observed latency quantile over the latency budget.",
        "budget_utilization",
    ),
    (
        "batchscope_budget_saturated_seconds",
        "Seconds the current episode at or above the saturation threshold has lasted.",
        "budget_saturated_seconds",
    ),
    (
        "batchscope_throughput_gain_ratio",
        "Items per execution-second at the observed batch sizes over that at batch size 1.",
        "throughput_gain",
    ),
    (
        "batchscope_tokens_per_step",
        "Mean tokens an engine step carried over the window (vLLM iteration_tokens).",
        "tokens_per_step",
    ),
    (
        "batchscope_token_budget",
        "Tokens one engine step may carry (configured max_num_batched_tokens).",
        "token_budget",
    ),
    (
        "batchscope_deferred_requests",
        "Waiting requests deferred by a transient constraint, not short of room (vLLM).",
        "waiting_deferred",
    ),
    (
        "batchscope_admission_rejections_per_second",
        "Requests refused at admission by a queue limit, per second over the window.",
        "rejections_per_second",
    ),
    (
        "batchscope_padding_waste_ratio",
        "Share of the token positions in fired batches that were padding (in-house batchers).",
        "padding_waste",
    ),
)


@dataclass(frozen=True)
class Family:
    """One metric family of /metrics: its name (a counter's without `_total`), help, type,
    and the labels the exporter sets on it besides `target` and a series' key labels
    (`batchscope.exporter.config.reserved_labels` reserves them all)."""

    name: str
    documentation: str
    type: str = "gauge"
    labels: tuple[str, ...] = ()

    def header(self) -> str:
        """Its `# HELP` and `# TYPE` lines, as generate_latest writes them."""
        name = self.name + "_total" if self.type == "counter" else self.name
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {help_text}\n# TYPE {name} {self.type}\n"


TARGET_UP = Family("batchscope_target_up", "1 when the last scrape of the target succeeded.")
SCRAPE_DURATION = Family("batchscope_scrape_duration_seconds", "Duration of the last scrape.")
SERIES_GAUGE_FAMILIES = tuple(Family(name, doc) for name, doc, _ in SERIES_GAUGES)
LATENCY = Family(
    "batchscope_latency_seconds",
    "Latency quantile over the window, from the configured histogram's deltas.",
    labels=("quantile", "histogram"),
)
SATURATED = Family(
    "batchscope_budget_saturated",
    "1 while budget utilisation has stayed at or above the threshold for the hold time.",
)
STATIC_UTILIZATION = Family(
    "batchscope_static_utilization_ratio",
    "Expected share of useful slot-steps if this traffic were batched statically at the "
    "cap (estimate with lower/upper bounds from the output-length histogram).",
    labels=("bound",),
)
CONTINUOUS_GAIN = Family(
    "batchscope_continuous_batching_gain_ratio",
    "What continuous batching gains over static batching on this traffic (1/estimate).",
)
DIAGNOSIS = Family(
    "batchscope_diagnosis",
    "1 for the current diagnosis state of the target or series.",
    labels=("state",),
)
LIMIT_RATIO = Family(
    "batchscope_limit_ratio",
    "Each limit on the batch, its reading over its bound (limit label: requests, kv_cache, "
    "token_budget, batch_tokens, deferred, max_wait, latency_budget).",
    labels=("limit",),
)
BINDING_LIMIT = Family(
    "batchscope_binding_limit",
    "1 for the limit that binds the batch now (arrivals: nothing waits; unexplained: "
    "requests wait and no limit the metrics show is at its bound).",
    labels=("limit",),
)
ADVICE = Family(
    "batchscope_advice_value",
    "One number of advice (kind label: what it is; /api/v1/advice has its inputs, "
    "confidence and the sentence).",
    labels=("kind",),
)
SLO_ATTAINMENT = Family(
    "batchscope_slo_attainment_ratio",
    "Share of the window's requests within the latency budget, from the latency histogram's "
    "bucket increases (bound: estimate, lower, upper; all equal when the budget is a bucket "
    "edge).",
    labels=("bound",),
)
GOODPUT = Family(
    "batchscope_goodput_requests_per_second",
    "Requests per second within the latency budget over the window (bound: estimate, lower, "
    "upper).",
    labels=("bound",),
)
SLO_OBJECTIVE = Family(
    "batchscope_slo_objective_ratio",
    "Share of requests promised within the latency budget (the target's slo_objective).",
)
SLO_BURN_RATE = Family(
    "batchscope_slo_burn_rate_ratio",
    "Error budget burn rate over each standard window (window: 5m, 30m, 1h, 6h, 3d, "
    "scaled by slo_window_scale): the share of requests over the budget over 1 - objective.",
    labels=("window",),
)
SLO_BURNING = Family(
    "batchscope_slo_burning",
    "1 while both windows of a window pair of this speed burn faster than the pair's factor "
    "(speed: fast pages, slow opens a ticket).",
    labels=("speed",),
)
SLO_ERROR_BUDGET = Family(
    "batchscope_slo_error_budget_remaining_ratio",
    "Share of the compliance period's error budget left (negative once overspent); only "
    "once the exporter's SLO history covers the period.",
)
SLO_HISTORY = Family(
    "batchscope_slo_history_seconds",
    "How far back the exporter's SLO history of the series reaches.",
)
TARGET_ERRORS = Family(
    "batchscope_target_errors",
    "Payloads of the target that could not be read or evaluated, by reason.",
    "counter",
    labels=("reason",),
)
WINDOW_RESETS = Family(
    "batchscope_window_resets",
    "Times the target's window started again, by reason (engine_changed).",
    "counter",
    labels=("reason",),
)
# The families of /metrics, in the order they are written.
FAMILIES = (
    TARGET_UP,
    SCRAPE_DURATION,
    *SERIES_GAUGE_FAMILIES,
    LATENCY,
    SATURATED,
    STATIC_UTILIZATION,
    CONTINUOUS_GAIN,
    DIAGNOSIS,
    LIMIT_RATIO,
    BINDING_LIMIT,
    ADVICE,
    SLO_ATTAINMENT,
    GOODPUT,
    SLO_OBJECTIVE,
    SLO_BURN_RATE,
    SLO_BURNING,
    SLO_ERROR_BUDGET,
    SLO_HISTORY,
    TARGET_ERRORS,
    WINDOW_RESETS,
)
BOUNDS = ("estimate", "lower", "upper")
