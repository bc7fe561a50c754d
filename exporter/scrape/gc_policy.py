"""How the exporter's process uses Python's cyclic garbage collector.

The exporter keeps every target's window and signals for tens of seconds, and replaces
a little of it on every scrape: at 1,000 targets each object lives long enough to reach
the oldest generation, and CPython's default policy then runs a full collection (every
object in the process) whenever a quarter of that generation is new, about every 5 s,
0.2 s each, for garbage the exporter barely makes: its state holds no reference cycles
and is freed by reference counting when it leaves the window. What the default policy
costs at 1,000 targets is measured in docs/benchmarks.md.

So: no automatic collection at all, young (CPython's runs every 700 container allocations
net of frees), middle or full, and `full_collections` runs a full one every
FULL_COLLECTION_SECONDS, so that a cycle is still freed. Each runs right after a
`/metrics` answer (the app sets `answered`), when one comes within another
FULL_COLLECTION_SECONDS: the pause then falls in the gap before the next scrape, not in
front of one. What was allocated at start (modules, configuration) is frozen out of
every collection (`gc.freeze`). On a Python whose collector works otherwise (3.14's is
incremental) the thresholds mean something else, and nothing breaks.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("batchscope.exporter")

# Container allocations (net of frees) between young collections: never, in practice. A
# round allocates a fleet's new windows and signals and frees the last round's, and in
# steady state the young collections freed nothing (the collector's own count of objects
# collected did not move); they walked the round's survivors, at any threshold: at 1,000
# targets every second (20,000, about 11 ms each: 6% of the exporter's CPU, 0.94x side by
# side, docs/benchmarks.md); at 2,000 targets 2% of a core at 20,000 and 3% at 100,000
# (80 to 165 ms each, the round's survivors having had longer to pile up). Without them
# the objects a round replaces die where they were born, never walked, and what does
# become a cycle waits for the full collection every FULL_COLLECTION_SECONDS: none in
# steady state, failing targets included, since closed connections no longer make any
# (http_client.py).
YOUNG_THRESHOLD = 1_000_000_000
# Young collections between middle ones, and middle ones between full ones: never, in
# practice, as the young ones are. When young collections ran (every 20,000 allocations),
# a middle one (every 20 of them, CPython's 10) walked the 20 s of windows, signals and
# history that had survived a young one, 90 ms each at 1,000 targets, about 3% of the
# exporter's CPU, and in steady state freed nothing.
MIDDLE_THRESHOLD = 1_000_000_000
NO_AUTOMATIC_FULL = 1_000_000_000
FULL_COLLECTION_SECONDS = 300.0
# After a /metrics answer, the time its body is given to leave before the collection.
AFTER_ANSWER_SECONDS = 0.05
# A full collection that pauses the exporter longer than this is logged at INFO.
NOTABLE_PAUSE_SECONDS = 0.5


def configure() -> tuple[int, ...]:
    """Apply the policy to this process; returns the thresholds it replaced."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, NO_AUTOMATIC_FULL)
    return before


async def full_collections(
    stop: asyncio.Event,
    every: float = FULL_COLLECTION_SECONDS,
    answered: asyncio.Event | None = None,
) -> None:
    """A full collection every `every` seconds until `stop` is set (the automatic one is
    off, see `configure`); with `answered`, each waits for it to be set (a `/metrics`
    answer) after those seconds, at most `every` seconds more."""
    while not await _stopped(stop, every):
        if answered is not None:
            answered.clear()
            await _first_of(answered, stop, every)
            if stop.is_set():
                return
            await asyncio.sleep(AFTER_ANSWER_SECONDS)
        started = time.perf_counter()
        found = gc.collect()
        seconds = time.perf_counter() - started
        # It pauses the event loop: a long pause is worth knowing (scrapes wait on it).
        level = logging.INFO if seconds > NOTABLE_PAUSE_SECONDS else logging.DEBUG
        log.log(level, "full garbage collection: %d unreachable objects, %.3f s", found, seconds)


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Whether `stop` was set within `seconds`."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _first_of(answered: asyncio.Event, stop: asyncio.Event, seconds: float) -> None:
    """Until `answered` or `stop` is set, or `seconds` pass."""
    waits = [asyncio.ensure_future(answered.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
