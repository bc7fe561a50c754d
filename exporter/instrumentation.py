"""Counters for an in-house batcher, exposed with prometheus-client.

Any Python batcher imports this module, makes one `BatcherMetrics` per batcher and
calls it at the few points that matter (enqueue, batch fired, request done). The
exporter's `inhouse` engine adapter reads the same names back; `docs/metrics.md`
documents them. Every series carries the label `batcher` (the batcher's name).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Summary

PREFIX = "batchscope_batcher_"

QUEUE_DEPTH = PREFIX + "queue_depth"
BATCH_SIZE = PREFIX + "batch_size"
QUEUE_WAIT = PREFIX + "queue_wait_seconds"
REQUEST_LATENCY = PREFIX + "request_latency_seconds"
EXECUTION = PREFIX + "execution_seconds"
BATCH_EXECUTION_BY_SIZE = PREFIX + "batch_execution_seconds"
REQUESTS = PREFIX + "requests"
REJECTED = PREFIX + "rejected_requests"
BATCH_TOKENS = PREFIX + "batch_tokens"
PADDING_AVOIDED = PREFIX + "padding_avoided_tokens"
BATCHES = PREFIX + "batches"
MAX_BATCH_SIZE = PREFIX + "max_batch_size"
MAX_WAIT = PREFIX + "max_wait_seconds"
LATENCY_BUDGET = PREFIX + "latency_budget_seconds"

OUTCOMES = ("ok", "error", "rejected", "cancelled")
TRIGGERS = ("full", "timeout", "budget")
REJECT_REASONS = ("queue_full", "budget", "stopping")

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)


class BatcherMetrics:
    """The metrics of one batcher, registered in `registry` (the default one unless given).

    `latency_buckets`: the upper bounds of the request latency and queue wait histograms
    (LATENCY_BUCKETS by default). A bucket edge at the latency budget makes the exporter's
    SLO attainment exact rather than bounded between the edges around it.
    """

    def __init__(
        self,
        batcher: str,
        *,
        max_batch_size: int,
        max_wait_seconds: float | None = None,
        latency_budget_seconds: float | None = None,
        registry: CollectorRegistry = REGISTRY,
        latency_buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        self.batcher = batcher
        (
            self._queue_depth,
            self._batch_size,
            self._queue_wait,
            self._latency,
            self._execution,
            self._execution_by_size,
            self._requests,
            self._rejected,
            self._batch_tokens,
            self._padding_avoided,
            self._batches,
            self._max_batch_size,
            self._max_wait,
            self._budget,
        ) = _metrics(registry, latency_buckets)
        # Every series exists from the start (a rate over a window needs its zero), and
        # the hot path keeps its children: a labels() lookup per request costs more
        # than the observation itself.
        self._by_outcome = {o: self._requests.labels(batcher, o) for o in OUTCOMES}
        self._by_trigger = {t: self._batches.labels(batcher, t) for t in TRIGGERS}
        self._by_reason = {r: self._rejected.labels(batcher, r) for r in REJECT_REASONS}
        self._real_tokens = self._batch_tokens.labels(batcher, "real")
        self._padding_tokens = self._batch_tokens.labels(batcher, "padding")
        self._avoided = self._padding_avoided.labels(batcher)
        self._depth = self._queue_depth.labels(batcher)
        self._depth.set(0)
        self._size_child = self._batch_size.labels(batcher)
        self._execution_child = self._execution.labels(batcher)
        self._queue_wait_child = self._queue_wait.labels(batcher)
        self._latency_child = self._latency.labels(batcher)
        self.set_config(
            max_batch_size=max_batch_size,
            max_wait_seconds=max_wait_seconds,
            latency_budget_seconds=latency_budget_seconds,
        )

    def set_config(
        self,
        *,
        max_batch_size: int | None = None,
        max_wait_seconds: float | None = None,
        latency_budget_seconds: float | None = None,
    ) -> None:
        """Publish the batcher's configuration; None leaves a setting as it is."""
        if max_batch_size is not None:
            self._max_batch_size.labels(self.batcher).set(max_batch_size)
        if max_wait_seconds is not None:
            self._max_wait.labels(self.batcher).set(max_wait_seconds)
        if latency_budget_seconds is not None:
            self._budget.labels(self.batcher).set(latency_budget_seconds)

    def set_queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def observe_batch(self, size: int, trigger: str, execution_seconds: float) -> None:
        """Record one fired batch: its size, what fired it, and how long it ran."""
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {trigger!r}")
        self._size_child.observe(size)
        self._by_trigger[trigger].inc()
        self._execution_child.observe(execution_seconds)
        self._execution_by_size.labels(self.batcher, str(size)).observe(execution_seconds)

    def observe_padding(self, *, tokens: int, padding: int, avoided: int) -> None:
        """Record one fired batch's real tokens, the padding it carried, and the padding
        that grouping by length avoided."""
        self._real_tokens.inc(tokens)
        self._padding_tokens.inc(padding)
        self._avoided.inc(avoided)

    def observe_request(
        self,
        outcome: str,
        *,
        reason: str | None = None,
        queue_wait_seconds: float | None = None,
        latency_seconds: float | None = None,
    ) -> None:
        """Record one finished request and, when it ran, its queue wait and latency.
        A rejected request may name its `reason` (one of REJECT_REASONS), counted by
        reason too."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        if reason is not None and (outcome != "rejected" or reason not in REJECT_REASONS):
            raise ValueError(
                f"only a rejected request has a reason, one of {REJECT_REASONS}; "
                f"got outcome {outcome!r} with reason {reason!r}"
            )
        self._by_outcome[outcome].inc()
        if reason is not None:
            self._by_reason[reason].inc()
        if queue_wait_seconds is not None:
            self._queue_wait_child.observe(queue_wait_seconds)
        if latency_seconds is not None:
            self._latency_child.observe(latency_seconds)


def _metrics(registry: CollectorRegistry, latency_buckets: tuple[float, ...]) -> list:
    """A batcher's metric families, in the order `BatcherMetrics` keeps them."""
    label = ["batcher"]
    return [
        Gauge(QUEUE_DEPTH, "Requests waiting to join a batch.", label, registry=registry),
        Histogram(
            BATCH_SIZE,
            "Items per fired batch.",
            label,
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        ),
        Histogram(
            QUEUE_WAIT,
            "Time a request waited in the queue before its batch fired.",
            label,
            buckets=latency_buckets,
            registry=registry,
        ),
        Histogram(
            REQUEST_LATENCY,
            "Time from a request's arrival to its answer (queue wait plus execution).",
            label,
            buckets=latency_buckets,
            registry=registry,
        ),
        Histogram(
            EXECUTION,
            "Execution time of one batch.",
            label,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        Summary(
            BATCH_EXECUTION_BY_SIZE,
            "Execution time of batches by their size (for throughput gain vs batch size 1).",
            ["batcher", "batch_size"],
            registry=registry,
        ),
        Counter(
            REQUESTS,
            "Requests by outcome: ok, error, rejected, cancelled.",
            ["batcher", "outcome"],
            registry=registry,
        ),
        Counter(
            REJECTED,
            "Rejected requests by reason: queue_full, budget, stopping.",
            ["batcher", "reason"],
            registry=registry,
        ),
        Counter(
            BATCH_TOKENS,
            "Token positions in fired batches: real tokens, and padding up to each batch's "
            "longest item.",
            ["batcher", "kind"],
            registry=registry,
        ),
        Counter(
            PADDING_AVOIDED,
            "Padding tokens not paid because items of different lengths batched in "
            "separate groups (against the same number of items in arrival order).",
            label,
            registry=registry,
        ),
        Counter(
            BATCHES,
            "Batches fired, by trigger: full, timeout, budget.",
            ["batcher", "trigger"],
            registry=registry,
        ),
        Gauge(MAX_BATCH_SIZE, "Configured maximum batch size.", label, registry=registry),
        Gauge(MAX_WAIT, "Configured maximum wait before a batch fires.", label, registry=registry),
        Gauge(LATENCY_BUDGET, "Configured latency budget.", label, registry=registry),
    ]
