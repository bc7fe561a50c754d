"""The demo server's /metrics: vLLM's names, types, help texts and buckets, plus its own truth.

For what the demo server has, the series look exactly as vLLM 0.32 (V1 engine) writes
them (`tests/fixtures/vllm-0.32.0-cpu-load.txt`), labelled `model_name` and `engine="0"`,
so the exporter reads this server as it reads vLLM. Beside them, `batchscope_demo_*`
series expose what vLLM cannot: the true slot utilisation, the batch cap, the batching
mode and the device (and whether it is simulated), so tests can hold the exporter's
estimates against the truth.

Per-request histograms are observed when a request finishes (`VllmRequestMetrics`, a
scheduler listener); gauges and counters of scheduler state are read from the scheduler
at scrape time (`SchedulerCollector`), so state lives in the scheduler, not in metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchscope.demo_server.devices import Device
from batchscope.demo_server.generation.listeners import StepRecord
from batchscope.demo_server.generation.requests import CompletionResult
from batchscope.demo_server.generation.scheduler import Scheduler, SchedulerStats
from batchscope.exporter.engines.vllm import (
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
)

ENGINE = "0"
# The labels of every series of the scheduler (and vLLM's), in this order.
LABELS = ["engine", "model_name"]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def one_two_five_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's `build_1_2_5_buckets(max_model_len)`)."""
    buckets = []
    exponent = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * exponent
            if value > limit:
                return tuple(buckets)
            buckets.append(value)
        exponent *= 10


def iteration_token_buckets(max_tokens_per_step: int) -> tuple[int, ...]:
    """1, 8, 16, 32, ... up to the most tokens a step can hold (vLLM's cudagraph sizes)."""
    buckets = [1]
    value = 8
    while value <= max_tokens_per_step:
        buckets.append(value)
        value *= 2
    return tuple(buckets)


# vLLM's per-request histograms, in its order: name, help, buckets (`_buckets`), and the
# values one finished request adds (none where it has no such time).
REQUEST_HISTOGRAMS: tuple[
    tuple[str, str, str, Callable[[CompletionResult], Sequence[float]]], ...
] = (
    (
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        "tokens",
        lambda r: [r.prompt_tokens],
    ),
    (
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        "tokens",
        lambda r: [r.output_tokens],
    ),
    (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "tokens",
        lambda r: [r.max_tokens],
    ),
    (
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        "tokens",
        lambda r: [r.max_tokens],
    ),
    (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        "ttft",
        lambda r: [] if r.ttft is None else [r.ttft],
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        "token_latency",
        lambda r: r.token_gaps,
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        "token_latency",
        lambda r: (
            [r.decode_time / len(r.token_gaps)]
            if r.token_gaps and r.decode_time is not None
            else []
        ),
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        "request_latency",
        lambda r: [r.latency],
    ),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        "request_latency",
        lambda r: [r.queue_time],
    ),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        "request_latency",
        lambda r: [r.prefill_time + r.decode_time] if _phases_timed(r) else [],
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        "request_latency",
        lambda r: [r.prefill_time] if _phases_timed(r) else [],
    ),
    (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        "request_latency",
        lambda r: [r.decode_time] if _phases_timed(r) else [],
    ),
    (
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        "preemptions",
        lambda r: [r.preemptions],
    ),
)


def _phases_timed(result: CompletionResult) -> bool:
    """Whether the request reached its first token, so its prefill and decode are timed."""
    return result.prefill_time is not None and result.decode_time is not None


def _buckets(kind: str, max_model_len: int) -> tuple[float, ...]:
    """A histogram's buckets as vLLM sizes them (token counts by the model's length)."""
    return {
        "tokens": one_two_five_buckets(max_model_len),
        "ttft": TTFT_BUCKETS,
        "token_latency": TOKEN_LATENCY_BUCKETS,
        "request_latency": REQUEST_LATENCY_BUCKETS,
        "preemptions": PREEMPTION_BUCKETS,
    }[kind]


