"""A dynamic batcher: a queue of items in front of any batch function, fired as batches
by the fixed or the adaptive policy.

Two batching policies share one queue and one worker (`Batcher`):

- `fixed` (seed 000): fire when `max_batch_size` items wait, or when the oldest has
  waited `max_wait_seconds`; triggers `full` and `timeout`.
- `adaptive` (seed 001): given `latency_budget_seconds`, fire the largest batch that can
  form and finish inside the oldest item's remaining budget, from a live arrival rate
  and a cost-by-batch-size curve learned from the batches it ran; triggers `full` and
  `budget`.

The decisions are pure functions (`fixed_decision`, `adaptive_decision`) over plain
numbers; the worker feeds them the queue, the clock and its `BatcherSettings`. The
batch function runs on a dedicated thread so the event loop keeps accepting requests
while a batch executes. An item that fails inside a batch fails alone: the rest of the
batch is retried without it.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from demo_server.batcher_settings import BatcherSettings
from demo_server.queueing import QueueFull, QueueStopping
from exporter.instrumentation import BatcherMetrics

# Share of the latency budget kept free for what the plan does not see: timer and
# thread hand-off jitter, and the cost estimate being off for one batch.
BUDGET_HEADROOM = 0.1

# The arrival rate forgets with this time constant ("smoothed over the last second").
ARRIVAL_WINDOW_SECONDS = 1.0

# Weight of a new observation in a batch size's running cost estimate.
COST_SMOOTHING = 0.2


class ItemError(Exception):
    """One item failed inside its batch; `index` is its position in the batch when known."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


