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

from demo_server.loadgen.workload import arrival_times

T = TypeVar("T")


@dataclass
class OpenLoopRun(Generic[T]):
    """What `open_loop` offered: each sent arrival's result in arrival order, the arrivals
    dropped for finding `max_in_flight` sends in flight, how late each send started
    (seconds after its scheduled time), and the seconds from the start to the last return."""

    results: list[T] = field(default_factory=list)
    dropped: int = 0
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
) -> OpenLoopRun[T]:
    """Arrivals at `rate_per_s` for `duration_s` (times drawn from `rng` first, by
    `process` and `burstiness`), each one starting `send(index, scheduled_at)` as a task;
    `scheduled_at` is on `clock`, and `index` counts every arrival, dropped ones too.
    Returns when every send has returned; an exception a send raises is raised here."""
    schedule = arrival_times(rate_per_s, duration_s, rng, process, burstiness)
    run: OpenLoopRun[T] = OpenLoopRun()
    tasks: list[asyncio.Task[T]] = []
    in_flight: set[asyncio.Task[T]] = set()
    start = clock()
    for index, offset in enumerate(schedule):
        delay = start + offset - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if max_in_flight is not None and len(in_flight) >= max_in_flight:
            run.dropped += 1
            continue
        run.send_lags_s.append(clock() - start - offset)
        task = asyncio.create_task(send(index, start + offset))
        tasks.append(task)
        if max_in_flight is not None:
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
    run.results = list(await asyncio.gather(*tasks))
    run.elapsed_s = clock() - start
    return run
