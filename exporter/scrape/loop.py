"""The exporter's loop: scrape every target each interval, keep windows, evaluate signals.

All I/O is here (HTTP, clock, file_sd reloads); the math it calls is pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from batchscope.exporter.config.file_sd import expand_file_sd
from batchscope.exporter.config.fleet_file import load_file_sd
from batchscope.exporter.config.settings import ConfigError, Settings, Target
from batchscope.exporter.core.evaluate import (
    TOTAL,
    TargetIdentity,
    TargetSignals,
    evaluate_window,
    held_saturation,
    held_slo,
    unreadable_signals,
)
from batchscope.exporter.core.signals import SaturationState, SignalSettings, staleness
from batchscope.exporter.core.slo import DAY_SECONDS
from batchscope.exporter.core.snapshot import LabelKey, Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines import NoSamplesYet, UnrecognisedPayload, read_series
from batchscope.exporter.ingest.promtext import ParseError, SampleLimitExceeded
from batchscope.exporter.scrape.fetch import ScrapeResult, client_session, scrape

log = logging.getLogger("batchscope.exporter")

# Fetches one target's payload: `fetch.scrape`'s signature.
ScrapeTarget = Callable[[aiohttp.ClientSession, Target, float, int], Awaitable[ScrapeResult]]

# At most this many scrapes in flight: 1000 targets do not open 1000 sockets at once.
MAX_CONCURRENT_SCRAPES = 128
# Targets whose last scrape failed wait for slots of their own: a hung fleet never takes
# the slots of the healthy targets.
MAX_CONCURRENT_FAILING_SCRAPES = 32
# Consecutive failures before a dead target is backed off, and the longest back-off.
BACKOFF_AFTER_FAILURES = 3
MAX_BACKOFF_INTERVALS = 8


def backoff_intervals(failures: int) -> int:
    """Intervals until a target's next scrape after `failures` consecutive failed scrapes:
    1 until BACKOFF_AFTER_FAILURES, then doubling up to MAX_BACKOFF_INTERVALS."""
    if failures < BACKOFF_AFTER_FAILURES:
        return 1
    return min(2 ** (failures - BACKOFF_AFTER_FAILURES + 1), MAX_BACKOFF_INTERVALS)


# Scrapes start on a grid of ticks this far apart (the interval cut in whole ticks), and
# the scrapes that end within a tick are evaluated together at its end, each at the time
# it ended: the fleet's scrapes stay spread over the interval while the code that sends,
# reads and evaluates them runs in bursts, its working set warm. The plain twin,
# `Exporter(tick_batching=False)`, evaluates each scrape as it ends, off the grid.
TICK_SECONDS = 0.1
# Below this many ticks an interval, phases are not rounded: too few ticks would crowd
# the fleet's scrapes into a few instants.
MIN_TICKS = 10


def phase(name: str, interval: float, grid: bool = True) -> float:
    """Where in the interval a target is scraped, 0..1, fixed by its name and, for an
    interval of MIN_TICKS ticks or more and `grid`, on the tick grid: scrapes spread over
    the interval (no thundering herd) and each target keeps its own rhythm."""
    spot = zlib.crc32(name.encode())
    ticks = round(interval / TICK_SECONDS)
    if not grid or ticks < MIN_TICKS:
        return spot / 2**32
    return (spot * ticks >> 32) / ticks


def signal_settings(target: Target, settings: Settings) -> SignalSettings:
    return SignalSettings(
        cap=target.cap,
        token_cap=target.token_cap,
        token_budget=target.max_num_batched_tokens,
        budget_seconds=target.budget_seconds,
        quantile=target.quantile,
        histogram=target.histogram,
        saturation_threshold=settings.saturation_threshold,
        hold_seconds=settings.hold_seconds,
        stale_seconds=stale_seconds(settings),
        slo_objective=target.slo_objective,
        slo_window_scale=settings.slo_window_scale,
        slo_period_seconds=settings.slo_period_days * DAY_SECONDS,
    )


def identity(target: Target) -> TargetIdentity:
    """The configured target as its signals name it."""
    return TargetIdentity(target.name, target.url, dict(target.labels))


def stale_seconds(settings: Settings) -> float:
    """How long a target may go unread before its held states end, a saturated episode
    the hold longer (`staleness`)."""
    return staleness(settings.hold_seconds, settings.interval_seconds)


# Why a payload could not be read, as `batchscope_target_errors_total` counts it.
PAYLOAD_ERRORS: dict[type[Exception], str] = {
    SampleLimitExceeded: "series_limit",
    ParseError: "parse",
    UnrecognisedPayload: "unrecognised",
}


def read_payload(
    target: Target, t: float, scrape: ScrapeResult, sample_limit: int | None = None
) -> tuple[Snapshot, str | None]:
    """Turn a scrape into a snapshot, and the error reason when the payload was unreadable.

    A payload no adapter can read marks the target down; registered families without
    samples are up with no series. Any other exception (a value an adapter cannot read)
    propagates: the caller isolates it to this target.
    """
    seconds = scrape.seconds
    if scrape.text is None:
        return Snapshot(target.name, t, False, error=scrape.error, scrape_seconds=seconds), None
    try:
        series = read_series(scrape.text, target.engine, sample_limit, target.histogram)
    except NoSamplesYet:
        return Snapshot(target.name, t, True, (), scrape_seconds=seconds), None
    except (ParseError, SampleLimitExceeded, UnrecognisedPayload) as err:
        reason = next(r for kind, r in PAYLOAD_ERRORS.items() if isinstance(err, kind))
        return Snapshot(
            target.name, t, False, error=f"unreadable payload: {err}", scrape_seconds=seconds
        ), reason
    return Snapshot(target.name, t, True, series, scrape_seconds=seconds), None


@dataclass
class ScrapeSlots:
    """Scrape slots: the healthy targets' and, apart, those of targets that failed."""

    healthy: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
    )
    failing: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(MAX_CONCURRENT_FAILING_SCRAPES)
    )


