"""A dynamic batcher: a queue of items in front of any batch function, fired as batches
by the fixed or the adaptive policy.

Two batching policies share one queue and one worker (`Batcher`):

- `fixed` ("Batching Requests to a Model Server"): fire when `max_batch_size` items
  wait, or when the oldest has waited `max_wait_seconds`; triggers `full` and `timeout`.
- `adaptive` (Terrane's "Dynamic batching: more throughput without wrecking the tail"):
  given `latency_budget_seconds`, from a live arrival rate and a cost-by-batch-size
  curve learned from the batches it ran: fire at once while the batch queued now keeps
  up with arrivals (waiting would only add latency); when it
  does not, wait for the smallest batch that does, no longer than the oldest item's
  remaining budget allows and than those items take to arrive (one plan, not renewed);
  triggers `full` and `budget`. Admission control:
  an item the queue ahead of it would push past the budget is refused at once
  (`OverBudget`, a 429), not served late; one that finds the batcher idle is served.

Items are grouped by shape: texts whose lengths differ by more than `SHAPE_CLASS_RATIO`
wait in separate groups, so a short text is not padded to a long one's length. Each
fired batch records the padding it pays and the padding the split avoided (against the
same number of items taken in arrival order).

The decisions and estimates are pure (`batchscope.demo_server.embedding.batch_policy`:
`fixed_decision`, `adaptive_decision`, `predicted_drain_seconds`, `ArrivalRate`,
`CostCurve`); this module's worker feeds them the queue, the clock and its
`BatcherSettings`. The batch function runs on a dedicated thread so the event loop keeps
accepting requests while a batch executes. An item that fails inside a batch fails alone: the rest of the
batch is retried without it.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from batchscope.demo_server.embedding.batch_policy import (
    BUDGET_HEADROOM,
    BURST_WINDOW_SECONDS,
    LAG_RESERVE_FACTOR,
    MAX_LAG_RESERVE,
    ArrivalRate,
    CostCurve,
    DecayingPeak,
    Decision,
    adaptive_decision,
    fixed_decision,
    padding_tokens,
    predicted_drain_seconds,
    shape_class,
)
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.queueing import OverBudget, QueueFull, QueueStopping
from batchscope.exporter.instrumentation import BatcherMetrics


class ItemError(Exception):
    """One item failed inside its batch; `index` is its position in the batch when known."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


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
    tokens: int
    future: asyncio.Future[Any]
    enqueued_at: float
    taken: bool = False


@dataclass(slots=True)
class _ShapeGroup:
    """The items of one shape class waiting for a batch, and their arrival rate."""

    queue: collections.deque[_Item] = field(default_factory=collections.deque)
    arrivals: ArrivalRate = field(default_factory=ArrivalRate)
    burst_arrivals: ArrivalRate = field(default_factory=lambda: ArrivalRate(BURST_WINDOW_SECONDS))
    # When the worker first chose to wait for more items of this group (None: it has not
    # since the group last fired), and for how long in all that first plan allowed: the
    # adaptive policy waits for company once, not anew.
    company_since: float | None = None
    company_allowance_seconds: float | None = None

    def record_arrival(self, now: float) -> None:
        self.arrivals.record(now)
        self.burst_arrivals.record(now)

    def arrival_rate(self, now: float) -> float:
        """Items per second: the smoothed rate, or a burst's when higher."""
        return max(self.arrivals.rate(now), self.burst_arrivals.rate(now))


