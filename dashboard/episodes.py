"""Saturation episodes (start, end, peak utilisation) from a history of evaluations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True, slots=True)
class Episode:
    """One stretch of sustained budget saturation; `end` is None while it lasts."""

    target: str
    start: float
    end: float | None
    peak_utilization: float | None

    def seconds(self, now: float) -> float:
        return (now if self.end is None else self.end) - self.start


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
    episodes = []
    start_index: int | None = None
    for i, flag in enumerate(saturated):
        if flag and start_index is None:
            start_index = i
        elif not flag and start_index is not None:
            episodes.append(_episode(target, times, utilization, above, start_index, i))
            start_index = None
    if start_index is not None:
        episodes.append(_episode(target, times, utilization, above, start_index, None))
    return episodes


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
    """Every target's episodes from a long frame with a `target` column, latest first."""
    found = [
        episode
        for name, frame in history.groupby("target", sort=True)
        for episode in saturation_episodes(frame, str(name))
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
