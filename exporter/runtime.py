"""The exporter's loop: scrape every target each interval, keep windows, evaluate signals.

All I/O is here (HTTP, clock, file_sd reloads); the math it calls is pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from exporter import api
from exporter.config import ConfigError, Settings, Target, load_file_sd
from exporter.engines import UnrecognisedPayload, read_series
from exporter.file_sd import expand_file_sd
from exporter.promtext import ParseError
from exporter.scrape import scrape
from exporter.signals import SaturationState, SignalSettings
from exporter.snapshot import LabelKey, Snapshot
from exporter.target import TargetSignals, evaluate_target
from exporter.window import Window

log = logging.getLogger("batchscope.exporter")

# At most this many scrapes in flight: 1000 targets do not open 1000 sockets at once.
MAX_CONCURRENT_SCRAPES = 128


def signal_settings(target: Target, settings: Settings) -> SignalSettings:
    return SignalSettings(
        cap=target.cap,
        token_cap=target.token_cap,
        budget_seconds=target.budget_seconds,
        quantile=target.quantile,
        histogram=target.histogram,
        saturation_threshold=settings.saturation_threshold,
        hold_seconds=settings.hold_seconds,
    )


def snapshot_from_payload(
    target: Target, t: float, text: str | None, error: str | None, seconds: float
) -> Snapshot:
    """Turn a scrape into a snapshot; a payload no adapter can read marks the target down."""
    if text is None:
        return Snapshot(target.name, t, False, error=error, scrape_seconds=seconds)
    try:
        series = read_series(text, target.engine)
    except (ParseError, UnrecognisedPayload) as err:
        return Snapshot(target.name, t, False, error=f"unreadable payload: {err}",
                        scrape_seconds=seconds)  # fmt: skip
    return Snapshot(target.name, t, True, series, scrape_seconds=seconds)


@dataclass
class TargetState:
    target: Target
    window: Window
    history: deque
    saturation: dict[LabelKey, SaturationState] = field(default_factory=dict)
    signals: TargetSignals | None = None


class Exporter:
    """Owns the targets' state; `run_round` does one scrape-and-evaluate pass."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.states: dict[str, TargetState] = {}
        self._file_sd_targets: dict[str, list[Target]] = {}
        # Rounds completed: readers cache what they render once per round.
        self.rounds = 0
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
        """The targets to monitor: configured ones, then those file_sd discovered."""
        found = list(self.settings.targets)
        for targets in self._file_sd_targets.values():
            found.extend(targets)
        unique: dict[str, Target] = {}
        for t in found:
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
                self.states[name] = TargetState(
                    target,
                    Window(self.settings.window_seconds),
                    deque(maxlen=self.settings.history_points),
                )

    # -- one round ----------------------------------------------------------------

    def ingest(self, state: TargetState, snapshot: Snapshot, now: float) -> TargetSignals:
        """Add a snapshot to a target's window and re-evaluate its signals."""
        state.window.add(snapshot)
        signals, state.saturation = evaluate_target(
            state.target.name,
            state.target.url,
            state.window.snapshots(),
            signal_settings(state.target, self.settings),
            state.saturation,
            now,
            dict(state.target.labels),
        )
        state.signals = signals
        state.history.append(api.history_point(signals))
        return signals

    async def _scrape_one(
        self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, state: TargetState
    ) -> None:
        async with gate:
            result = await scrape(
                session,
                state.target,
                self.settings.timeout_seconds,
                self.settings.max_response_bytes,
            )
        now = self.clock()
        snapshot = snapshot_from_payload(
            state.target, now, result.text, result.error, result.seconds
        )
        if not snapshot.up:
            log.debug("target %s down: %s", state.target.name, snapshot.error)
        self.ingest(state, snapshot, now)

    async def run_round(self, session: aiohttp.ClientSession) -> None:
        """Scrape every target concurrently; a slow one only delays itself, up to its timeout."""
        self._sync_targets()
        gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
        await asyncio.gather(
            *(self._scrape_one(session, gate, s) for s in list(self.states.values()))
        )
        self.rounds += 1

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Run a round every interval until `stop` is set."""
        connector = aiohttp.TCPConnector(limit=MAX_CONCURRENT_SCRAPES, ttl_dns_cache=300)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.run_round(session)
                except Exception:  # a bug in one round must not end monitoring
                    log.exception("scrape round failed")
                elapsed = time.monotonic() - started
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stop.wait(), timeout=max(0.0, self.settings.interval_seconds - elapsed)
                    )

    # -- views ----------------------------------------------------------------------

    def current(self) -> list[TargetSignals]:
        """Every target's latest signals (targets not yet scraped are left out)."""
        return [s.signals for s in self.states.values() if s.signals is not None]

    def history(self, name: str) -> list[dict] | None:
        """A target's history points, oldest first; None for a name not monitored."""
        state = self.states.get(name)
        return None if state is None else list(state.history)

    def histories(self) -> dict[str, list[dict]]:
        """Every monitored target's history points by name."""
        return {name: list(state.history) for name, state in self.states.items()}
