"""The histogram estimate of static utilisation as it was before its fast path: the plain
reference `exporter.core.static_util.estimate_from_histogram` must equal, to the bit
(tests/exporter/test_static_util.py). Written for reading: a closure per rank's CDF, the
buckets walked with enumerate, each step spelled out."""

from __future__ import annotations

import math

from exporter.core.histogram import Histogram
from exporter.core.static_util import UtilizationEstimate, _Bucket


def _buckets(hist: Histogram, integer: bool) -> list[_Bucket] | None:
    """The non-empty buckets; `integer` narrows each to the integers it can hold.

    None when `integer` is asked and some non-empty bucket holds no integer.
    """
    out = []
    rank = 0
    edge_low = 0.0
    for index, (bound, cumulative) in enumerate(zip(hist.bounds, hist.counts, strict=True)):
        count = max(0, round(cumulative) - rank)
        if count:
            low, high = edge_low, bound
            if integer:
                # The first bucket holds lengths from 0; a bucket above edge a, from floor(a) + 1.
                low = math.floor(edge_low) + 1.0 if index else 0.0
                high = math.floor(bound) if math.isfinite(bound) else math.inf
                if high < low:
                    return None
            out.append(_Bucket(count, rank, edge_low, bound, low, high))
            rank += count
        if math.isfinite(bound):
            edge_low = max(edge_low, bound)
    return out


def _sum_range(buckets: list[_Bucket]) -> tuple[float, float]:
    """The least and the greatest sum the buckets allow."""
    return sum(b.count * b.low for b in buckets), sum(b.count * b.high for b in buckets)


def _sum_fits(sums: tuple[float, float], total: float) -> bool:
    """Whether `total` is a sum the buckets allow (`sums`, their `_sum_range`), up to
    rounding of a float `_sum`."""
    least, greatest = sums
    return least - 0.5 <= total <= greatest + 0.5


def reference_estimate(hist: Histogram, batch_size: int) -> UtilizationEstimate | None:
    """`estimate_from_histogram` as it was before its fast path."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    buckets = _buckets(hist, integer=True)
    sums = _sum_range(buckets) if buckets is not None else None
    if sums is None or not _sum_fits(sums, hist.sum):
        buckets = _buckets(hist, integer=False) or []
        sums = _sum_range(buckets)
    if not buckets:
        return None
    n = buckets[-1].rank_below + buckets[-1].count
    floor_sum, ceiling_sum = sums
    total = min(max(hist.sum, floor_sum), ceiling_sum)
    if total <= 0:
        return None
    if batch_size == 1:
        # A group of one request never waits for another: exactly 1, whatever the buckets say.
        return UtilizationEstimate(1, float(n), 1.0, 1.0, 1.0)
    mean = total / n

    def max_cdf(rank: float) -> float:
        """P(max of B draws <= the rank-th smallest observation)."""
        return (rank / n) ** batch_size

    def weight(bucket: _Bucket) -> float:
        top = bucket.rank_below + bucket.count
        return max_cdf(top) - max_cdf(bucket.rank_below)

    budget = total - floor_sum
    weights = [weight(b) for b in buckets]
    floor_max = sum(b.low * w for b, w in zip(buckets, weights, strict=True))

    largest_max = floor_max
    remaining = budget
    for b, w in zip(reversed(buckets), reversed(weights), strict=True):
        if remaining <= 0:
            break
        top = b.rank_below + b.count
        width = b.high - b.low
        if math.isinf(width):
            # One observation can take it all, and the top rank weighs most.
            largest_max += remaining * (max_cdf(top) - max_cdf(top - 1))
            remaining = 0.0
        elif width > 0:
            if remaining >= width * b.count:
                largest_max += width * w
                remaining -= width * b.count
            else:
                full = math.floor(remaining / width)
                rest = remaining - full * width
                largest_max += width * (max_cdf(top) - max_cdf(top - full))
                largest_max += rest * (max_cdf(top - full) - max_cdf(top - full - 1))
                remaining = 0.0

    smallest_max = 0.0
    remaining = budget
    for b, w in zip(buckets, weights, strict=True):
        added = min(remaining, (b.high - b.low) * b.count)
        remaining -= added
        smallest_max += (b.low + added / b.count) * w

    upper = min(1.0, mean / smallest_max)
    lower = min(upper, mean / largest_max)
    interpolated = _interpolated_expected_max(buckets, n, total, batch_size)
    estimate = min(max(mean / interpolated, lower), upper) if interpolated > 0 else upper
    return UtilizationEstimate(batch_size, float(n), estimate, lower, upper)


def _interpolated_expected_max(buckets: list[_Bucket], n: int, total: float, size: int) -> float:
    """E[max of `size` draws] with lengths spread uniformly inside their buckets.

    Uniform over each whole finite bucket (PromQL's convention) would often contradict the
    exact `total`, so every finite bucket's spread is narrowed by one common factor, towards
    its lower or its upper edge, until the sum matches. The +Inf bucket's observations sit
    at the mean the sum leaves them, at least its edge. Then E[max] = integral over x >= 0
    of 1 - F(x)^B, with F linear where a bucket's lengths spread and flat between.
    """
    finite = [b for b in buckets if math.isfinite(b.edge_high)]
    overflow = next((b for b in buckets if math.isinf(b.edge_high)), None)
    lows = [max(b.edge_low, 0.0) for b in finite]
    weighted_width = sum(b.count * (b.edge_high - low) for b, low in zip(finite, lows, strict=True))
    low_sum = sum(b.count * low for b, low in zip(finite, lows, strict=True))
    high_sum = sum(b.count * b.edge_high for b in finite)
    overflow_at = 0.0
    target = total
    if overflow is not None:
        uniform_sum = (low_sum + high_sum) / 2.0
        overflow_at = max(overflow.edge_low, (total - uniform_sum) / overflow.count)
        target = total - overflow.count * overflow_at
    # Share of each bucket the lengths spread over, and from which edge.
    from_low = target <= (low_sum + high_sum) / 2.0
    if weighted_width <= 0:
        spread = 0.0
    elif from_low:
        spread = 2.0 * (target - low_sum) / weighted_width
    else:
        spread = 2.0 * (high_sum - target) / weighted_width
    spread = min(max(spread, 0.0), 1.0)

    expected = 0.0
    below = 0.0  # F at x
    x = 0.0
    for b, low in zip(finite, lows, strict=True):
        width = (b.edge_high - low) * spread
        start = low if from_low else b.edge_high - width
        expected += (start - x) * (1.0 - below**size)
        above = (b.rank_below + b.count) / n
        if width > 0:
            power_mean = (above ** (size + 1) - below ** (size + 1)) / (
                (size + 1) * (above - below)
            )
            expected += width * (1.0 - power_mean)
        below, x = above, start + width
    if overflow is not None:
        expected += (overflow_at - x) * (1.0 - below**size)
    return expected
