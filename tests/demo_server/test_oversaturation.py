"""Over-saturation: in flight and the oldest wait both growing, fitted over the samples."""

from __future__ import annotations

import random

import pytest

from batchscope.demo_server.loadgen.oversaturation import (
    QueueSample,
    linear_fit,
    over_saturation,
)


def scripted_server(rate: float, served: float, seconds: int, latency_s: float = 0.5) -> list:
    """Samples of an open-loop queue: `rate` arrivals/s, at most `served` answered per s.
    Those not served pile up; the oldest waits since the pile started."""
    samples = []
    for t in range(1, seconds + 1):
        backlog = max(0.0, (rate - served) * t)
        oldest = latency_s + backlog / served
        samples.append(QueueSample(float(t), rate * latency_s + backlog, oldest))
    return samples


def test_a_linear_fit_reads_slope_and_explained_variance() -> None:
    fit = linear_fit([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0])
    assert fit.slope == pytest.approx(2.0) and fit.r_squared == pytest.approx(1.0)
    flat = linear_fit([0.0, 1.0, 2.0], [4.0, 4.0, 4.0])
    assert flat.slope == 0.0 and flat.r_squared == 1.0


def test_a_server_serving_half_the_arrivals_is_over_saturated() -> None:
    verdict = over_saturation(scripted_server(rate=40.0, served=20.0, seconds=6), 40.0)
    assert verdict.over
    assert verdict.in_flight is not None and verdict.in_flight.slope == pytest.approx(20.0)
    assert verdict.oldest_wait is not None and verdict.oldest_wait.slope == pytest.approx(1.0)


def test_a_server_that_keeps_up_with_noise_is_not() -> None:
    rng = random.Random(3)
    # In flight ~ 20 +- 3 and the oldest wait ~ 0.5 +- 0.1 s: level, however noisy.
    samples = [
        QueueSample(float(t), 20 + rng.uniform(-3, 3), 0.5 + rng.uniform(-0.1, 0.1))
        for t in range(1, 31)
    ]
    verdict = over_saturation(samples, 40.0)
    assert not verdict.over
    assert verdict.in_flight is not None and abs(verdict.in_flight.slope) < 0.05 * 40.0


def test_a_shortfall_under_the_threshold_or_one_signal_alone_is_not() -> None:
    # 95% served: the queue grows by 2/s, under 10% of 40/s.
    assert not over_saturation(scripted_server(40.0, 38.0, 10), 40.0).over
    # In flight grows but the oldest wait does not (a server batching more as load grows).
    growing_batch = [QueueSample(float(t), 10.0 + 5 * t, 0.5) for t in range(1, 8)]
    assert not over_saturation(growing_batch, 40.0).over


def test_a_few_slow_requests_at_a_low_rate_are_not_a_queue() -> None:
    # 4 req/s on a busy machine: in flight 0 -> 3 and the oldest wait 0.1 -> 0.9 s over
    # 5 s, both steady. The wait rose by 0.8 s: slow answers, not a queue left unserved.
    samples = [
        QueueSample(float(t), n, wait)
        for t, n, wait in zip(
            range(1, 7), (0, 1, 1, 2, 3, 3), (0.1, 0.3, 0.4, 0.6, 0.8, 0.9), strict=True
        )
    ]
    verdict = over_saturation(samples, 4.0)
    assert verdict.in_flight is not None and verdict.in_flight.slope >= 0.10 * 4.0
    assert verdict.oldest_wait is not None and 0.10 <= verdict.oldest_wait.slope < 1.0 / 5
    assert not verdict.over


def test_too_few_samples_decide_nothing() -> None:
    verdict = over_saturation(scripted_server(40.0, 10.0, 3), 40.0)
    assert not verdict.over and verdict.in_flight is None
    assert "3 samples" in verdict.reason
