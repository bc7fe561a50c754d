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
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchscope.demo_server.devices import Device
from batchscope.demo_server.generation.listeners import StepRecord
from batchscope.demo_server.generation.requests import CompletionResult
from batchscope.demo_server.generation.scheduler import Scheduler
from batchscope.exporter.engines.vllm import (
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
)

ENGINE = "0"
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


class VllmRequestMetrics:
    """vLLM's per-request series, observed as requests finish (a SchedulerListener)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        labels = ["engine", "model_name"]
        self._labels = (ENGINE, model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        tokens = one_two_five_buckets(max_model_len)
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=registry,
        )
        for reason in FINISHED_REASONS:
            self.success.labels(ENGINE, reason, model_name)
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.max_tokens_param = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            # vLLM sizes these to its per-step token budget; 16 full-length sequences here.
            iteration_token_buckets(max_model_len * 16),
        )
        self._model_name = model_name

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
        labels = self._labels
        self.success.labels(ENGINE, result.finish_reason, self._model_name).inc()
        self.prompt_tokens.labels(*labels).observe(result.prompt_tokens)
        self.generation_tokens.labels(*labels).observe(result.output_tokens)
        self.max_generation_tokens.labels(*labels).observe(result.max_tokens)
        self.max_tokens_param.labels(*labels).observe(result.max_tokens)
        self.e2e.labels(*labels).observe(result.latency)
        self.queue_time.labels(*labels).observe(result.queue_time)
        self.preemptions.labels(*labels).observe(result.preemptions)
        if result.ttft is not None:
            self.ttft.labels(*labels).observe(result.ttft)
        if result.prefill_time is not None and result.decode_time is not None:
            self.prefill_time.labels(*labels).observe(result.prefill_time)
            self.decode_time.labels(*labels).observe(result.decode_time)
            self.inference_time.labels(*labels).observe(result.prefill_time + result.decode_time)
        inter_token = self.inter_token.labels(*labels)
        for gap in result.token_gaps:
            inter_token.observe(gap)
        if result.token_gaps and result.decode_time is not None:
            self.time_per_output_token.labels(*labels).observe(
                result.decode_time / len(result.token_gaps)
            )


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
        names = ["engine", "model_name"]
        values = [ENGINE, self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value, created=self._created)
            return family

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
            labels=[*names, "reason"],
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

        yield gauge(
            "batchscope_demo_max_num_seqs",
            "Configured cap on requests in the generation batch (vLLM's --max-num-seqs).",
            stats.max_num_seqs,
        )
        batching = GaugeMetricFamily(
            "batchscope_demo_batching_info",
            "Generation batching mode of the demo server: static or continuous.",
            labels=[*names, "batching"],
        )
        batching.add_metric([*values, stats.batching], 1.0)
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
        bound = CounterMetricFamily(
            "batchscope_demo_binding_steps",
            "Steps by the limit that kept the batch from growing: requests (no free slot "
            "while requests wait, or every slot taken), kv_cache (a preemption, or the next "
            "request does not fit), token_budget (no token of the step's budget left, or a "
            "prefill chunked), arrivals (nothing waits). The truth the exporter's binding "
            "limit is held to.",
            labels=[*names, "limit"],
        )
        for limit in ("requests", "kv_cache", "token_budget", "arrivals"):
            bound.add_metric(
                [*values, limit], stats.steps_bound_by.get(limit, 0), created=self._created
            )
        yield bound
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
            overruns = CounterMetricFamily(
                "batchscope_demo_simulated_overruns",
                "Forwards whose real CPU compute exceeded the simulated device cost (the "
                "simulation ran slower than the device it imitates).",
                labels=["kind"],
            )
            for kind, count in self._device.overruns.items():
                overruns.add_metric([kind], count, created=self._created)
            yield overruns
