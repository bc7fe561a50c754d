"""The capacity arithmetic (exporter/core/capacity.py): each formula with numbers worked by hand."""

from __future__ import annotations

import pytest

from batchscope.exporter.core.capacity import (
    batch_cost,
    budget_headroom,
    cache_fill,
    cost_per_batch,
    fixed_pair,
    kv_bytes_for,
    kv_capacity_tokens,
    kv_tokens_for,
    memory_limited,
    rate_limit,
    sustainable_concurrency,
    tokens_per_request_from_lengths,
    tokens_per_request_over_window,
    tokens_per_running_request,
    worst_latency,
)
from tests.support.costs import LINEAR

# vLLM 0.32's cache_config_info in tests/fixtures/vllm-0.32.0-cpu-load.txt.
FIXTURE_TOKENS, FIXTURE_BLOCKS, FIXTURE_BLOCK_SIZE = 1048576.0, 8192.0, 128.0


def test_kv_capacity_prefers_the_stated_tokens_and_falls_back_to_blocks():
    assert kv_capacity_tokens(FIXTURE_TOKENS, FIXTURE_BLOCKS, FIXTURE_BLOCK_SIZE) == 1048576
    assert kv_capacity_tokens(None, 8, 128) == 1024  # older vLLM: blocks x block size
    assert kv_capacity_tokens(None, None, 128) is None
    assert kv_capacity_tokens(0, None, None) is None


def test_tokens_per_running_request_now():
    # 1024 tokens, 75% used by 3 requests: 256 each.
    assert tokens_per_running_request(0.75, 1024, 3) == 256
    assert tokens_per_running_request(0.75, 1024, 0) is None
    assert tokens_per_running_request(None, 1024, 3) is None


def test_tokens_per_request_over_window_weights_every_request_seen():
    # (running, usage, waiting): 2 requests at 50%, 6 at 90%, an idle scrape ignored:
    # (0.5 + 0.9) * 1000 / 8 = 175.
    assert tokens_per_request_over_window([(2, 0.5, 0), (6, 0.9, 3), (0, 0.0, 0)], 1000) == 175
    assert tokens_per_request_over_window([(0, 0.0, 0)], 1000) is None


def test_cache_fill_is_the_mean_usage_while_requests_wait_below_the_cap():
    scrapes = [(4, 0.9, 10), (5, 0.8, 10), (8, 0.5, 10), (3, 0.2, 0), (0, 0.0, 4)]
    # Waiting, something running, below 0.9 x 8: the first two.
    limited = memory_limited(scrapes, cap=8, near_cap=0.9)
    assert limited == [(4, 0.9, 10), (5, 0.8, 10)]
    assert cache_fill(limited) == pytest.approx(0.85)
    assert len(memory_limited(scrapes, cap=None, near_cap=0.9)) == 3
    assert cache_fill([]) is None


def test_tokens_per_request_from_lengths_is_prompt_plus_half_output_plus_half_a_block():
    assert tokens_per_request_from_lengths(20, 100, None) == 70
    assert tokens_per_request_from_lengths(20, 100, 1) == 70
    # 128-token blocks: 63.5 tokens lost on average in the last block.
    assert tokens_per_request_from_lengths(58.5, 275, 128) == 58.5 + 137.5 + 63.5


def test_sustainable_concurrency_and_the_tokens_for_a_cap():
    assert sustainable_concurrency(1024, 256) == 4
    assert kv_tokens_for(8, 256) == 2048
    # A scheduler that keeps the cache 80% full holds 3.2 and needs 2560 tokens for 8.
    assert sustainable_concurrency(1024, 256, fill=0.8) == pytest.approx(3.2)
    assert kv_tokens_for(8, 256, fill=0.8) == pytest.approx(2560)
    assert kv_bytes_for(2048, 1024, 1 << 30) == 2 * (1 << 30)
    assert kv_bytes_for(2048, 1024, None) is None


def test_cost_per_batch_and_interpolation_between_measured_sizes():
    costs = cost_per_batch({1: (10, 0.0167), 128: (4, 4 * 0.00195), 64: (0, 0.0)})
    assert costs == pytest.approx({1: 0.00167, 128: 0.00195})
    assert batch_cost(costs, 1) == pytest.approx(0.00167)
    # Halfway from 1 to 128 (64.5): halfway from 1.67 to 1.95 ms.
    assert batch_cost(costs, 64.5) == pytest.approx(0.00181)
    assert batch_cost(costs, 129) is None  # never extrapolated
    assert batch_cost({}, 1) is None


def test_worst_latency_headroom_and_rate_limit():
    assert worst_latency(0.005, 0.002) == pytest.approx(0.009)
    assert budget_headroom(0.035, 0.050) == pytest.approx(0.3)
    # 32 items per 4 ms batch, 70% busy: 0.7 * 32 / 0.004 = 5600 items/s.
    assert rate_limit(32, 0.004) == pytest.approx(5600)


# A CPU-like curve: cost grows with the batch (1 ms + 1 ms per item).


def test_fixed_pair_takes_the_smallest_batch_under_the_load_line():
    # 300 items/s: load(b) = 300 (0.001 + 0.001 b) / b = 0.3 / b + 0.3 <= 0.7 from b = 1
    # (0.6): no waiting needed; the largest max batch with 2 c(m) <= 100 ms is 32.
    pair = fixed_pair(300, LINEAR, budget_seconds=0.100)
    assert pair.batch_size == 1 and pair.max_wait_seconds == 0
    assert pair.load == pytest.approx(0.6)
    assert pair.max_batch_size == 32
    assert pair.feasible
    # 550 items/s: load(b) = 0.55 / b + 0.55 <= 0.7 needs b >= 3.7: 4, wait 3 / 550 s.
    pair = fixed_pair(550, LINEAR, budget_seconds=0.100)
    assert pair.batch_size == 4
    assert pair.max_wait_seconds == pytest.approx(3 / 550)
    assert pair.worst_latency_seconds == pytest.approx(3 / 550 + 2 * 0.005)
    assert pair.rate_limit_per_second == pytest.approx(0.7 * 32 / 0.033)


def test_no_fixed_pair_carries_a_rate_past_the_devices_capacity():
    # 1000 items/s on a curve of 1 ms per item: load >= 1 at every size.
    pair = fixed_pair(1000, LINEAR, budget_seconds=0.100)
    assert not pair.feasible
    assert pair.batch_size == 32 and pair.load > 1


def test_a_tight_budget_makes_the_needed_wait_infeasible():
    flat = {1: 0.010, 64: 0.011}  # GPU-like: batching is nearly free
    # 500 items/s: load(1) = 5, load(b) = 500 c(b) / b <= 0.7 needs b >= 8; waiting
    # 7 / 500 = 14 ms plus 2 x ~10 ms is over a 25 ms budget.
    pair = fixed_pair(500, flat, budget_seconds=0.025)
    assert pair.batch_size == 8
    assert pair.worst_latency_seconds > 0.025
    assert not pair.feasible
