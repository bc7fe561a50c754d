"""Each target's budget used at each refresh of the Live page, kept in the session: the
fleet table's trend column.

The summary rows the page reads anyway are kept, one number a target a refresh, so the
trend costs no request: at 1,000 targets, a refresh appends 1,000 numbers, and an hour
of refreshes every 5 s holds 720 x 1,000 four-byte floats (2.9 MB) per open page. The
trend starts when the page opens; the selected target's chart reads its full history.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

# An hour of refreshes: the longest range the Live page offers but "all kept".
KEPT_SECONDS = 3600.0
# A trend cell draws at most this many points: the largest of each stretch of refreshes.
TREND_POINTS = 60


@dataclass
class BudgetTrends:
    """Budget used (a percentage; NaN: not known) of each target at each refresh kept,
    every target's numbers aligned with `times`."""

    times: array = field(default_factory=lambda: array("d"))
    values: dict[str, array] = field(default_factory=dict)

    def add(self, t: float, budget_percent: dict[str, float | None]) -> None:
        """One refresh at `t`: each target's budget used. A refresh at the same `t` as the
        last (the exporter's same body) adds nothing; a target no longer in the fleet is
        forgotten, a new one starts with no numbers before it."""
        if self.times and t <= self.times[-1]:
            return
        kept = len(self.times)
        self.values = {
            name: self.values.get(name) or array("f", [math.nan]) * kept for name in budget_percent
        }
        self.times.append(t)
        for name, value in budget_percent.items():
            self.values[name].append(math.nan if value is None else value)
        self._forget_before(t - KEPT_SECONDS)

    def _forget_before(self, start: float) -> None:
        old = bisect_left(self.times, start)
        if old:
            del self.times[:old]
            for numbers in self.values.values():
                del numbers[:old]

    def trend(self, name: str, since: float | None) -> list[float]:
        """The target's budget used at the refreshes from `since` (all kept: None), at most
        TREND_POINTS of them (each the largest of its stretch, so a peak stays), unknown
        ones left out."""
        numbers = self.values.get(name)
        if numbers is None:
            return []
        first = 0 if since is None else bisect_left(self.times, since)
        known = [v for v in numbers[first:] if not math.isnan(v)]
        if len(known) <= TREND_POINTS:
            return known
        size = math.ceil(len(known) / TREND_POINTS)
        return [max(known[i : i + size]) for i in range(0, len(known), size)]