class VllmRequestMetrics:
    """vLLM's per-request series, observed as requests finish (a SchedulerListener)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        labels = ["engine", "model_name"]
        self._labels = (ENGINE, model_name)
        self._model_name = model_name
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=registry,
        )
        for reason in FINISHED_REASONS:
            self.success.labels(ENGINE, reason, model_name)
        self._histograms = [
            (
                Histogram(
                    name, doc, labels, buckets=_buckets(kind, max_model_len), registry=registry
                ),
                observed,
            )
            for name, doc, kind, observed in REQUEST_HISTOGRAMS
        ]
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels,
            # vLLM sizes these to its per-step token budget; 16 full-length sequences here.
            buckets=iteration_token_buckets(max_model_len * 16),
            registry=registry,
        )

    def on_step(self, step: StepRecord) -> None:
        """Observe one step's tokens as vLLM 0.32 counts them: only a step that produced a
        token, with its generated tokens plus the whole prompts of the requests whose
        prefill finished in it (a chunked prompt is credited to its last chunk's step;
        exporter/engines/vllm.py)."""
        if step.generated:
            tokens = step.generated + step.prompt_tokens_finished
            self.iteration_tokens.labels(*self._labels).observe(tokens)

    def on_finished(self, result: CompletionResult) -> None:
        """Observe one finished request, as vLLM does when a request leaves the engine."""
        self.success.labels(ENGINE, result.finish_reason, self._model_name).inc()
        for histogram, observed in self._histograms:
            values = observed(result)
            if values:  # a series appears with its first value
                child = histogram.labels(*self._labels)
                for value in values:
                    child.observe(value)


class SchedulerCollector(Collector):
    """Scheduler state and counters, read at scrape time: vLLM's gauges and counters plus
    the `batchscope_demo_*` truth series."""

    def __init__(self, scheduler: Scheduler, device: Device, model_name: str) -> None:
        self._scheduler = scheduler
        self._device = device
        self._model_name = model_name
        self._created = time.time()

    def collect(self) -> Iterator[Metric]:
        stats = self._scheduler.stats()
        yield from self._vllm_families(stats)
        yield from self._truth_families(stats)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric([ENGINE, self._model_name], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric([ENGINE, self._model_name], value, created=self._created)
        return family

    def _vllm_families(self, stats: SchedulerStats) -> Iterator[Metric]:
        """The gauges and counters vLLM exposes, under its names and help texts."""
        values = [ENGINE, self._model_name]
        gauge, counter = self._gauge, self._counter
        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            stats.running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            stats.waiting,
        )
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals "
            "vllm:num_requests_waiting.",
            labels=[*LABELS, "reason"],
        )
        by_reason.add_metric([*values, "capacity"], stats.waiting)
        by_reason.add_metric([*values, "deferred"], 0.0)
        yield by_reason
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_cache_usage,
        )
        yield counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            stats.preemptions,
        )
        yield counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            stats.prompt_tokens_computed,
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens,
        )
        cache_config = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "enable_prefix_caching", "engine", "kv_cache_size_tokens"],
        )
        cache_config.add_metric(["1", "False", ENGINE, str(stats.kv_cache_tokens)], 1.0)
        yield cache_config

    def _truth_families(self, stats: SchedulerStats) -> Iterator[Metric]:
        """The `batchscope_demo_*` series: what vLLM cannot say (configuration, device,
        the limit that bound each step, true slot utilisation)."""
        gauge, counter = self._gauge, self._counter
        yield gauge(
            "batchscope_demo_max_num_seqs",
            "Configured cap on requests in the generation batch (vLLM's --max-num-seqs).",
            stats.max_num_seqs,
        )
        batching = GaugeMetricFamily(
            "batchscope_demo_batching_info",
            "Generation batching mode of the demo server: static or continuous.",
            labels=[*LABELS, "batching"],
        )
        batching.add_metric([ENGINE, self._model_name, stats.batching], 1.0)
        yield batching
        device = GaugeMetricFamily(
            "batchscope_demo_device_info",
            "Device the demo server's models run on; simulated=true means a CPU paced to a "
            "measured GPU cost curve, not real GPU hardware.",
            labels=["device", "simulated"],
        )
        device.add_metric([self._device.name, str(self._device.simulated).lower()], 1.0)
        yield device
        yield counter(
            "batchscope_demo_steps",
            "Generation steps that ran with at least one request in the batch.",
            stats.steps,
        )
        yield counter(
            "batchscope_demo_scheduled_tokens",
            "Tokens the steps carried: one per request that produced a token, plus the "
            "context tokens computed (prefill chunks included). vLLM does not expose this.",
            stats.scheduled_tokens,
        )
        yield self._binding_family(stats)
        if stats.max_num_batched_tokens is not None:
            yield gauge(
                "batchscope_demo_max_num_batched_tokens",
                "Configured tokens one step may carry (vLLM's --max-num-batched-tokens).",
                stats.max_num_batched_tokens,
            )
        yield counter(
            "batchscope_demo_slot_steps",
            "Batch slots paid for: max_num_seqs per busy step.",
            stats.slot_steps,
        )
        yield counter(
            "batchscope_demo_useful_slot_steps",
            "Slot-steps in which a request produced a token.",
            stats.useful_slot_steps,
        )
        yield counter(
            "batchscope_demo_idle_slot_steps_while_waiting",
            "Free or finished-but-held slot-steps in steps that ran while requests waited.",
            stats.idle_slot_steps_while_waiting,
        )
        if stats.slot_utilization is not None:
            yield gauge(
                "batchscope_demo_slot_utilization_ratio",
                "True slot utilisation since start: useful slot-steps / slot-steps over busy "
                "steps.",
                stats.slot_utilization,
            )
        if self._device.simulated:
            yield self._overruns_family()

    def _binding_family(self, stats: SchedulerStats) -> CounterMetricFamily:
        bound = CounterMetricFamily(
            "batchscope_demo_binding_steps",
            "Steps by the limit that kept the batch from growing: requests (no free slot "
            "while requests wait, or every slot taken), kv_cache (a preemption, or the next "
            "request does not fit), token_budget (no token of the step's budget left, or a "
            "prefill chunked), arrivals (nothing waits). The truth the exporter's binding "
            "limit is held to.",
            labels=[*LABELS, "limit"],
        )
        for limit in ("requests", "kv_cache", "token_budget", "arrivals"):
            bound.add_metric(
                [ENGINE, self._model_name, limit],
                stats.steps_bound_by.get(limit, 0),
                created=self._created,
            )
        return bound

    def _overruns_family(self) -> CounterMetricFamily:
        overruns = CounterMetricFamily(
            "batchscope_demo_simulated_overruns",
            "Forwards whose real CPU compute exceeded the simulated device cost (the "
            "simulation ran slower than the device it imitates).",
            labels=["kind"],
        )
        for kind, count in self._device.overruns.items():
            overruns.add_metric([kind], count, created=self._created)
        return overruns
