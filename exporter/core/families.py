"""The metric families of the exporter's /metrics that carry labels of their own, and
the target's: declared here, attached to their signals in `exporter.core.catalog`,
written by `exporter.serve.exposition`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One metric family of /metrics: its name (a counter's without `_total`), help, type,
    and the labels the exporter sets on it besides `target` and a series' key labels
    (`exporter.config.reserved_labels` reserves them all)."""

    name: str
    documentation: str
    type: str = "gauge"
    labels: tuple[str, ...] = ()

    def header(self) -> str:
        """Its `# HELP` and `# TYPE` lines, as generate_latest writes them."""
        name = self.name + "_total" if self.type == "counter" else self.name
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {help_text}\n# TYPE {name} {self.type}\n"


LATENCY = Family(
    "batchscope_latency_seconds",
    "Latency quantile over the window, from the configured histogram's deltas.",
    labels=("quantile", "histogram"),
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

TARGET_UP = Family("batchscope_target_up", "1 when the last scrape of the target succeeded.")
SCRAPE_DURATION = Family("batchscope_scrape_duration_seconds", "Duration of the last scrape.")
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

# The `bound` label of an estimate with bounds.
BOUNDS = ("estimate", "lower", "upper")

# A model's replica count (exporter/core/replicas.py): one sample a model, labelled
# `model_name` alone (no `target`: a model's replicas span targets).
DESIRED_REPLICAS = Family(
    "batchscope_desired_replicas",
    "Replicas the model needs, held against flapping (up after the saturation hold, down "
    "after the scale-down window), within its min and max; absent while unknown or stale.",
    labels=("model_name",),
)
NEEDED_REPLICAS = Family(
    "batchscope_needed_replicas",
    "Replicas the model needs now, before the hold: its demand over a replica's capacity "
    "within the budget, rounded up and bounded (the recording rules' count).",
    labels=("model_name",),
)
CURRENT_REPLICAS = Family(
    "batchscope_replicas",
    "Replicas serving the model now: its targets, or vLLM data-parallel engine series.",
    labels=("model_name",),
)
MODEL_DEMAND = Family(
    "batchscope_model_demand_per_second",
    "The model's demand over the window: requests finished, refused at admission, and the "
    "growth of those running and waiting, per second, over its replicas.",
    labels=("model_name",),
)
REPLICA_CAPACITY = Family(
    "batchscope_replica_capacity",
    "Requests per second one replica of the model serves within the latency budget at its "
    "binding limit (limit label, as batchscope_binding_limit names it).",
    labels=("model_name", "limit"),
)
REPLICAS_STALE = Family(
    "batchscope_desired_replicas_stale",
    "1 while no replica of the model has been read for longer than the staleness: "
    "batchscope_desired_replicas is absent then.",
    labels=("model_name",),
)
MODEL_FAMILIES = (
    DESIRED_REPLICAS,
    NEEDED_REPLICAS,
    CURRENT_REPLICAS,
    MODEL_DEMAND,
    REPLICA_CAPACITY,
    REPLICAS_STALE,
)
