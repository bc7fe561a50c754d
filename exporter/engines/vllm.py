"""vLLM: V1 (0.8+, labels model_name and engine) and V0 (model_name only).

`gpu_cache_usage_perc` became `kv_cache_usage_perc` in 0.9; counters carry `_total`
with `_created` siblings. vLLM does not expose `max_num_seqs`: the cap comes from config.
`cache_config_info`
states the KV cache in its labels (an engine label, no model): `kv_cache_size_tokens`
and `kv_cache_memory_bytes` from 0.11 on, `num_gpu_blocks` and `block_size` before,
`kv_cache_max_concurrency` in 0.32.

What the limit families count, in 0.32 (read in vLLM's source and checked on the live
fixtures; docs/metrics.md, "What limits the batch"):
- `iteration_tokens_total` is observed once per engine step that returned an output
  (vllm/v1/engine/async_llm.py: no IterationStats for a step without one), with that
  step's generated tokens plus the computed (not prefix-cached) prompt tokens of every
  request whose prefill *finished* in it (vllm/v1/metrics/loggers.py). Its sum is
  `prompt_tokens_total - prompt_tokens_cached_total + generation_tokens_total` (15,152 =
  3,510 - 0 + 11,642 in tests/fixtures/vllm-0.32.0-cpu-after.txt). Under chunked prefill
  a 400-token prompt is computed over several steps and credited whole to the last, so
  the buckets say nothing about how full each step was (most steps land in the small
  buckets however full they ran); the increase of the sum over the increase of the
  count is the mean a step carried. A step that only advanced prefills returns no
  output and is not counted: such a step is one the prefills filled to the budget.
- `num_requests_waiting_by_reason{reason}` splits `num_requests_waiting` into
  `capacity` (no room: a limit binds) and `deferred` (held back by a transient
  constraint: LoRA budget, KV transfer, a blocked request).
- `admission_rejections_total{reason}` carries `model_name` only (no engine): the API
  server refuses before any engine sees the request. It is read onto the first series
  of its model, so a target total counts each refusal once.
"""

from __future__ import annotations

from batchscope.exporter.core.capacity import kv_capacity_tokens
from batchscope.exporter.core.snapshot import LabelKey, SeriesSnapshot
from batchscope.exporter.engines.grouping import (
    SamplesByName,
    added_by_key,
    histograms_by_key,
    latency_by_key,
    values_by_key,
)

NAME = "vllm"
MARKER = "vllm:"
KEY_LABELS = ("model_name", "engine")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SWAPPED = "vllm:num_requests_swapped"
PREEMPTIONS = "vllm:num_preemptions"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
REQUEST_SUCCESS = "vllm:request_success"
GENERATION_TOKENS = "vllm:generation_tokens"
OUTPUT_TOKENS = "vllm:request_generation_tokens"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
CACHE_CONFIG = "vllm:cache_config_info"
STEP_TOKENS = "vllm:iteration_tokens_total"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
REJECTIONS = "vllm:admission_rejections"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
# Only with speculative decoding configured (--speculative-config).
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
LATENCY_FAMILIES = {
    "e2e": "vllm:e2e_request_latency_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    # Per-token latencies: each request's mean time per output token (TPOT), and each
    # gap between two output tokens (ITL: its shares count gaps, not requests).
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}
TOKEN_LATENCY_KINDS = ("tpot", "itl")

# vLLM 0.32's default buckets (vllm/v1/metrics/buckets.py), as in the fixture payload; a
# server started with --custom-histogram-buckets replaces a family's.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# Each latency kind's default buckets (the bucket family vLLM names them by: slo.py).
DEFAULT_LATENCY_BUCKETS = {
    "e2e": REQUEST_LATENCY_BUCKETS,
    "queue": REQUEST_LATENCY_BUCKETS,
    "inference": REQUEST_LATENCY_BUCKETS,
    "ttft": TTFT_BUCKETS,
    "tpot": TOKEN_LATENCY_BUCKETS,
    "itl": TOKEN_LATENCY_BUCKETS,
}

FAMILIES = (
    RUNNING,
    WAITING,
    SWAPPED,
    PREEMPTIONS,
    KV_USAGE,
    KV_USAGE_OLD,
    REQUEST_SUCCESS,
    GENERATION_TOKENS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    CACHE_CONFIG,
    STEP_TOKENS,
    WAITING_BY_REASON,
    REJECTIONS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED_TOKENS,
    *LATENCY_FAMILIES.values(),
)


