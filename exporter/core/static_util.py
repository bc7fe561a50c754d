"""Static-batching utilisation: exact from logged output lengths, estimated from a histogram.

A static batch of B requests holds all B slots until its longest request finishes, so the
share of slot-steps doing useful work is `sum(lengths) / (B * max(lengths))` ("Continuous Batching:
Why Your GPU Waits for the Slowest Request").
Continuous batching refills a slot as soon as its request finishes, so, with a queue, its
gain over static batching is the inverse of that share.

Pure functions over plain data: no I/O, no clock. Lengths are output token counts, i.e.
non-negative integers; a request that produced no token still takes a slot in its group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from math import floor, inf, isfinite
from typing import NamedTuple

from batchscope.exporter.core.histogram import Histogram

# Lengths are fed to the accumulator in slices of this size: bounded memory, C-speed sums.
_CHUNK = 65536


def static_utilization(lengths: Sequence[int]) -> float:
    """Share of one static batch's slot-steps doing useful work: sum / (len * max).

    The batch has `len(lengths)` slots and runs `max(lengths)` steps. Raises ValueError
    for an empty batch, a negative length, or a batch in which no request produced a token.
    """
    if not lengths:
        raise ValueError("a batch needs at least one request")
    if min(lengths) < 0:
        raise ValueError("lengths must be non-negative")
    steps = max(lengths)
    if steps == 0:
        raise ValueError("no request in the batch produced a token")
    return sum(lengths) / (len(lengths) * steps)


@dataclass(frozen=True, slots=True)
class StaticBatchingResult:
    """What static batches of `batch_size` would have done with a sequence of requests.

    `total_slot_steps` is the capacity paid: `batch_size` slots for as many steps as each
    group's longest request. `useful_slot_steps` is the sum of the lengths. A last partial
    group holds `partial_group_requests` requests (0 when the requests filled every group).
    """

    batch_size: int
    requests: int
    groups: int
    partial_group_requests: int
    useful_slot_steps: int
    total_slot_steps: int
    idle_slot_steps: int
    static_utilization: float
    continuous_batching_gain: float

    def to_dict(self) -> dict[str, int | float]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


class StaticBatchingAccumulator:
    """Streams lengths into consecutive groups of `batch_size` in O(1) memory.

    Consecutive requests form a group, in the order given. A last partial group of k < B
    requests runs as it would on the server: max(its k lengths) steps. Its slots count as
    B, not k: the server reserved B slots for the batch, so the capacity paid is B * max,
    the same "slot-steps you pay for" as that article's 8 slots x 16 steps. On a log much longer
    than B this tail is negligible; on a short one, `partial_group_requests` says it is there.
    """

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        self._batch_size = batch_size
        self._requests = 0
        self._useful = 0
        self._full_groups = 0
        self._sum_of_group_max = 0
        self._open_count = 0
        self._open_max = 0

    def add(self, length: int) -> None:
        """Append one request of `length` output tokens (a non-negative integer)."""
        self.add_many((length,))

    def add_many(self, lengths: Sequence[int]) -> None:
        """Append requests in order; same result as `add` on each, faster on long slices."""
        if not lengths:
            return
        if min(lengths) < 0:
            raise ValueError("lengths must be non-negative")
        size = self._batch_size
        n = len(lengths)
        start = 0
        if self._open_count:
            # Finish the group left open by the previous call before slicing whole groups.
            start = min(size - self._open_count, n)
            head = lengths[:start]
            self._open_max = max(self._open_max, max(head))
            self._open_count += start
            self._useful += sum(head)
            if self._open_count == size:
                self._close_open_group()
        whole_end = start + (n - start) // size * size
        for i in range(start, whole_end, size):
            group = lengths[i : i + size]
            self._useful += sum(group)
            self._sum_of_group_max += max(group)
        self._full_groups += (whole_end - start) // size
        if whole_end < n:
            tail = lengths[whole_end:]
            self._open_count = len(tail)
            self._open_max = max(tail)
            self._useful += sum(tail)
        self._requests += n

    def _close_open_group(self) -> None:
        self._full_groups += 1
        self._sum_of_group_max += self._open_max
        self._open_count = 0
        self._open_max = 0

    def result(self) -> StaticBatchingResult:
        """The totals so far. Raises ValueError when no request, or none produced a token."""
        if self._requests == 0:
            raise ValueError("no requests")
        total = self._batch_size * (self._sum_of_group_max + self._open_max)
        if total == 0:
            raise ValueError("no request produced a token")
        return StaticBatchingResult(
            batch_size=self._batch_size,
            requests=self._requests,
            groups=self._full_groups + (1 if self._open_count else 0),
            partial_group_requests=self._open_count,
            useful_slot_steps=self._useful,
            total_slot_steps=total,
            idle_slot_steps=total - self._useful,
            static_utilization=self._useful / total,
            continuous_batching_gain=total / self._useful,
        )


def exact_static_utilization(lengths: Iterable[int], batch_size: int) -> StaticBatchingResult:
    """Static batching of `lengths` in consecutive groups of `batch_size`, streamed.

    See StaticBatchingAccumulator for how a last partial group counts.
    """
    accumulator = StaticBatchingAccumulator(batch_size)
    iterator = iter(lengths)
    while chunk := list(islice(iterator, _CHUNK)):
        accumulator.add_many(chunk)
    return accumulator.result()


@dataclass(frozen=True, slots=True)
class UtilizationEstimate:
    """Expected static utilisation for groups of `batch_size` drawn from a histogram.

    `lower <= estimate <= upper`; the bounds hold for any lengths that fit the histogram's
    buckets and sum. The gain is the inverse, so its bounds swap.
    """

    batch_size: int
    requests: float
    estimate: float
    lower: float
    upper: float

    @property
    def continuous_batching_gain(self) -> float:
        """1 / estimate."""
        return 1.0 / self.estimate

    @property
    def gain_lower(self) -> float:
        """1 / upper."""
        return 1.0 / self.upper

    @property
    def gain_upper(self) -> float:
        """1 / lower."""
        return 1.0 / self.lower

    def to_dict(self) -> dict[str, float]:
        """The fields and the gains as a JSON-ready dict."""
        return {
            **asdict(self),
            "continuous_batching_gain": self.continuous_batching_gain,
            "gain_lower": self.gain_lower,
            "gain_upper": self.gain_upper,
        }


class _Bucket(NamedTuple):
    """Observations in (edge_low, edge_high], with the integer range they can take.

    A named tuple: every evaluation of a target builds these, and a tuple is built
    several times faster than a frozen dataclass."""

    count: int
    rank_below: int  # observations in lower buckets
    edge_low: float
    edge_high: float
    low: float
    high: float


def _buckets(hist: Histogram, integer: bool) -> list[_Bucket] | None:
    """The non-empty buckets; `integer` narrows each to the integers it can hold.

    None when `integer` is asked and some non-empty bucket holds no integer.
    """
    out = []
    rank = 0
    edge_low = 0.0
    first = True
    for bound, cumulative in zip(hist.bounds, hist.counts, strict=True):
        count = round(cumulative) - rank
        if count > 0:
            if integer:
                # The first bucket holds lengths from 0; a bucket above edge a, from floor(a) + 1.
                low = 0.0 if first else floor(edge_low) + 1.0
                high = floor(bound) if isfinite(bound) else inf
                if high < low:
                    return None
            else:
                low, high = edge_low, bound
            out.append(_Bucket(count, rank, edge_low, bound, low, high))
            rank += count
        first = False
        if isfinite(bound) and bound > edge_low:
            edge_low = bound
    return out


def _sum_range(buckets: list[_Bucket]) -> tuple[float, float]:
    """The least and the greatest sum the buckets allow."""
    return sum(b.count * b.low for b in buckets), sum(b.count * b.high for b in buckets)


def _sum_fits(sums: tuple[float, float], total: float) -> bool:
    """Whether `total` is a sum the buckets allow (`sums`, their `_sum_range`), up to
    rounding of a float `_sum`."""
    least, greatest = sums
    return least - 0.5 <= total <= greatest + 0.5


def estimate_from_histogram(hist: Histogram, batch_size: int) -> UtilizationEstimate | None:
    """Expected static utilisation for groups of `batch_size` from a token-count histogram.

    The model: each group is `batch_size` independent draws from the histogram's requests
    (the window's traffic, served by a static batcher in steady state). The value is the
    ratio of expectations E[sum] / (B * E[max]) = mean / E[max of B draws], because that is
    what the exact computation over many groups converges to: total useful slot-steps over
    total slot-steps, not the mean of per-group ratios. The mean is exact (`_sum / _count`);
    only E[max] depends on where the observations sit inside their buckets.

    - `estimate`: lengths spread uniformly inside their buckets, narrowed so that they add
      up to `_sum` (see `_interpolated_expected_max`); clamped into the bounds.
    - `lower`: the largest E[max] any placement of the observations allows, given their
      buckets and the exact sum: the excess over the bucket floors goes to the top ranks,
      which weigh most in the max.
    - `upper`: the smallest E[max]: the excess fills the lowest buckets first, spread evenly
      within each (even values minimise a rank-weighted sum with rising weights).

    Lengths are integers, so a bucket (a, b] holds a+1..b when the histogram agrees
    (otherwise the real edges are used). The +Inf bucket needs no edge: the sum bounds it.
    A `_sum` outside what the buckets allow (float noise, a bad delta) is clamped into that
    range. None when the histogram holds no observation or no token.
    """
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
    # Each bucket's weight in E[max]: max_cdf at its top rank less at the rank below it.
    weights = [
        ((b.rank_below + b.count) / n) ** batch_size - (b.rank_below / n) ** batch_size
        for b in buckets
    ]
    return _estimate_and_bounds(buckets, weights, n, total, floor_sum, batch_size)


def _estimate_and_bounds(
    buckets: list[_Bucket],
    weights: list[float],
    n: int,
    total: float,
    floor_sum: float,
    batch_size: int,
) -> UtilizationEstimate:
    """The estimate and its bounds (`estimate_from_histogram`) from the non-empty buckets,
    each one's weight in E[max], the `n` observations, their clamped `total`, and the
    least sum the buckets allow."""
    mean = total / n

    def max_cdf(rank: float) -> float:
        """P(max of B draws <= the rank-th smallest observation)."""
        return (rank / n) ** batch_size

    budget = total - floor_sum
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
