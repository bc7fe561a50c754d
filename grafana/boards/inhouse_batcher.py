"""The in-house batcher dashboard: batch sizes, queue wait, budget and triggers of one batcher."""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.grafana.boards.common import (
    budget_panel,
    build_dashboard,
    series_panel,
)
from batchscope.grafana.panels import (
    Query,
    dashed_line,
    datasource_variable,
    query_variable,
    targets,
)


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
    queue_wait = series_panel(
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
    budget = budget_panel(
        "How close batches run to the latency budget (the window's p99 over the batcher's "
        f"budget). At {threshold:.0%} for more than a minute the budget is too tight for the "
        "traffic and throughput is being left on the table.",
        Query(f"batchscope_budget_utilization_ratio{{{sel}}}", "utilisation {{target}}"),
        Query(f"batchscope_budget_saturated{{{sel}}}", "saturated {{target}}"),
        threshold,
    )
    triggers = (
        series_panel(
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
    gain = series_panel(
        "Throughput gain vs unbatched",
        "Items per second of execution at the observed batch sizes over items per second "
        "at batch size 1. An encoder on a GPU can gain tens of times; on a CPU whose cost "
        "grows linearly with batch size, batching barely helps.",
        "x",
        Query(f"batchscope_throughput_gain_ratio{{{sel}}}", "{{target}}"),
    ).min(0)
    mean_size = (
        series_panel(
            "Mean batch size vs max",
            "Mean executed batch size over the window against the batcher's max batch size.",
            "short",
            Query(f"batchscope_mean_batch_size{{{sel}}}", "mean {{target}}"),
            Query(f"batchscope_batch_cap{{{sel}}}", "max {{target}}"),
        )
        .override_by_query(*dashed_line("B"))
        .min(0)
    )
    return build_dashboard(
        "batchscope-inhouse",
        "batchscope / in-house batcher",
        "Dynamic batching in an in-house batcher (batchscope.exporter.instrumentation): batch sizes, "
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
