"""The open-loop arrival driver: requests sent at their scheduled times, answered or not.

`open_loop` draws the arrival times (`workload.arrival_times`) and starts `send` at each,
whether or not earlier sends have returned, so a slow receiver shows up as latency
instead of as a lower offered load. The clock is injectable: a test on a virtual loop
passes the loop's own (`loop.time`), and the sleeps between arrivals follow the loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from batchscope.demo_server.loadgen.workload import arrival_times

T = TypeVar("T")


@dataclass
class OpenLoopRun(Generic[T]):
    """What `open_loop` offered: each sent arrival's result in arrival order, the arrivals
    dropped for finding `max_in_flight` sends in flight, how late each send started
    (seconds after its scheduled time), and the seconds from the start to the last return.
    A send cancelled at a stop has its CancelledError as its result."""

    results: list[T | BaseException] = field(default_factory=list)
    dropped: int = 0
    # Set when `stop` ended the arrivals early: the offset it did (s), and the sends
    # cancelled then, in flight.
    stopped_at_s: float | None = None
    cancelled: int = 0
    send_lags_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def sent(self) -> int:
        return len(self.results)


async def open_loop(
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
    send: Callable[[int, float], Coroutine[Any, Any, T]],
    *,
    process: str = "poisson",
    burstiness: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
    max_in_flight: int | None = None,
    stop: asyncio.Event | None = None,
) -> OpenLoopRun[T]:
    """Arrivals at `rate_per_s` for `duration_s` (times drawn from `rng` first, by
    `process` and `burstiness`), each one starting `send(index, scheduled_at)` as a task;
    `scheduled_at` is on `clock`, and `index` counts every arrival, dropped ones too.
    Returns when every send has returned; an exception a send raises is raised here.
    `stop` set (an over-saturated step) ends the arrivals and cancels the sends in flight."""
    schedule = arrival_times(rate_per_s, duration_s, rng, process, burstiness)
    run: OpenLoopRun[T] = OpenLoopRun()
    tasks: list[asyncio.Task[T]] = []
    in_flight: set[asyncio.Task[T]] = set()
    start = clock()
    stopped = stop or asyncio.Event()
    for index, offset in enumerate(schedule):
        delay = start + offset - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if stopped.is_set():  # seen at the next arrival: within one gap of the stop
            run.stopped_at_s = clock() - start
            break
        if max_in_flight is not None and len(in_flight) >= max_in_flight:
            run.dropped += 1
            continue
        run.send_lags_s.append(clock() - start - offset)
        task = asyncio.create_task(send(index, start + offset))
        tasks.append(task)
        if max_in_flight is not None:
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
    if run.stopped_at_s is not None:
        cancelling = [task for task in tasks if task.cancel()]
        run.cancelled = len(cancelling)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, Exception):
                raise outcome
        run.results = list(done)
    else:
        run.results = list(await asyncio.gather(*tasks))
    run.elapsed_s = clock() - start
    return run
