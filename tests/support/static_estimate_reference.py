"""The two parts of the histogram estimate of static utilisation that have a fast path,
as they were before it: the bucket walk and the buckets' weights in E[max]. The plain
reference `batchscope.exporter.core.static_util.estimate_from_histogram` must equal, to the bit
(tests/exporter/test_static_util.py). Written for reading: the buckets walked with
enumerate, a closure per rank's CDF. The rest of the estimate is the exporter's own."""

from __future__ import annotations

import math

from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.core.static_util import (
    UtilizationEstimate,
    _Bucket,
    _estimate_and_bounds,
    _sum_fits,
    _sum_range,
)


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

    def max_cdf(rank: float) -> float:
        """P(max of B draws <= the rank-th smallest observation)."""
        return (rank / n) ** batch_size

    def weight(bucket: _Bucket) -> float:
        top = bucket.rank_below + bucket.count
        return max_cdf(top) - max_cdf(bucket.rank_below)

    weights = [weight(b) for b in buckets]
    return _estimate_and_bounds(buckets, weights, n, total, floor_sum, batch_size)