# --- decisions (pure) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """Fire a batch now (with `trigger`), or wait: up to `wait_seconds` (None: no limit)
    or until the queue holds `target_size` items, whichever comes first."""

    fire: bool
    trigger: str = ""
    wait_seconds: float | None = None
    target_size: int = 1


def fixed_decision(
    queue_len: int, oldest_wait_seconds: float, max_batch_size: int, max_wait_seconds: float
) -> Decision:
    """Seed 000's rule: fire `full` at `max_batch_size` items, `timeout` once the oldest
    item has waited `max_wait_seconds`, otherwise wait for whichever comes first."""
    if queue_len == 0:
        return Decision(fire=False)
    if queue_len >= max_batch_size:
        return Decision(fire=True, trigger="full")
    if oldest_wait_seconds >= max_wait_seconds:
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
) -> Decision:
    """Seed 001's rule: wait for the largest batch that can still form and finish
    inside the oldest item's remaining budget; fire now when no larger batch can.

    A batch of k items is expected to form after (k - queue_len) / arrival_rate more
    seconds and to take `cost_seconds(k)` to run; it fits when the oldest item's wait
    plus both stays within the budget less `BUDGET_HEADROOM`. With no larger k fitting the
    batch fires now (`budget`), so under light traffic every item runs at once; with
    `max_batch_size` items waiting it fires `full`. When waiting, the worker decides
    again when the queue reaches the planned size or the planned time is up.
    """
    if queue_len == 0:
        return Decision(fire=False)
    if queue_len >= max_batch_size:
        return Decision(fire=True, trigger="full")
    remaining_seconds = latency_budget_seconds * (1.0 - BUDGET_HEADROOM) - oldest_wait_seconds
    if arrival_rate_per_s > 0.0:
        for size in range(max_batch_size, queue_len, -1):
            form_seconds = (size - queue_len) / arrival_rate_per_s
            if form_seconds + cost_seconds(size) <= remaining_seconds:
                return Decision(fire=False, wait_seconds=form_seconds, target_size=size)
    return Decision(fire=True, trigger="budget")


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
        """Fold one measured execution of a batch of `size` items into the curve."""
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


def run_isolating_failures(
    run: Callable[[list[str]], list[Any]], items: Sequence[str]
) -> list[Any]:
    """Run `items` as one batch and return one result per item, in order; an item that
    fails gets an `ItemError` in its place and the others still get their results.

    A failure that names its item (`ItemError` with an index) drops that item and
    retries the rest without it. Any other failure splits the batch in halves and
    retries each, until the failing items stand alone.
    """
    results: list[Any] = [None] * len(items)
    pending: list[list[int]] = [list(range(len(items)))]
    while pending:
        indices = pending.pop()
        try:
            outputs = run([items[i] for i in indices])
        except ItemError as error:
            if error.index is None or not 0 <= error.index < len(indices):
                pending.extend(_halves_or_fail(indices, error, results))
                continue
            results[indices[error.index]] = ItemError(error.message)
            rest = indices[: error.index] + indices[error.index + 1 :]
            if rest:
                pending.append(rest)
            continue
        except Exception as error:  # any model failure: find the items that cause it
            pending.extend(_halves_or_fail(indices, error, results))
            continue
        for i, output in zip(indices, outputs, strict=True):
            results[i] = output
    return results


def _halves_or_fail(indices: list[int], error: Exception, results: list[Any]) -> list[list[int]]:
    """The halves to retry, or none when a single item failed (then it gets the error)."""
    if len(indices) == 1:
        results[indices[0]] = ItemError(f"{type(error).__name__}: {error}")
        return []
    middle = len(indices) // 2
    return [indices[middle:], indices[:middle]]


@dataclass(eq=False, slots=True)
class _Item:
    text: str
    future: asyncio.Future[Any]
    enqueued_at: float
    taken: bool = False


class Batcher:
    """A queue of items in front of `run_batch`, fired as batches by the chosen policy.

    `run_batch(texts)` returns one result per text and runs on the batcher's own
    thread, one batch at a time. Every item ends with exactly one outcome in
    `metrics`: ok, error, rejected (queue full or stopping) or cancelled (its caller
    went away). `clock` is monotonic seconds, the same clock for every timestamp.
    """

    def __init__(
        self,
        run_batch: Callable[[list[str]], list[Any]],
        *,
        settings: BatcherSettings,
        max_queue: int,
        metrics: BatcherMetrics,
        cost_prior: Mapping[int, float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.max_queue = max_queue
        self.metrics = metrics
        self.cost_curve = CostCurve(cost_prior)
        self._run_batch = run_batch
        self._clock = clock
        self._arrivals = ArrivalRate()
        self._queue: collections.deque[_Item] = collections.deque()
        self._in_flight = 0
        self._wake_at_size = 1
        self._wake = asyncio.Event()
        self._accepting = False
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.settings = settings
        self._publish(settings)

    async def start(self) -> None:
        """Start the worker; items are accepted from now on."""
        if self._worker is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.metrics.batcher)
        self._accepting = True
        self._worker = asyncio.create_task(self._work(), name=f"{self.metrics.batcher}-batcher")

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting items. With `drain`, queued and running items finish first;
        without, queued items fail with QueueStopping and only the running batch ends."""
        self._accepting = False
        if not drain:
            while self._queue:
                item = self._queue.popleft()
                if not item.future.cancelled():  # else its caller's withdrawal counts it
                    item.future.set_exception(QueueStopping("the service stopped"))
                    self.metrics.observe_request("rejected")
            self.metrics.set_queue_depth(0)
        self._wake.set()
        if self._worker is not None:
            await self._worker
            self._worker = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def configure(self, settings: BatcherSettings) -> None:
        """Use `settings` from the next batch decision on. Raises ValueError for a change
        of `mode`, which only a restart makes (its metrics would describe both modes)."""
        if settings.mode != self.settings.mode:
            raise ValueError(
                f"mode is {self.settings.mode!r} until a restart, got {settings.mode!r}"
            )
        self.settings = settings
        self._publish(settings)
        self._wake.set()

    def _publish(self, settings: BatcherSettings) -> None:
        # Only the fixed policy waits on max_wait; publishing it in adaptive mode would
        # tell an operator about a limit that is not in force.
        self.metrics.set_config(
            max_batch_size=settings.max_batch_size,
            max_wait_seconds=settings.max_wait_seconds if settings.mode == "fixed" else None,
            latency_budget_seconds=settings.latency_budget_seconds,
        )

    def snapshot(self) -> dict[str, Any]:
        """Mode, settings, queue depth, items running, arrival rate and the cost curve."""
        return {
            "mode": self.settings.mode,
            "config": {**self.settings.as_ms(), "max_queue": self.max_queue},
            "queue_depth": len(self._queue),
            "in_flight": self._in_flight,
            "arrival_rate_per_s": round(self._arrivals.rate(self._clock()), 3),
            "cost_ms_by_batch_size": {
                size: round(seconds * 1000.0, 4)
                for size, seconds in self.cost_curve.points().items()
            },
        }

    async def submit(self, texts: Sequence[str]) -> list[Any]:
        """Queue each text as one item and return their results in order.

        Raises QueueFull (nothing queued) when the items do not fit in `max_queue`,
        QueueStopping once stopping, and ItemError when an item failed (after all of
        the request's items are done). A caller cancelled while waiting takes its
        queued items out of the queue, counted `cancelled`.
        """
        if not self._accepting:
            raise QueueStopping("the service is stopping")
        if len(self._queue) + len(texts) > self.max_queue:
            for _ in texts:
                self.metrics.observe_request("rejected")
            raise QueueFull(
                f"queue full: {len(self._queue)} of {self.max_queue} items waiting",
                self._retry_after_seconds(),
            )
        loop = asyncio.get_running_loop()
        now = self._clock()
        items = [_Item(text, loop.create_future(), now) for text in texts]
        self._queue.extend(items)
        self._arrivals.record(now, len(items))
        self.metrics.set_queue_depth(len(self._queue))
        if len(self._queue) >= self._wake_at_size:
            self._wake.set()
        try:
            results = await asyncio.gather(*(item.future for item in items), return_exceptions=True)
        except asyncio.CancelledError:
            self._withdraw(items)
            raise
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def _withdraw(self, items: list[_Item]) -> None:
        """Take a cancelled caller's still-queued items out; running ones finish unseen."""
        queued = {id(item) for item in items if not item.taken}
        if not queued:
            return
        self._queue = collections.deque(i for i in self._queue if id(i) not in queued)
        for _ in queued:
            self.metrics.observe_request("cancelled")
        self.metrics.set_queue_depth(len(self._queue))

    def _retry_after_seconds(self) -> int:
        """Whole seconds until the current queue is expected to have run, at least 1."""
        max_batch_size = self.settings.max_batch_size
        batches = math.ceil(len(self._queue) / max_batch_size)
        return max(1, math.ceil(batches * self.cost_curve.estimate(max_batch_size)))

    def _decide(self, now: float) -> Decision:
        settings = self.settings
        oldest_wait_seconds = now - self._queue[0].enqueued_at
        if settings.mode == "fixed":
            return fixed_decision(
                len(self._queue),
                oldest_wait_seconds,
                settings.max_batch_size,
                settings.max_wait_seconds,
            )
        # Once draining no more items come: waiting for them would only add latency.
        rate = self._arrivals.rate(now) if self._accepting else 0.0
        return adaptive_decision(
            len(self._queue),
            oldest_wait_seconds,
            rate,
            self.cost_curve.estimate,
            settings.latency_budget_seconds,
            settings.max_batch_size,
        )

    async def _work(self) -> None:
        while True:
            self._wake.clear()
            if not self._queue:
                if not self._accepting:
                    return
                self._wake_at_size = 1
                await self._wake.wait()
                continue
            decision = self._decide(self._clock())
            if decision.fire:
                await self._fire(decision.trigger)
                continue
            self._wake_at_size = decision.target_size
            try:
                async with asyncio.timeout(decision.wait_seconds):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _fire(self, trigger: str) -> None:
        batch: list[_Item] = []
        while self._queue and len(batch) < self.settings.max_batch_size:
            item = self._queue.popleft()
            item.taken = True
            # A caller cancelled a moment ago whose items are not withdrawn yet: its slot
            # goes to the next item instead of to work nobody will read.
            if item.future.cancelled():
                self.metrics.observe_request("cancelled")
            else:
                batch.append(item)
        self.metrics.set_queue_depth(len(self._queue))
        if not batch:
            return
        size = len(batch)
        fired_at = self._clock()
        self._in_flight = size
        loop = asyncio.get_running_loop()
        results, seconds = await loop.run_in_executor(
            self._executor, self._execute, [item.text for item in batch]
        )
        done_at = self._clock()
        self._in_flight = 0
        self.metrics.observe_batch(size, trigger, seconds)
        if not any(isinstance(result, ItemError) for result in results):
            # The budget also pays the hand-off to the model thread and back, so the curve
            # learns the round trip; a batch with retries would overstate its size's cost.
            self.cost_curve.observe(size, done_at - fired_at)
        for item, result in zip(batch, results, strict=True):
            if item.future.cancelled():
                self.metrics.observe_request("cancelled")
                continue
            outcome = "error" if isinstance(result, ItemError) else "ok"
            if outcome == "error":
                item.future.set_exception(result)
            else:
                item.future.set_result(result)
            self.metrics.observe_request(
                outcome,
                queue_wait_seconds=fired_at - item.enqueued_at,
                latency_seconds=done_at - item.enqueued_at,
            )

    def _execute(self, texts: list[str]) -> tuple[list[Any], float]:
        started = time.perf_counter()
        results = run_isolating_failures(self._run_batch, texts)
        return results, time.perf_counter() - started
