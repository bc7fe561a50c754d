"""The capacity search: the highest offered rate whose step meets the SLO. Pure: the
planner says which rate to run next; the caller runs the step and records whether it
passed.

A geometric ramp from the start rate (x GROWTH per step: up while steps pass, down while
they fail) finds a bracket, a passing rate below a failing one; bisection (geometric: the
midpoint of the bracket's logarithms) then narrows it until the failing rate is within
`precision` of the passing one, or `max_steps` steps have run. Steps that contradict each
other (a pass above a fail, from noise) are read as the highest pass and the lowest fail
above it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROWTH = 2.0


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the search found: `rate`, the highest rate that passed (None if none did);
    the bracket `low` (= rate) and `high` (the lowest failing rate above it; None when
    none failed); the steps run; and whether the bracket closed within the precision."""

    rate: float | None
    low: float | None
    high: float | None
    steps: int
    converged: bool

    def as_record(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "low": self.low,
            "high": self.high,
            "steps": self.steps,
            "converged": self.converged,
        }

    def words(self) -> str:
        if self.rate is None:
            return f"no rate met the SLO (lowest tried {self.high:g} req/s, {self.steps} steps)"
        if self.high is None:
            return (
                f"capacity at the SLO: above {self.rate:g} req/s (every step passed; "
                f"{self.steps} steps)"
            )
        return (
            f"capacity at the SLO: {self.rate:g} req/s (bracket {self.low:g}..{self.high:g}, "
            f"{self.steps} steps)"
        )


@dataclass
class CapacitySearch:
    """The planner: `next_rate()` until None, `record(rate, passed)` after each step."""

    start_rate: float
    max_steps: int = 10
    precision: float = 0.10
    history: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start_rate <= 0 or self.max_steps < 1 or self.precision <= 0:
            raise ValueError("start rate and precision above 0, at least one step")

    def record(self, rate: float, passed: bool) -> None:
        self.history.append((rate, passed))

    def bracket(self) -> tuple[float | None, float | None]:
        low = max((r for r, ok in self.history if ok), default=None)
        high = min(
            (r for r, ok in self.history if not ok and (low is None or r > low)), default=None
        )
        return low, high

    def converged(self) -> bool:
        low, high = self.bracket()
        return low is not None and high is not None and high <= low * (1 + self.precision)

    def next_rate(self) -> float | None:
        """The rate to run next, or None: the bracket is closed or the steps are spent."""
        if len(self.history) >= self.max_steps or self.converged():
            return None
        if not self.history:
            return self.start_rate
        low, high = self.bracket()
        if high is None:
            return low * GROWTH  # type: ignore[operator]  # every step passed: low is set
        if low is None:
            return high / GROWTH
        return math.sqrt(low * high)

    def result(self) -> Capacity:
        low, high = self.bracket()
        return Capacity(low, low, high, len(self.history), self.converged())


def meets_slo(record: Mapping[str, Any], attainment: float) -> bool:
    """Whether a step passed: not over-saturated, and at least `attainment` of its
    arrivals answered within the SLO (`slo_attainment`)."""
    share = record.get("slo_attainment")
    return not record.get("over_saturated") and share is not None and share >= attainment
