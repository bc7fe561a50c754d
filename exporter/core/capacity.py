"""Capacity arithmetic behind the advice: what a KV cache holds, what a fixed batcher needs.

Pure functions over plain data (no I/O, no clock), each with its formula in its
docstring; `batchscope.exporter.core.advice` assembles them into advice with inputs and confidence.

- KV cache ("Continuous Batching: Why Your GPU Waits for the Slowest Request"): capacity
  in tokens from vLLM's `cache_config_info`, tokens a running request holds (measured, or
  from the length mix), how full the scheduler keeps the cache while memory holds the
  batch, and so how many requests fit and how many tokens a cap needs.
- Fixed batchers ("Batching Requests to a Model Server"; "Dynamic batching: more
  throughput without wrecking the tail"): cost per batch by size, device load, worst
  latency, the (max_wait, max_batch_size) pair a rate needs and the rate a max batch runs
  out at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# A fixed batcher is sized to keep the device busy at most this share of the time: queueing
# delay grows as 1 / (1 - load), so a fuller device leaves nothing for the tail.
MAX_DEVICE_LOAD = 0.7


class KvScrape(NamedTuple):
    """One scrape's requests running, KV cache usage (0..1) and requests waiting."""

    running: float
    kv_usage: float
    waiting: float


def kv_capacity_tokens(
    size_tokens: float | None, num_blocks: float | None, block_size: float | None
) -> float | None:
    """KV cache capacity in tokens: vLLM's `kv_cache_size_tokens` where it says so (0.11+),
    else `num_gpu_blocks x block_size` (older versions); None when neither is there."""
    if size_tokens is not None and size_tokens > 0:
        return size_tokens
    if num_blocks is not None and block_size is not None and num_blocks > 0 and block_size > 0:
        return num_blocks * block_size
    return None


def tokens_per_running_request(
    kv_usage: float | None, capacity_tokens: float | None, running: float | None
) -> float | None:
    """KV tokens one running request holds now: usage x capacity / running."""
    if kv_usage is None or capacity_tokens is None or not running or running <= 0:
        return None
    return kv_usage * capacity_tokens / running


def tokens_per_request_over_window(
    kv_scrapes: Sequence[KvScrape], capacity_tokens: float
) -> float | None:
    """KV tokens a running request holds, averaged over every request seen at every scrape:
    sum(usage x capacity) / sum(running) over the (running, usage, waiting) scrapes with
    something running."""
    busy = [(r, u) for r, u, _ in kv_scrapes if r > 0]
    running = sum(r for r, _ in busy)
    if not busy or running <= 0:
        return None
    return sum(u for _, u in busy) * capacity_tokens / running


def memory_limited(
    kv_scrapes: Sequence[KvScrape], cap: float | None, near_cap: float
) -> list[KvScrape]:
    """The (running, usage, waiting) scrapes in which requests waited with the batch below
    near_cap x cap (any batch when no cap is known): the cache, not the cap, held them."""
    return [
        KvScrape(r, u, w)
        for r, u, w in kv_scrapes
        if w > 0 and r > 0 and (cap is None or r < near_cap * cap)
    ]


def cache_fill(limited: Sequence[KvScrape]) -> float | None:
    """The share of the KV cache the scheduler keeps full while requests wait for memory:
    mean usage over the memory-limited scrapes. Below 1: admission needs a request's whole
    context to fit, and preemptions free more than the next step needs."""
    if not limited:
        return None
    return sum(u for _, u, _ in limited) / len(limited)


def tokens_per_request_from_lengths(
    mean_prompt: float, mean_output: float, block_size: float | None
) -> float:
    """KV tokens a running request holds on average, from the length mix: its prompt, half
    its output (a request holds prompt + tokens generated so far, and is seen at every age
    of its life equally often), and half a block lost to the last partly filled block.

    A mean: long requests stay longer, so with widely spread output lengths this is low.
    """
    partial_block = (block_size - 1) / 2 if block_size and block_size > 1 else 0.0
    return mean_prompt + mean_output / 2 + partial_block


def sustainable_concurrency(
    capacity_tokens: float, tokens_per_request: float, fill: float = 1.0
) -> float:
    """How many requests of this length mix the KV cache holds at once, when the scheduler
    keeps `fill` of it in use: fill x capacity / tokens per request."""
    return fill * capacity_tokens / tokens_per_request


def kv_tokens_for(concurrency: float, tokens_per_request: float, fill: float = 1.0) -> float:
    """The KV cache, in tokens, that holds `concurrency` requests of this length mix when
    the scheduler keeps `fill` of it in use: concurrency x tokens per request / fill."""
    return concurrency * tokens_per_request / fill


