"""Episodes from a history of evaluations: budget saturation (start, end, peak
utilisation) and SLO burn (start, end, speed, lowest attainment)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from batchscope.exporter.alerts.specs import SLO_BURN_FAST, SLO_BURN_SLOW

# Which alert each burning speed raises, and what it asks of the operator.
SPEED_ALERTS = {
    "fast": (SLO_BURN_FAST.name, "page"),
    "slow": (SLO_BURN_SLOW.name, "ticket"),
}


@dataclass(frozen=True, slots=True)
class Stretch:
    """A stretch of one target's history; `end` is None while it lasts."""

    target: str
    start: float
    end: float | None

    def seconds(self, now: float) -> float:
        return (now if self.end is None else self.end) - self.start


@dataclass(frozen=True, slots=True)
class Episode(Stretch):
    """One stretch of sustained budget saturation, with its peak utilisation."""

    peak_utilization: float | None


def _known(value: object) -> float | None:
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) else None


def saturation_episodes(frame: pd.DataFrame, target: str = "") -> list[Episode]:
    """The episodes in one target's history (columns t, budget_saturated, budget_utilization).

    An episode starts at the first evaluation flagged saturated, or earlier when the
    history says how long utilisation had already been at the threshold
    (`budget_saturated_seconds`), and ends at the first evaluation that is not.
    """
    if frame.empty:
        return []
    ordered = frame.sort_values("t")
    times = ordered["t"].to_numpy(dtype="float64")
    saturated = ordered["budget_saturated"].fillna(False).astype(bool).to_numpy()
    utilization = ordered["budget_utilization"].to_numpy(dtype="float64", na_value=math.nan)
    above = (
        ordered["budget_saturated_seconds"].to_numpy(dtype="float64", na_value=math.nan)
        if "budget_saturated_seconds" in ordered.columns
        else None
    )
    return [
        _episode(target, times, utilization, above, first, end)
        for first, end in _stretches(saturated)
    ]


def _stretches(flags) -> list[tuple[int, int | None]]:
    """(first index flagged, first index after it not flagged, None while it lasts) of each
    run of flagged evaluations, in order."""
    found = []
    start: int | None = None
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            found.append((start, i))
            start = None
    if start is not None:
        found.append((start, None))
    return found


def _episode(target, times, utilization, above, first: int, end: int | None) -> Episode:
    start = float(times[first])
    if above is not None and math.isfinite(above[first]) and above[first] > 0:
        start -= float(above[first])
    span = utilization[first:end]
    known = span[~pd.isna(span)]
    return Episode(
        target=target,
        start=start,
        end=None if end is None else float(times[end]),
        peak_utilization=float(known.max()) if len(known) else None,
    )


def fleet_episodes(history: pd.DataFrame) -> list[Episode]:
    """Every target's saturation episodes from a long frame with a `target` column, latest
    first."""
    return _across_fleet(history, saturation_episodes)


def _across_fleet(history: pd.DataFrame, episodes_of: Callable[[pd.DataFrame, str], list]) -> list:
    """`episodes_of` each target's frame of a long history, latest first."""
    found = [
        episode
        for name, frame in history.groupby("target", sort=True)
        for episode in episodes_of(frame, str(name))
    ]
    return sorted(found, key=lambda e: e.start, reverse=True)


def episodes_frame(episodes: list[Episode], now: float) -> pd.DataFrame:
    """The episodes as the Alerts table shows them."""
    return pd.DataFrame(
        [
            {
                "target": e.target,
                "start": pd.Timestamp(e.start, unit="s", tz="UTC"),
                "end": pd.NaT if e.end is None else pd.Timestamp(e.end, unit="s", tz="UTC"),
                "ongoing": e.end is None,
                "duration_seconds": e.seconds(now),
                "peak_utilization": e.peak_utilization,
            }
            for e in episodes
        ],
        columns=["target", "start", "end", "ongoing", "duration_seconds", "peak_utilization"],
    )


@dataclass(frozen=True, slots=True)
class BurnEpisode(Stretch):
    """One stretch of an SLO burn alert's condition (`speed`: fast pages, slow opens a
    ticket), with the lowest attainment the window had in it."""

    speed: str
    lowest_attainment: float | None


BURN_SPEEDS = ("fast", "slow")


def burn_episodes(frame: pd.DataFrame, target: str = "") -> list[BurnEpisode]:
    """The SLO burn episodes of each speed in one target's history (columns t,
    slo_burning_fast, slo_burning_slow, slo_attainment): from the first evaluation
    flagged burning to the first that is not. None in a history from before the SLO
    signals (or of a target without an objective)."""
    if frame.empty or "slo_burning_fast" not in frame.columns:
        return []
    ordered = frame.sort_values("t")
    times = ordered["t"].to_numpy(dtype="float64")
    attainment = (
        ordered["slo_attainment"].to_numpy(dtype="float64", na_value=math.nan)
        if "slo_attainment" in ordered.columns
        else None
    )
    episodes = []
    for speed in BURN_SPEEDS:
        burning = ordered[f"slo_burning_{speed}"].eq(True).to_numpy()
        for first, end in _stretches(burning):
            span = attainment[first:end] if attainment is not None else []
            known = [float(a) for a in span if math.isfinite(a)]
            episodes.append(
                BurnEpisode(
                    target,
                    float(times[first]),
                    None if end is None else float(times[end]),
                    speed,
                    min(known) if known else None,
                )
            )
    return sorted(episodes, key=lambda e: e.start)


def fleet_burn_episodes(history: pd.DataFrame) -> list[BurnEpisode]:
    """Every target's burn episodes from a long frame with a `target` column, latest first."""
    return _across_fleet(history, burn_episodes)


def burn_episodes_frame(episodes: list[BurnEpisode], now: float) -> pd.DataFrame:
    """The burn episodes as the Alerts table shows them."""
    columns = ["target", "alert", "start", "end", "ongoing", "duration_seconds", "lowest"]
    return pd.DataFrame(
        [
            {
                "target": e.target,
                "alert": "{} ({})".format(*SPEED_ALERTS[e.speed]),
                "start": pd.Timestamp(e.start, unit="s", tz="UTC"),
                "end": pd.NaT if e.end is None else pd.Timestamp(e.end, unit="s", tz="UTC"),
                "ongoing": e.end is None,
                "duration_seconds": e.seconds(now),
                "lowest": e.lowest_attainment,
            }
            for e in episodes
        ],
        columns=columns,
    )