class Batcher:
    """A queue of items in front of `run_batch`, fired as batches by the chosen policy.

    `run_batch(texts)` returns one result per text and runs on the batcher's own
    thread, one batch at a time. `count_tokens(text)` gives a text's length in the
    model's tokens, which decides its shape group (default: characters). Every item
    ends with exactly one outcome in `metrics`: ok, error, rejected (queue full,
    over budget or stopping) or cancelled (its caller went away). `clock` is monotonic
    seconds, the same clock for every timestamp.

    `execute(texts)`, when given, runs each batch instead of the batcher's thread and
    returns one result or `ItemError` per text and the seconds the batch took. A test
    passes a simulated device there and the event loop's clock as `clock`, and drives
    the batcher in virtual time: its decisions then depend on the arrivals alone, not
    on how busy the machine is.
    """

    def __init__(
        self,
        run_batch: Callable[[list[str]], list[Any]],
        *,
        settings: BatcherSettings,
        max_queue: int,
        metrics: BatcherMetrics,
        cost_prior: Mapping[int, float] | None = None,
        count_tokens: Callable[[str], int] = len,
        clock: Callable[[], float] = time.perf_counter,
        execute: Callable[[list[str]], Awaitable[tuple[list[Any], float]]] | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.max_queue = max_queue
        self.metrics = metrics
        self.cost_curve = CostCurve(cost_prior)
        self._run_batch = run_batch
        self._count_tokens = count_tokens
        self._clock = clock
        self._execute_elsewhere = execute
        self._arrivals = ArrivalRate()
        self._groups: dict[int, _ShapeGroup] = collections.defaultdict(_ShapeGroup)
        self._queued = 0
        self._lag = DecayingPeak()
        self._in_flight = 0
        self._running_until = 0.0
        self._wake_at_sizes: dict[int, int] = {}
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
            for group in self._groups.values():
                while group.queue:
                    item = group.queue.popleft()
                    if not item.future.cancelled():  # else its caller's withdrawal counts it
                        item.future.set_exception(QueueStopping("the service stopped"))
                        self.metrics.observe_request("rejected", reason="stopping")
            self._queued = 0
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
        """Mode, settings, queue depth (and by shape group), items running, arrival rate,
        the scheduling lag reserved and the cost curve."""
        now = self._clock()
        return {
            "mode": self.settings.mode,
            "config": {**self.settings.as_ms(), "max_queue": self.max_queue},
            "queue_depth": self._queued,
            "queue_depth_by_shape": {
                shape: len(group.queue) for shape, group in sorted(self._groups.items())
            },
            "in_flight": self._in_flight,
            "arrival_rate_per_s": round(self._arrivals.rate(now), 3),
            "reserved_lag_ms": round(self._lag_reserve_seconds(now) * 1000.0, 3),
            "cost_ms_by_batch_size": {
                size: round(seconds * 1000.0, 4)
                for size, seconds in self.cost_curve.points().items()
            },
        }

    async def submit(self, texts: Sequence[str]) -> list[Any]:
        """Queue each text as one item and return their results in order.

        Raises QueueFull (nothing queued) when the items do not fit in `max_queue`,
        OverBudget (nothing queued; adaptive policy) when the queue ahead of them (or the
        batch running) would keep them past the latency budget, QueueStopping once stopping, and ItemError
        when an item failed (after all of the request's items are done). A caller
        cancelled while waiting takes its queued items out of the queue, counted
        `cancelled`.
        """
        if not self._accepting:
            raise QueueStopping("the service is stopping")
        now = self._clock()
        if self._queued + len(texts) > self.max_queue:
            self._reject(len(texts), "queue_full")
            raise QueueFull(
                f"queue full: {self._queued} of {self.max_queue} items waiting",
                self._retry_after_seconds(now),
            )
        loop = asyncio.get_running_loop()
        items = [_Item(text, self._count_tokens(text), loop.create_future(), now) for text in texts]
        # Refusing an item that finds the batcher idle shortens no wait, and serving it is
        # how an estimate a stalled batch inflated is measured again: without it, one
        # estimate over the budget refuses every item from then on.
        idle = self._queued == 0 and self._in_flight == 0
        if self.settings.mode == "adaptive" and not idle:
            drain_seconds = self._drain_seconds(now, items)
            allowed_seconds = self.settings.latency_budget_seconds * (1.0 - BUDGET_HEADROOM)
            if drain_seconds > allowed_seconds - self._lag_reserve_seconds(now):
                self._reject(len(texts), "budget")
                raise OverBudget(
                    f"over budget: the {self._queued} items queued ahead would take "
                    f"{drain_seconds * 1000.0:.1f} ms, the latency budget is "
                    f"{self.settings.latency_budget_seconds * 1000.0:g} ms",
                    self._retry_after_seconds(now),
                )
        for item in items:
            shape = shape_class(item.tokens)
            group = self._groups[shape]
            group.queue.append(item)
            group.record_arrival(now)
            if len(group.queue) >= self._wake_at_sizes.get(shape, 1):
                self._wake.set()
        self._queued += len(items)
        self._arrivals.record(now, len(items))
        self.metrics.set_queue_depth(self._queued)
        try:
            if len(items) == 1:  # the common case, without gather's machinery
                return [await items[0].future]
            results = await asyncio.gather(*(item.future for item in items), return_exceptions=True)
        except asyncio.CancelledError:
            self._withdraw(items)
            raise
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def _reject(self, count: int, reason: str) -> None:
        for _ in range(count):
            self.metrics.observe_request("rejected", reason=reason)

    def _drain_seconds(self, now: float, arriving: Sequence[_Item]) -> float:
        """Seconds until the queue, with `arriving` added, has run."""
        sizes = {shape: len(group.queue) for shape, group in self._groups.items()}
        for item in arriving:
            shape = shape_class(item.tokens)
            sizes[shape] = sizes.get(shape, 0) + 1
        return predicted_drain_seconds(
            list(sizes.values()),
            max(0.0, self._running_until - now),
            self.cost_curve.estimate,
            self.settings.max_batch_size,
        )

    def _withdraw(self, items: list[_Item]) -> None:
        """Take a cancelled caller's still-queued items out; running ones finish unseen."""
        queued = {id(item) for item in items if not item.taken}
        if not queued:
            return
        for group in self._groups.values():
            group.queue = collections.deque(i for i in group.queue if id(i) not in queued)
            if not group.queue:
                group.company_since = None
                group.company_allowance_seconds = None
        self._queued -= len(queued)
        for _ in queued:
            self.metrics.observe_request("cancelled")
        self.metrics.set_queue_depth(self._queued)

    def _retry_after_seconds(self, now: float) -> int:
        """Whole seconds until the current queue is expected to have run, at least 1."""
        return max(1, math.ceil(self._drain_seconds(now, ())))

    def _decide(self, group: _ShapeGroup, now: float) -> Decision:
        settings = self.settings
        oldest_wait_seconds = now - group.queue[0].enqueued_at
        if settings.mode == "fixed":
            return fixed_decision(
                len(group.queue),
                oldest_wait_seconds,
                settings.max_batch_size,
                settings.max_wait_seconds,
            )
        # Once draining no more items come: waiting for them would only add latency.
        rate = group.arrival_rate(now) if self._accepting else 0.0
        company_since = now if group.company_since is None else group.company_since
        return adaptive_decision(
            len(group.queue),
            oldest_wait_seconds,
            rate,
            self.cost_curve.estimate,
            settings.latency_budget_seconds,
            settings.max_batch_size,
            self._lag_reserve_seconds(now),
            waited_for_company_seconds=now - company_since,
            company_allowance_seconds=group.company_allowance_seconds,
        )

    def _lag_reserve_seconds(self, now: float) -> float:
        """The scheduling lag plans and admission keep free: LAG_RESERVE_FACTOR times the
        recent peak, capped at MAX_LAG_RESERVE of the budget."""
        return min(
            LAG_RESERVE_FACTOR * self._lag.value(now),
            MAX_LAG_RESERVE * self.settings.latency_budget_seconds,
        )

    async def _work(self) -> None:
        while True:
            self._wake.clear()
            waiting = {shape: g for shape, g in self._groups.items() if g.queue}
            if not waiting:
                if not self._accepting:
                    return
                self._wake_at_sizes = {}
                await self._wake.wait()
                continue
            now = self._clock()
            decisions = {shape: self._decide(group, now) for shape, group in waiting.items()}
            firing = [shape for shape, decision in decisions.items() if decision.fire]
            if firing:
                # The group whose oldest item has waited longest goes first.
                shape = min(firing, key=lambda s: waiting[s].queue[0].enqueued_at)
                await self._fire(waiting[shape], decisions[shape].trigger)
                continue
            for shape, decision in decisions.items():
                if waiting[shape].company_since is None:
                    waiting[shape].company_since = now
                    waiting[shape].company_allowance_seconds = decision.company_seconds
            self._wake_at_sizes = {s: d.target_size for s, d in decisions.items()}
            waits = [d.wait_seconds for d in decisions.values() if d.wait_seconds is not None]
            wait_seconds = min(waits) if waits else None
            try:
                async with asyncio.timeout(wait_seconds):
                    await self._wake.wait()
            except TimeoutError:
                # A timer that fires late (a busy event loop) delays every batch planned
                # on it: remember by how much.
                woke_at = self._clock()
                self._lag.observe(woke_at, woke_at - now - (wait_seconds or 0.0))

    def _take(self, group: _ShapeGroup) -> list[_Item]:
        group.company_since = None
        group.company_allowance_seconds = None
        batch: list[_Item] = []
        while group.queue and len(batch) < self.settings.max_batch_size:
            item = group.queue.popleft()
            self._queued -= 1
            item.taken = True
            # A caller cancelled a moment ago whose items are not withdrawn yet: its slot
            # goes to the next item instead of to work nobody will read.
            if item.future.cancelled():
                self.metrics.observe_request("cancelled")
            else:
                batch.append(item)
        self.metrics.set_queue_depth(self._queued)
        return batch

    def _padding_without_groups(self, size: int) -> int:
        """The padding a batch of `size` items would carry if taken in arrival order
        from every group, as an ungrouped queue would take them (the queue before the
        batch was taken, so call it first)."""
        in_order = heapq.merge(*(g.queue for g in self._groups.values()), key=_arrival)
        return padding_tokens([item.tokens for item in itertools.islice(in_order, size)])

    async def _fire(self, group: _ShapeGroup, trigger: str) -> None:
        ungrouped_padding = self._padding_without_groups(
            min(len(group.queue), self.settings.max_batch_size)
        )
        batch = self._take(group)
        if not batch:
            return
        size = len(batch)
        estimate_seconds = self.cost_curve.estimate(size)
        fired_at = self._clock()
        self._in_flight = size
        self._running_until = fired_at + estimate_seconds
        texts = [item.text for item in batch]
        if self._execute_elsewhere is not None:
            results, seconds = await self._execute_elsewhere(texts)
        else:
            loop = asyncio.get_running_loop()
            results, seconds = await loop.run_in_executor(self._executor, self._execute, texts)
        done_at = self._clock()
        self._in_flight = 0
        self.metrics.observe_batch(size, trigger, seconds)
        lengths = [item.tokens for item in batch]
        paid = padding_tokens(lengths)
        self.metrics.observe_padding(
            tokens=sum(lengths), padding=paid, avoided=max(0, ungrouped_padding - paid)
        )
        if not any(isinstance(result, ItemError) for result in results):
            # The budget also pays the hand-off to the model thread and back, so the curve
            # learns the round trip; a batch with retries would overstate its size's cost.
            self._lag.observe(done_at, done_at - fired_at - estimate_seconds)
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


def _arrival(item: _Item) -> float:
    return item.enqueued_at