def _info_number(text: str | None) -> float | None:
    """A cache_config_info label as a number; None for "None", empty or non-numeric."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


# cache_config_info's labels read as numbers, by the SeriesSnapshot field each fills.
CACHE_CONFIG_NUMBERS = {
    "block_size": "block_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "kv_max_concurrency": "kv_cache_max_concurrency",
}


def cache_config_by_engine(by_name: SamplesByName) -> dict[str | None, dict[str, float | None]]:
    """The KV cache settings stated by each engine's cache_config_info (key: its `engine`
    label): capacity in tokens (stated, or blocks x block size), block size, memory."""
    out: dict[str | None, dict[str, float | None]] = {}
    for sample in by_name.get(CACHE_CONFIG, ()):
        labels = sample.labels
        config = {
            field: _info_number(labels.get(label)) for field, label in CACHE_CONFIG_NUMBERS.items()
        }
        stated = _info_number(labels.get("kv_cache_size_tokens"))
        blocks = _info_number(labels.get("num_gpu_blocks"))
        config["kv_capacity_tokens"] = kv_capacity_tokens(stated, blocks, config["block_size"])
        out[labels.get("engine")] = config
    return out


def to_series(by_name: SamplesByName) -> list[SeriesSnapshot]:
    """One SeriesSnapshot per (model_name, engine) that any scheduler metric names."""
    configs = cache_config_by_engine(by_name)
    # A series whose engine states no cache config of its own takes the only one there is.
    sole_config = next(iter(configs.values())) if len(configs) == 1 else {}
    running = values_by_key(by_name, RUNNING, KEY_LABELS)
    waiting = values_by_key(by_name, WAITING, KEY_LABELS)
    swapped = values_by_key(by_name, SWAPPED, KEY_LABELS)
    preemptions = values_by_key(by_name, PREEMPTIONS + "_total", KEY_LABELS)
    kv = values_by_key(by_name, KV_USAGE, KEY_LABELS) or values_by_key(
        by_name, KV_USAGE_OLD, KEY_LABELS
    )
    finished = values_by_key(by_name, REQUEST_SUCCESS + "_total", KEY_LABELS)
    tokens = values_by_key(by_name, GENERATION_TOKENS + "_total", KEY_LABELS)
    output_tokens = histograms_by_key(by_name, OUTPUT_TOKENS, KEY_LABELS)
    prompt_tokens = histograms_by_key(by_name, PROMPT_TOKENS, KEY_LABELS)
    latency = latency_by_key(by_name, LATENCY_FAMILIES, KEY_LABELS)
    step_tokens = histograms_by_key(by_name, STEP_TOKENS, KEY_LABELS)
    deferred = values_by_key(by_name, WAITING_BY_REASON, KEY_LABELS, where={"reason": "deferred"})
    rejections = values_by_key(by_name, REJECTIONS + "_total", ("model_name",))
    counted = {
        field: values_by_key(by_name, family + "_total", KEY_LABELS)
        for field, family in (
            ("prefix_cache_queries_total", PREFIX_CACHE_QUERIES),
            ("prefix_cache_hits_total", PREFIX_CACHE_HITS),
            ("spec_draft_tokens_total", SPEC_DRAFT_TOKENS),
            ("spec_accepted_tokens_total", SPEC_ACCEPTED_TOKENS),
        )
    }
    # V0's swapped requests wait too: they hold no running slot.
    queued = added_by_key(waiting, swapped)
    keys = sorted(set(running) | set(waiting) | set(kv) | set(preemptions) | set(finished))
    # A model's admission rejections go onto its first series (sorted): a target's total
    # counts each once.
    first_of_model: dict[LabelKey, LabelKey] = {}
    for key in keys:
        first_of_model.setdefault(tuple(p for p in key if p[0] == "model_name"), key)
    refused = {
        key: rejections[model] for model, key in first_of_model.items() if model in rejections
    }
    return [
        SeriesSnapshot(
            key=key,
            engine=NAME,
            running=running.get(key),
            waiting=queued.get(key),
            preemptions_total=preemptions.get(key),
            kv_usage=kv.get(key),
            requests_total=finished.get(key),
            generation_tokens_total=tokens.get(key),
            latency=latency.get(key, {}),
            output_tokens=output_tokens.get(key),
            prompt_tokens=prompt_tokens.get(key),
            step_tokens=step_tokens.get(key),
            waiting_deferred=deferred.get(key),
            rejections_total=refused.get(key),
            **{field: values.get(key) for field, values in counted.items()},
            **configs.get(dict(key).get("engine"), sole_config),
        )
        for key in keys
    ]
