"""Cumulative Prometheus histograms: deltas over a window and quantiles.

Pure functions over plain data. A histogram here is what one scrape shows for one
series: cumulative bucket counts by upper bound (`le`), plus `_sum` and `_count`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Histogram:
    """One cumulative histogram series as scraped.

    `bounds` are the `le` upper bounds in ascending order, the last one `+Inf`;
    `counts[i]` is the cumulative count of observations <= `bounds[i]`.
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float

    @classmethod
    def from_buckets(
        cls, buckets: dict[float, float], total_sum: float, count: float | None
    ) -> Histogram:
        """Build from a `{le: cumulative count}` mapping; `count` defaults to the +Inf bucket."""
        bounds = tuple(sorted(buckets))
        counts = tuple(map(buckets.__getitem__, bounds))
        if count is None:
            count = counts[-1] if counts else 0.0
        return cls(bounds, counts, total_sum, count)

    def bucket_counts(self) -> list[float]:
        """Per-bucket (non-cumulative) counts, one per bound."""
        out = []
        previous = 0.0
        for c in self.counts:
            out.append(c - previous)
            previous = c
        return out


def histogram_add(a: Histogram | None, b: Histogram) -> Histogram | None:
    """Two histograms' observations together; None when their bucket layouts differ."""
    if a is None:
        return b
    if a.bounds != b.bounds:
        return None
    return Histogram(
        a.bounds,
        tuple(map(operator.add, a.counts, b.counts)),
        a.sum + b.sum,
        a.count + b.count,
    )


def histogram_sub(newer: Histogram, older: Histogram | None) -> Histogram:
    """`newer` minus `older` bucket by bucket (same layout, no reset between them)."""
    if older is None:
        return newer
    return Histogram(
        newer.bounds,
        tuple(map(operator.sub, newer.counts, older.counts)),
        newer.sum - older.sum,
        newer.count - older.count,
    )


def histogram_restarted(older: Histogram, newer: Histogram) -> bool:
    """The server restarted between two scrapes: a new bucket layout, or a count went down."""
    return (
        newer.bounds != older.bounds
        or newer.count < older.count
        or any(map(operator.lt, newer.counts, older.counts))
    )


def histogram_restarts(hists: Sequence[Histogram | None]) -> list[bool]:
    """For each scrape of one histogram: whether it restarted since the previous scrape
    that held it (False where it is absent, and at the first scrape that holds it)."""
    restarts = []
    previous = None
    for current in hists:
        restarts.append(
            current is not None and previous is not None and histogram_restarted(previous, current)
        )
        if current is not None:
            previous = current
    return restarts


def histogram_increase(
    hists: Sequence[Histogram | None], restarts: Sequence[bool] | None = None
) -> Histogram | None:
    """The observations made over consecutive scrapes of one histogram, through restarts.

    As PromQL's increase() on each bucket: a restart (a count went down, or a new bucket
    layout) starts the counting again from zero, so the part after it adds up in full;
    a histogram absent at the first scrape was created since and counts from zero too.
    None with fewer than two scrapes, no histogram at all, or observations in two
    bucket layouts within the window (they cannot be added up).

    `restarts[i]`: whether `hists[i]` restarted since the previous histogram present,
    read only where there is one: `histogram_restarts(hists)`, passed by a caller that
    already knows it (a window works each one out once, as its scrape arrives), else
    worked out here.
    """
    if len(hists) < 2:
        return None
    if restarts is None:
        restarts = histogram_restarts(hists)
    parts = []
    base = hists[0]
    previous = None
    for current, restarted in zip(hists, restarts, strict=True):
        if current is None:
            continue
        if restarted and previous is not None:
            parts.append(histogram_sub(previous, base))
            base = None
        previous = current
    if previous is None:
        return None
    parts.append(histogram_sub(previous, base))
    # A part without observations says nothing, whatever its layout.
    observed = [part for part in parts if part.count > 0] or parts[-1:]
    total: Histogram | None = None
    for part in observed:
        total = histogram_add(total, part)
        if total is None:
            return None
    return total


def histogram_quantile(q: float, hist: Histogram) -> float | None:
    """The q-quantile by linear interpolation inside the bucket, as PromQL's histogram_quantile.

    None when the histogram holds no observations. When the quantile falls in the +Inf
    bucket, the result is the largest finite bound (PromQL's convention).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not hist.bounds or hist.counts[-1] <= 0:
        return None
    total = hist.counts[-1]
    rank = q * total
    lower_bound = 0.0
    lower_count = 0.0
    for bound, count in zip(hist.bounds, hist.counts, strict=True):
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound if len(hist.bounds) > 1 else None
            if bound <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        if not math.isinf(bound):
            lower_bound = bound
        lower_count = count
    return lower_bound
