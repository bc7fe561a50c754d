"""Signals of a whole target: every series plus the target total, from its window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.signals import (
    SaturationState,
    SeriesSignals,
    SignalSettings,
    down_signals,
    series_signals,
    total_series,
)
from exporter.snapshot import LabelKey, SeriesSnapshot, Snapshot

TOTAL: LabelKey = ()


@dataclass(frozen=True, slots=True)
class TargetSignals:
    """What the exporter knows about one target at one evaluation."""

    target: str
    url: str
    t: float
    up: bool
    error: str | None
    series: tuple[SeriesSignals, ...]
    total: SeriesSignals
    scrape_seconds: float | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "url": self.url,
            "t": self.t,
            "up": self.up,
            "error": self.error,
            "scrape_seconds": self.scrape_seconds,
            "series": [s.to_dict() for s in self.series],
            "total": self.total.to_dict(),
        }


def _points(
    snapshots: Sequence[Snapshot], pick
) -> dict[LabelKey, list[tuple[float, SeriesSnapshot]]]:
    points: dict[LabelKey, list[tuple[float, SeriesSnapshot]]] = {}
    for snap in snapshots:
        if not snap.up:
            continue
        for key, series in pick(snap):
            points.setdefault(key, []).append((snap.t, series))
    return points


def evaluate_target(
    name: str,
    url: str,
    snapshots: Sequence[Snapshot],
    settings: SignalSettings,
    saturation: dict[LabelKey, SaturationState],
    now: float,
) -> tuple[TargetSignals, dict[LabelKey, SaturationState]]:
    """Signals for one target from its window; returns them and the next saturation states.

    The newest snapshot decides up/down. Series absent from the newest snapshot (a model
    that was unloaded) are dropped; the total is computed like any series, over the
    merged series of each scrape, so its own saturation state is kept under key ().
    """
    latest = snapshots[-1]
    if not latest.up:
        down = down_signals({}, latest.error, settings)
        return TargetSignals(name, url, latest.t, False, latest.error, (), down,
                             latest.scrape_seconds), {}  # fmt: skip
    current_keys = {s.key for s in latest.series}
    by_key = _points(
        snapshots,
        lambda snap: ((s.key, s) for s in snap.series),
    )
    totals = _points(
        snapshots,
        lambda snap: [(TOTAL, total_series(snap.series, settings.cap))],
    )
    next_states: dict[LabelKey, SaturationState] = {}
    series = []
    for key in sorted(current_keys):
        signals, next_states[key] = series_signals(
            by_key[key], settings, saturation.get(key, SaturationState()), now
        )
        series.append(signals)
    total, next_states[TOTAL] = series_signals(
        totals[TOTAL], settings, saturation.get(TOTAL, SaturationState()), now
    )
    return (
        TargetSignals(name, url, latest.t, True, None, tuple(series), total, latest.scrape_seconds),
        next_states,
    )