# Compared and hashed by identity: what a reader keeps of a target (serve's history) is
# kept by its state, and goes with it.
@dataclass(eq=False)
class TargetState:
    target: Target
    window: Window
    # The target as its signals name it, made once rather than at every evaluation.
    identity: TargetIdentity = field(init=False)
    saturation: dict[LabelKey, SaturationState] = field(default_factory=dict)
    signals: TargetSignals | None = None
    errors: Counter[str] = field(default_factory=Counter)
    window_resets: Counter[str] = field(default_factory=Counter)
    # The engines of the last readable payload: another one on the same URL resets the window.
    engines: frozenset[str] = frozenset()
    # Scrapes failed in a row (no payload): backs a dead target off, and moves it to the
    # failing targets' slots.
    failures: int = 0
    # The last problem logged, so that each one is logged once, when it changes.
    logged_error: str | None = None

    def __post_init__(self) -> None:
        self.identity = identity(self.target)


class Exporter:
    """Owns the targets' state; `run_round` does one scrape-and-evaluate pass."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        *,
        tick_batching: bool = True,
        scrape_target: ScrapeTarget = scrape,
    ) -> None:
        self.settings = settings
        self.clock = clock
        # What fetches one target's payload (tests give one that answers in virtual time).
        self.scrape_target = scrape_target
        # Scrapes on the tick grid, each tick's evaluations together (TICK_SECONDS); False:
        # phases off the grid, each scrape evaluated as it ends. Read by each watcher as it
        # starts and at every scrape.
        self.tick_batching = tick_batching
        self.states: dict[str, TargetState] = {}
        # Called with each evaluation of a target, once its window has it (serve's history
        # listens here): the loop hands its results down to the outputs, never up.
        self.listeners: list[Callable[[TargetState, TargetSignals], None]] = []
        self._file_sd_targets: dict[str, list[Target]] = {}
        # Rounds completed: readers cache what they render once per round.
        self.rounds = 0
        self._round_event = asyncio.Event()
        # Scrapes ended and not yet evaluated: (state, result, time it ended).
        self._pending: list[tuple[TargetState, ScrapeResult, float]] = []
        self._sync_targets()

    # -- target set -------------------------------------------------------------

    def _reload_file_sd(self) -> None:
        current = {str(p) for p in expand_file_sd(self.settings.file_sd)}
        for gone in set(self._file_sd_targets) - current:
            del self._file_sd_targets[gone]  # a deleted file takes its targets with it
        for path in sorted(current):
            try:
                self._file_sd_targets[path] = load_file_sd(path)
            except ConfigError as err:
                # Keep the last good targets of this file: a half-written file must not
                # drop a fleet from monitoring.
                log.warning("file_sd %s not reloaded: %s", path, err)

    def targets(self) -> list[Target]:
        """The targets to monitor: configured ones, then those file_sd discovered; with a
        shard, only those of this exporter's shard."""
        found = list(self.settings.targets)
        for targets in self._file_sd_targets.values():
            found.extend(targets)
        unique: dict[str, Target] = {}
        for t in found:
            if self.settings.in_shard(t.name):
                unique.setdefault(t.name, t)
        return list(unique.values())

    def _sync_targets(self) -> None:
        if self.settings.file_sd:
            self._reload_file_sd()
        wanted = {t.name: t for t in self.targets()}
        for name in list(self.states):
            if name not in wanted:
                del self.states[name]
        for name, target in wanted.items():
            state = self.states.get(name)
            if state is None or state.target != target:
                self.states[name] = TargetState(target, self._new_window(target))

    def _new_window(self, target: Target) -> Window:
        return Window(self.settings.window_seconds, signal_settings(target, self.settings))

    # -- one round ----------------------------------------------------------------

    def ingest(self, state: TargetState, snapshot: Snapshot, now: float) -> TargetSignals:
        """Add a snapshot to a target's window and re-evaluate its signals.

        Another engine on the same URL (a port taken over) starts the window again: two
        engines' counters in one window would read as a false rate. The listeners are
        told by the caller (`notify`), outside the evaluation's error handling.
        """
        engines = frozenset(s.engine for s in snapshot.series)
        if engines and state.engines and engines != state.engines:
            log.warning(
                "target %s: engine changed from %s to %s; its window starts again",
                state.target.name,
                "+".join(sorted(state.engines)),
                "+".join(sorted(engines)),
            )
            state.window = self._new_window(state.target)
            state.saturation = {}
            state.window_resets["engine_changed"] += 1
        if engines:
            state.engines = engines
        state.window.add(snapshot)
        signals, state.saturation = evaluate_window(
            state.identity, state.window, state.saturation, now
        )
        state.signals = signals
        return signals

    def notify(self, state: TargetState, signals: TargetSignals) -> None:
        """Tell each listener (the history, ...) of an evaluation. A listener that raises is
        logged and the others still run: its bug never makes a good evaluation a failed one."""
        for listener in self.listeners:
            try:
                listener(state, signals)
            except Exception:  # noqa: BLE001 - one listener must not end the round
                log.exception("target %s: listener %r failed", state.target.name, listener)

    async def _scrape_one(
        self,
        session: aiohttp.ClientSession,
        slots: ScrapeSlots,
        state: TargetState,
        *,
        batched: bool = False,
    ) -> None:
        """Scrape one target; evaluate the scrape now, or `batched`: TICK_SECONDS after the
        first scrape not yet evaluated ended, with every scrape that ended meanwhile."""
        async with slots.failing if state.failures else slots.healthy:
            result = await self.scrape_target(
                session,
                state.target,
                self.settings.timeout_seconds,
                self.settings.max_response_bytes,
            )
        state.failures = 0 if result.text is not None else state.failures + 1
        if not batched:
            self.evaluate(state, result, self.clock())
            return
        if not self._pending:
            asyncio.get_running_loop().call_later(TICK_SECONDS, self._evaluate_pending)
        self._pending.append((state, result, self.clock()))

    def _evaluate_pending(self) -> None:
        """Evaluate the scrapes queued by `_scrape_one`, each at the time it ended."""
        pending, self._pending = self._pending, []
        for state, result, now in pending:
            if self.states.get(state.target.name) is not state:
                continue  # the target left the configuration (or changed) meanwhile
            try:
                self.evaluate(state, result, now)
            except Exception:  # a bug must not cost the batch's other targets their scrape
                log.exception("target %s: evaluation failed", state.target.name)

    def evaluate(self, state: TargetState, result: ScrapeResult, now: float) -> TargetSignals:
        """Ingest one scrape of one target. Whatever its payload does, the exception stays
        with this target: it is up with the error as its state, counted and logged."""
        target = state.target
        try:
            snapshot, reason = read_payload(target, now, result, self.settings.sample_limit)
            signals = self.ingest(state, snapshot, now)
        except Exception as err:  # noqa: BLE001 - one target's payload must not end the round
            reason = "evaluation"
            error = f"evaluation failed: {type(err).__name__}: {err}"
            state.saturation = held_saturation(state.saturation, now, state.window.settings)
            held = state.saturation.get(TOTAL)
            signals = unreadable_signals(
                state.identity,
                now,
                error,
                state.window.settings,
                result.seconds,
                held,
                held_slo(state.window, held, now),
            )
        self.notify(state, signals)
        if reason is not None:
            state.errors[reason] += 1
        if signals.error != state.logged_error:
            if signals.error is None:
                log.info("target %s: readable again", target.name)
            else:
                log.warning("target %s: %s", target.name, signals.error)
            state.logged_error = signals.error
        state.signals = signals.with_counts(dict(state.errors), dict(state.window_resets))
        return state.signals

    async def run_round(self, session: aiohttp.ClientSession) -> None:
        """Scrape every target now, concurrently, and wait for all (tests, profiling)."""
        self._sync_targets()
        slots = ScrapeSlots()
        await asyncio.gather(
            *(self._scrape_one(session, slots, s) for s in list(self.states.values()))
        )
        self._next_round()

    async def _watch(
        self, session: aiohttp.ClientSession, slots: ScrapeSlots, name: str, start: float
    ) -> None:
        """Scrape one target at its phase of every interval, for as long as it is monitored.

        A slow scrape delays only this target; a dead one is backed off. A scrape never
        overlaps the previous one of the same target.
        """
        interval = self.settings.interval_seconds
        due = start + phase(name, interval, self.tick_batching) * interval
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            state = self.states.get(name)
            if state is None:
                return
            try:
                await self._scrape_one(session, slots, state, batched=self.tick_batching)
            except Exception:  # a bug must not end this target's monitoring
                log.exception("target %s: scrape failed", name)
            due += interval * backoff_intervals(state.failures)
            late = loop.time() - due
            if late > 0:  # skip the slots already missed, keep the phase
                due += interval * math.ceil(late / interval)

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Scrape every target once an interval, spread over it, until `stop` is set.

        Every interval the target set is synced (file_sd) and `rounds` advances: readers
        render once per round.
        """
        slots = ScrapeSlots()
        watchers: dict[str, asyncio.Task] = {}
        # The schedule runs on the event loop's clock (monotonic; virtual time in tests).
        start = asyncio.get_running_loop().time()
        async with client_session(
            MAX_CONCURRENT_SCRAPES + MAX_CONCURRENT_FAILING_SCRAPES
        ) as session:
            try:
                while not stop.is_set():
                    self._sync_targets()
                    for name in set(watchers) - set(self.states):
                        watchers.pop(name).cancel()
                    for name in set(self.states) - set(watchers):
                        watchers[name] = asyncio.create_task(
                            self._watch(session, slots, name, start)
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.settings.interval_seconds)
                    self._next_round()
            finally:
                for task in watchers.values():
                    task.cancel()
                await asyncio.gather(*watchers.values(), return_exceptions=True)
                self._evaluate_pending()  # the last scrapes count: none is dropped at stop

    def _next_round(self) -> None:
        self.rounds += 1
        self._round_event.set()
        self._round_event = asyncio.Event()

    async def round_after(self, seen: int) -> int:
        """Wait until a round later than `seen` has completed; returns its number."""
        while self.rounds <= seen:
            await self._round_event.wait()
        return self.rounds

    # -- views ----------------------------------------------------------------------

    def current(self) -> list[TargetSignals]:
        """Every target's latest signals (targets not yet scraped are left out)."""
        return [s.signals for s in self.states.values() if s.signals is not None]

    def latest(self, name: str) -> list[TargetSignals] | None:
        """A target's latest signals, as a list (empty before its first scrape); None for a
        name not monitored."""
        state = self.states.get(name)
        if state is None:
            return None
        return [] if state.signals is None else [state.signals]