def kv_bytes_for(
    tokens: float, capacity_tokens: float, capacity_bytes: float | None
) -> float | None:
    """The KV cache memory for `tokens`, scaling today's bytes per token."""
    if capacity_bytes is None or capacity_tokens <= 0:
        return None
    return capacity_bytes * tokens / capacity_tokens


def cost_per_batch(by_size: Mapping[int, tuple[float, float]]) -> dict[int, float]:
    """Seconds one batch of each size takes: execution seconds / batches executed."""
    return {size: s / n for size, (n, s) in sorted(by_size.items()) if n > 0 and s > 0}


def batch_cost(costs: Mapping[int, float], size: float) -> float | None:
    """Cost of a batch of `size`, interpolated linearly between measured sizes (below the
    smallest measured: its cost); None above the largest measured (not extrapolated)."""
    if not costs:
        return None
    sizes = sorted(costs)
    if size > sizes[-1]:
        return None
    if size <= sizes[0]:
        return costs[sizes[0]]
    for low, high in zip(sizes, sizes[1:], strict=False):
        if low <= size <= high:
            share = (size - low) / (high - low)
            return costs[low] + share * (costs[high] - costs[low])
    return None


def device_load(arrival_per_second: float, batch_size: float, cost_seconds: float) -> float:
    """Share of time the device executes when batches of `batch_size` carry the arrivals."""
    return arrival_per_second * cost_seconds / batch_size


def rate_limit(
    max_batch_size: float, cost_seconds: float, max_load: float = MAX_DEVICE_LOAD
) -> float:
    """The arrival rate at which full batches of `max_batch_size` keep the device
    `max_load` busy: where a fixed batcher runs out of headroom."""
    return max_load * max_batch_size / cost_seconds


def worst_latency(max_wait_seconds: float, cost_seconds: float) -> float:
    """A request's latency bound under a fixed batcher: its batch's wait, one batch already
    on the device, then its own batch: max_wait + 2 x cost."""
    return max_wait_seconds + 2 * cost_seconds


@dataclass(frozen=True, slots=True)
class FixedPair:
    """The fixed (max_wait, max_batch_size) a batcher needs at one arrival rate.

    `batch_size`: what batches hold at that rate; `feasible`: its worst latency fits the
    budget; `rate_limit_per_second`: the rate at which full `max_batch_size` batches keep
    the device `max_load` busy, where this pair runs out.
    """

    max_wait_seconds: float
    max_batch_size: int
    batch_size: int
    worst_latency_seconds: float
    load: float
    feasible: bool
    rate_limit_per_second: float


def fixed_pair(
    arrival_per_second: float,
    costs: Mapping[int, float],
    budget_seconds: float,
    max_load: float = MAX_DEVICE_LOAD,
) -> FixedPair | None:
    """The smallest batch that keeps the device under `max_load` at this rate, the max_wait
    that gathers it ((b - 1) / rate), and the largest max_batch_size whose worst latency
    still fits the budget (bigger batches drain bursts). None without measured costs or
    arrivals. Not feasible when no measured batch size carries the rate within the budget.
    """
    if not costs or arrival_per_second <= 0:
        return None
    largest = max(costs)
    batch = next(
        (
            b
            for b in range(1, largest + 1)
            if device_load(arrival_per_second, b, _cost(costs, b)) <= max_load
        ),
        largest,
    )
    wait = (batch - 1) / arrival_per_second
    latency = worst_latency(wait, _cost(costs, batch))
    load = device_load(arrival_per_second, batch, _cost(costs, batch))
    fits = [
        m
        for m in range(batch, largest + 1)
        if worst_latency(wait, _cost(costs, m)) <= budget_seconds
    ]
    max_batch = max(fits) if fits else batch
    return FixedPair(
        max_wait_seconds=wait,
        max_batch_size=max_batch,
        batch_size=batch,
        worst_latency_seconds=latency,
        load=load,
        feasible=latency <= budget_seconds and load <= max_load,
        rate_limit_per_second=rate_limit(max_batch, _cost(costs, max_batch), max_load),
    )


def _cost(costs: Mapping[int, float], size: int) -> float:
    cost = batch_cost(costs, size)
    assert cost is not None  # callers stay within the measured sizes
    return cost


def budget_headroom(latency_seconds: float, budget_seconds: float) -> float:
    """Share of the budget left at the observed latency quantile: 1 - latency / budget."""
    return 1 - latency_seconds / budget_seconds
