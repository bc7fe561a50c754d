"""The batching policy, pure: when to fire a batch, and the live estimates it decides on.

- `fixed_decision` ("Batching Requests to a Model Server"): fire at `max_batch_size`
  items or once the oldest has waited `max_wait_seconds`.
- `adaptive_decision` (Terrane's "Dynamic batching: more throughput without wrecking
  the tail"): fire while the batch queued now keeps up with arrivals; otherwise wait for
  the smallest batch that does, within the latency budget.
- `predicted_drain_seconds`: how long the queue takes to run, for admission control.
- `shape_class`, `padding_tokens`: the shape groups texts wait in, and what padding costs.
- `ArrivalRate`, `CostCurve`, `DecayingPeak`: the arrival rate, the cost by batch size
  and the scheduling lag, estimated from what was observed; time is passed in.

Everything here takes plain numbers and returns plain numbers; the queue and worker
that feed it (`batchscope.demo_server.embedding.batcher.Batcher`) hold the clock, the items
and the thread.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# A batch keeps up with arrivals when those arriving while it runs, times this margin
# (noise in the measured rate), are at most its size: then waiting would only add latency.
KEEP_UP_MARGIN = 1.2

# Share of the latency budget kept free for what the plan does not see: timer and
# thread hand-off jitter, and the cost estimate being off for one batch.
BUDGET_HEADROOM = 0.1

# The arrival rate forgets with this time constant ("smoothed over the last second").
ARRIVAL_WINDOW_SECONDS = 1.0
# ...and a burst shows within this one: the rate used is the higher of the two, so a
# rise in traffic is batched for at once instead of a second later.
BURST_WINDOW_SECONDS = 0.05

# Weight of a new observation in a batch size's running cost estimate.
COST_SMOOTHING = 0.2
# An observation is taken as at most this many times the current estimate: a batch
# stalled by a busy machine is scheduling lag, not what the size costs.
COST_OUTLIER_FACTOR = 4.0

# How fast the measured scheduling lag (a late wake-up, a batch slower than its
# estimate) is forgotten; while remembered, plans and admission reserve it, up to
# MAX_LAG_RESERVE of the budget (a lag beyond that is a stall no plan absorbs, and
# reserving it would refuse every request).
LAG_MEMORY_SECONDS = 2.0
MAX_LAG_RESERVE = 0.25
# Lag comes in spikes, and the next one is rarely the size of the last: reserve twice it.
LAG_RESERVE_FACTOR = 2.0

# A wait for company shorter than this is no wait: the event loop's timers cannot resolve
# it, and what float rounding leaves of a spent plan (1e-18 s) would plan it again.
MIN_WAIT_SECONDS = 1e-6

# Texts of the smallest shape class have at most this many tokens; each next class
# holds lengths up to SHAPE_CLASS_RATIO times the previous one's.
SHAPE_CLASS_BASE_TOKENS = 64
SHAPE_CLASS_RATIO = 4


# --- decisions (pure) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """Fire a batch now (with `trigger`), or wait: up to `wait_seconds` (None: no limit)
    or until the queue holds `target_size` items, whichever comes first. A wait for
    company says how long it may last in all, `company_seconds` (the plan's allowance)."""

    fire: bool
    trigger: str = ""
    wait_seconds: float | None = None
    target_size: int = 1
    company_seconds: float | None = None


def fixed_decision(
    queue_len: int, oldest_wait_seconds: float, max_batch_size: int, max_wait_seconds: float
) -> Decision:
    """The fixed rule of "Batching Requests to a Model Server": fire `full` at
    `max_batch_size` items, `timeout` once the oldest item has waited `max_wait_seconds`
    (less MIN_WAIT_SECONDS, a wait no timer resolves), otherwise wait for whichever
    comes first."""
    if queue_len == 0:
        return Decision(fire=False)
    if queue_len >= max_batch_size:
        return Decision(fire=True, trigger="full")
    if max_wait_seconds - oldest_wait_seconds < MIN_WAIT_SECONDS:
        return Decision(fire=True, trigger="timeout")
    return Decision(
        fire=False, wait_seconds=max_wait_seconds - oldest_wait_seconds, target_size=max_batch_size
    )


def adaptive_decision(
    queue_len: int,
    oldest_wait_seconds: float,
    arrival_rate_per_s: float,
    cost_seconds: Callable[[int], float],
    latency_budget_seconds: float,
    max_batch_size: int,
    reserve_seconds: float = 0.0,
    waited_for_company_seconds: float = 0.0,
    company_allowance_seconds: float | None = None,
) -> Decision:
    """The adaptive rule of Terrane's "Dynamic batching: more throughput without
    wrecking the tail", for a free device: fire as soon as waiting can no longer pay for
    itself, or as soon as the budget leaves no room to wait.

    Waiting pays only while the batch queued now cannot keep up with arrivals. A batch
    of n keeps up when, while it runs, fewer items arrive than it serves, with
    `KEEP_UP_MARGIN` to spare for noise in the rate: `arrival_rate * cost(n) *
    KEEP_UP_MARGIN <= n`. So:

    - `max_batch_size` items queued: fire (`full`).
    - The queued batch keeps up: fire (`budget`). At light load that is one item at
      once; under moderate load a small batch, at once (the items that arrive while it
      runs form the next one). Nothing arriving (or the service draining) keeps up too.
    - Otherwise wait for the smallest batch that keeps up, n* (`max_batch_size` when
      none does), but no longer than the oldest item's remaining budget allows: the
      target is the largest size up to n* that can still form, at (n - queue_len) /
      arrival_rate more seconds, and run, `cost_seconds(n)`, inside the budget less
      `BUDGET_HEADROOM` and less `reserve_seconds` (the scheduling lag lately measured).
      When not even one more item fits, the remaining budget only just covers this
      batch: it fires (`budget`).
    - The wait for company is one plan, not a rolling one: the queue waits at most
      (n* - 1) / arrival_rate in all, the time the items n* lacks take to arrive from
      one, reckoned when the wait began (`company_allowance_seconds`, the first plan's
      `company_seconds`: a rate that decays meanwhile does not stretch it);
      `waited_for_company_seconds` is how long it has waited so far. When they have
      not all come by then it fires what formed (`budget`): planning the same wait
      again would only stretch the oldest item's latency (measured at 750 items/s on
      the H200 curve: up to five plans back to back, 10 ms, where one plan is 3 ms).

    Batches therefore grow towards the budget only when arrivals demand it (near the
    device's peak); below that they stay small and fire fast. When waiting, the worker
    decides again when the queue reaches the target size or the planned time is up.
    """
    if queue_len == 0:
        return Decision(fire=False)
    if queue_len >= max_batch_size:
        return Decision(fire=True, trigger="full")

    def keeps_up(size: int) -> bool:
        return arrival_rate_per_s * cost_seconds(size) * KEEP_UP_MARGIN <= size

    if keeps_up(queue_len):
        return Decision(fire=True, trigger="budget")
    keep_up_size = next(
        (size for size in range(queue_len + 1, max_batch_size) if keeps_up(size)), max_batch_size
    )
    allowance_seconds = (
        (keep_up_size - 1) / arrival_rate_per_s
        if company_allowance_seconds is None
        else company_allowance_seconds
    )
    company_left_seconds = allowance_seconds - waited_for_company_seconds
    if company_left_seconds < MIN_WAIT_SECONDS:
        return Decision(fire=True, trigger="budget")
    remaining_seconds = (
        latency_budget_seconds * (1.0 - BUDGET_HEADROOM) - reserve_seconds - oldest_wait_seconds
    )
    for size in range(keep_up_size, queue_len, -1):
        form_seconds = (size - queue_len) / arrival_rate_per_s
        if form_seconds + cost_seconds(size) <= remaining_seconds:
            wait_seconds = min(form_seconds, company_left_seconds)
            return Decision(
                fire=False,
                wait_seconds=wait_seconds,
                target_size=size,
                company_seconds=allowance_seconds,
            )
    return Decision(fire=True, trigger="budget")


def predicted_drain_seconds(
    group_sizes: Sequence[int],
    running_left_seconds: float,
    cost_seconds: Callable[[int], float],
    max_batch_size: int,
) -> float:
    """Seconds until every queued item has run, firing back to back: what is left of
    the running batch, then each shape group in batches of at most `max_batch_size`."""
    total = running_left_seconds
    for size in group_sizes:
        full, rest = divmod(size, max_batch_size)
        total += full * cost_seconds(max_batch_size) + (cost_seconds(rest) if rest else 0.0)
    return total


def shape_class(tokens: int) -> int:
    """The shape group of a text of `tokens` tokens: 0 up to SHAPE_CLASS_BASE_TOKENS, then
    one more for each factor of SHAPE_CLASS_RATIO."""
    group = 0
    limit = SHAPE_CLASS_BASE_TOKENS
    while tokens > limit:
        group += 1
        limit *= SHAPE_CLASS_RATIO
    return group


def padding_tokens(lengths: Sequence[int]) -> int:
    """Pad tokens a batch of these lengths carries when each row is padded to the longest."""
    return len(lengths) * max(lengths) - sum(lengths) if lengths else 0


# --- live estimates (pure: time is passed in) ----------------------------------------


class ArrivalRate:
    """Items per second, smoothed over the last `window_seconds` by exponential decay.

    Each arrival adds 1 / window_seconds to a level that decays with that time constant,
    so under a steady rate r the level settles at r, and it drains to 0 when traffic stops.
    """

    def __init__(self, window_seconds: float = ARRIVAL_WINDOW_SECONDS) -> None:
        self._window_seconds = window_seconds
        self._level = 0.0
        self._at: float | None = None

    def record(self, now: float, count: int = 1) -> None:
        """Count `count` arrivals at time `now` (seconds, monotonic)."""
        self._level = self.rate(now) + count / self._window_seconds
        self._at = now

    def rate(self, now: float) -> float:
        """The smoothed arrival rate at time `now`, in items per second."""
        if self._at is None:
            return 0.0
        return self._level * math.exp(-max(0.0, now - self._at) / self._window_seconds)


class CostCurve:
    """Execution seconds by batch size, measured: a running average per observed size.

    Between observed sizes the estimate interpolates linearly. Below the smallest it is
    the smallest's cost; above the largest it scales the largest's cost in proportion
    to size (no batching gain assumed where none was seen). An empty curve estimates 0.
    """

    def __init__(
        self, prior: Mapping[int, float] | None = None, smoothing: float = COST_SMOOTHING
    ) -> None:
        self._smoothing = smoothing
        self._cost: dict[int, float] = dict(prior or {})
        self._sizes = sorted(self._cost)

    def observe(self, size: int, seconds: float) -> None:
        """Fold one measured execution of a batch of `size` items into the curve, taken
        as at most COST_OUTLIER_FACTOR times the current estimate (when there is one)."""
        expected = self.estimate(size)
        if expected > 0.0:
            seconds = min(seconds, COST_OUTLIER_FACTOR * expected)
        if size not in self._cost:
            bisect.insort(self._sizes, size)
            self._cost[size] = seconds
        else:
            self._cost[size] += self._smoothing * (seconds - self._cost[size])

    def estimate(self, size: int) -> float:
        """Expected seconds to execute a batch of `size` items."""
        if not self._sizes:
            return 0.0
        if size in self._cost:
            return self._cost[size]
        i = bisect.bisect_left(self._sizes, size)
        if i == 0:
            return self._cost[self._sizes[0]]
        if i == len(self._sizes):
            largest = self._sizes[-1]
            return self._cost[largest] * size / largest
        lo, hi = self._sizes[i - 1], self._sizes[i]
        share = (size - lo) / (hi - lo)
        return self._cost[lo] + share * (self._cost[hi] - self._cost[lo])

    def points(self) -> dict[int, float]:
        """The measured sizes and their current cost estimates, in seconds."""
        return {size: self._cost[size] for size in self._sizes}


class DecayingPeak:
    """The largest recent observation, forgotten exponentially: a peak of p observed at t
    counts as p * exp(-(now - t) / memory_seconds). Pure: time is passed in."""

    def __init__(self, memory_seconds: float = LAG_MEMORY_SECONDS) -> None:
        self._memory_seconds = memory_seconds
        self._peak = 0.0
        self._at = 0.0

    def observe(self, now: float, value: float) -> None:
        """Fold in one observation (seconds) made at `now`."""
        if value >= self.value(now):
            self._peak, self._at = value, now

    def value(self, now: float) -> float:
        """The remembered peak at `now`."""
        return self._peak * math.exp(-max(0.0, now - self._at) / self._memory_seconds)
