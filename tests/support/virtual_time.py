"""An asyncio event loop on a virtual clock, for tests whose claims are about timing.

`run_virtual(main)` runs a coroutine on `VirtualTimeLoop`: `loop.time()` starts at 0 and
moves only when every task is waiting, jumping to the next timer at once. CPU work
takes no virtual time, so a loaded machine cannot make a timer late and a fast one
cannot make a wait short: what a scenario measures with `loop.time()` follows from its
arrivals and its simulated costs alone. A scenario in virtual time must not wait for a
thread (the batcher takes an `execute` for that, see `VirtualDevice`).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# How long the loop waits, in real time, for a wake-up from outside it (a signal or a
# thread) when it has no timer left; past that the scenario can never finish.
STUCK_SECONDS = 5.0


class _VirtualSelector(selectors.DefaultSelector):
    """Polls without blocking; where the loop would sleep until a timer, moves the
    virtual clock there instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            ready = super().select(STUCK_SECONDS)
            if not ready:
                raise RuntimeError(
                    f"virtual time: no timer is left and nothing woke the loop in "
                    f"{STUCK_SECONDS:g} s of real time: the scenario waits forever"
                )
            return ready
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a fresh `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)


def loop_clock() -> Callable[[], float]:
    """The running loop's clock: virtual seconds under `run_virtual`."""
    return asyncio.get_running_loop().time
