"""The in-house batcher dashboard: batch sizes, queue wait, budget and triggers of one batcher.

A batcher is named by its code (BatcherMetrics("name")): its raw series, scraped by
Prometheus, and the exporter's series about it meet on that name.
"""

from __future__ import annotations

from collections.abc import Mapping

from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from batchscope.grafana.boards.common import budget_spec, build_dashboard
from batchscope.grafana.panels import (
    HEATMAP,
    TIMESERIES,
    PanelSpec,
    Query,
    datasource_variable,
    query_variable,
)

SEL = 'batcher="$batcher"'

QUERIES = {
    "sizes": Query(
        f"sum by (le) (increase(batchscope_batcher_batch_size_bucket{{{SEL}}}[$__rate_interval]))",
        "{{le}}",
        format=PromQueryFormat.HEATMAP,
    ),
    **{
        f"wait p{int(q * 100)}": Query(
            f"histogram_quantile({q}, sum by (le, target, batcher) "
            f"(rate(batchscope_batcher_queue_wait_seconds_bucket{{{SEL}}}[$__rate_interval])))",
            f"p{int(q * 100)} {{{{instance}}}}",
        )
        for q in (0.5, 0.99)
    },
    "triggers": Query(
        f"sum by (trigger) (rate(batchscope_batcher_batches_total{{{SEL}}}[$__rate_interval]))",
        "{{trigger}}",
    ),
    "utilization": Query(f"batchscope_budget_utilization_ratio{{{SEL}}}", "utilisation {{target}}"),
    "saturated": Query(f"batchscope_budget_saturated{{{SEL}}}", "saturated {{target}}"),
    "gain": Query(f"batchscope_throughput_gain_ratio{{{SEL}}}", "{{target}}"),
    "mean": Query(f"batchscope_mean_batch_size{{{SEL}}}", "mean {{target}}"),
    "max": Query(f"batchscope_batch_cap{{{SEL}}}", "max {{target}}"),
}

ROWS = (
    (
        PanelSpec(
            HEATMAP,
            "Batch size distribution",
            "How many items each fired batch held (batchscope_batcher_batch_size). Batches "
            "that never fill under load mean the batcher fires on its timer: every request "
            "pays the max wait for a small batch.",
            ("sizes",),
        ),
        PanelSpec(
            TIMESERIES,
            "Queue wait",
            "Time a request waited for its batch to fire, p50 and p99. Every millisecond of "
            "waiting lands on the latency of the first request in.",
            ("wait p50", "wait p99"),
            unit="s",
            min=0,
        ),
    ),
    (
        budget_spec(
            "How close batches run to the latency budget (the window's p99 over the batcher's "
            "budget). At {saturation_threshold:.0%} for more than a minute the budget is too "
            "tight for the traffic and throughput is being left on the table."
        ),
        PanelSpec(
            TIMESERIES,
            "What fired each batch",
            "Batches per second by trigger: full (the batch reached its max size), timeout "
            "(the max wait ran out) or budget (the latency budget would be exceeded). Mostly "
            "timeout under load: shorten max_wait or let a latency target decide.",
            ("triggers",),
            unit="ops",
            min=0,
            stacked=True,
        ),
    ),
    (
        PanelSpec(
            TIMESERIES,
            "Throughput gain vs unbatched",
            "Items per second of execution at the observed batch sizes over items per second "
            "at batch size 1. An encoder on a GPU can gain tens of times; on a CPU whose cost "
            "grows linearly with batch size, batching barely helps.",
            ("gain",),
            unit="x",
            min=0,
        ),
        PanelSpec(
            TIMESERIES,
            "Mean batch size vs max",
            "Mean executed batch size over the window against the batcher's max batch size.",
            ("mean", "max"),
            unit="short",
            min=0,
            dashed="B",
        ),
    ),
)


def inhouse_batcher(config: Mapping) -> dict:
    rows = [[spec.resolved(QUERIES, config) for spec in row] for row in ROWS]
    return build_dashboard(
        "batchscope-inhouse",
        "batchscope / in-house batcher",
        "Dynamic batching in an in-house batcher (batchscope.exporter.instrumentation): batch "
        "sizes, queue wait, budget utilisation, what fired each batch and the gain over "
        "unbatched.",
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
        rows,
    )
