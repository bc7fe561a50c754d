"""The latency promise as an SLO: attainment, goodput, burn rates and the error budget.

Attainment is the share of requests whose latency was within the budget, read from a
latency histogram's bucket increases: exact when a bucket edge equals the budget;
otherwise only known between the shares at the two neighbouring edges, with a linear
interpolation inside the bucket as the estimate (PromQL's convention inside a bucket,
and what the recording rules compute: grafana/rules.py). Goodput is the rate of
requests within the budget.

With an objective (say 0.99 of requests within the budget), the error budget is the
1 - objective of requests allowed to miss it. The burn rate over a window is the share
that missed it over the share allowed: 1 is spending the budget exactly as fast as the
compliance period allows. The standard window pairs (the SRE workbook's alerting
chapter) alert when both windows of a pair burn faster than the pair's factor: the long
window says the budget is really being spent, the short one that it still is.

Pure: histograms, times and settings in, numbers out. `SloHistory` accumulates what the
burn rates need, scrape by scrape, in bounded memory (its docstring says how much).
"""

from __future__ import annotations

import bisect
import copy
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from batchscope.exporter.core.histogram import Histogram

DAY_SECONDS = 86400.0
DEFAULT_PERIOD_DAYS = 30.0
# An edge further than this share of the budget away leaves attainment loosely bounded:
# the reason says so, and how to put an edge at the budget.
FAR_EDGE = 0.25
# Checkpoints a window keeps: the span read is between the window and 1/RESOLUTION more.
RESOLUTION = 30

# The standard windows by name, in seconds (before `scale`).
WINDOWS = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "6h": 21600.0, "3d": 259200.0}


@dataclass(frozen=True, slots=True)
class WindowPair:
    """Two windows that must both burn faster than `factor` for the pair's alert: `speed`
    "fast" pages, "slow" opens a ticket."""

    long: str
    short: str
    factor: float
    speed: str


# 14.4x for an hour spends 2% of a 30-day budget, 6x for 6 hours 5%, 1x for 3 days 10%.
WINDOW_PAIRS = (
    WindowPair("1h", "5m", 14.4, "fast"),
    WindowPair("6h", "30m", 6.0, "fast"),
    WindowPair("3d", "6h", 1.0, "slow"),
)
SPEEDS = ("fast", "slow")


def window_seconds(name: str, scale: float = 1.0) -> float:
    """A standard window's length in seconds, times `scale` (the `slo_window_scale`
    setting, which shortens every window alike to try the alerts out in minutes)."""
    return WINDOWS[name] * scale


class Bounded(NamedTuple):
    """A value only known between two bounds, with the estimate between them."""

    estimate: float
    lower: float
    upper: float

    def times(self, factor: float) -> Bounded:
        return Bounded(self.estimate * factor, self.lower * factor, self.upper * factor)


@dataclass(frozen=True, slots=True)
class BudgetEdges:
    """Where a budget sits among a histogram's bucket edges: `lower`, the largest edge at
    or below it (0 when none: latencies are not negative), `upper` the smallest edge at
    or above it (`inf` when only +Inf is), and `weight`, how far into (lower, upper] the
    budget lies (0 on an edge, and when `upper` is +Inf: nothing says where inside it)."""

    budget: float
    lower: float
    upper: float
    weight: float

    @property
    def exact(self) -> bool:
        return self.lower == self.upper

    @property
    def nearest_distance(self) -> float:
        """How far the nearest edge is from the budget, as a share of the budget."""
        gaps = [self.budget - self.lower if self.lower > 0 else math.inf, self.upper - self.budget]
        return min(gaps) / self.budget


def budget_edges(bounds: tuple[float, ...], budget: float) -> BudgetEdges:
    """The edges around `budget` among a histogram's `le` bounds (ascending, +Inf last);
    an edge within a relative 1e-9 of the budget is the budget (a bound read as text)."""
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    at = bisect.bisect_left(bounds, budget)
    for index in (at - 1, at):
        if 0 <= index < len(bounds) and math.isclose(bounds[index], budget, rel_tol=1e-9):
            return BudgetEdges(budget, bounds[index], bounds[index], 0.0)
    lower = bounds[at - 1] if at > 0 else 0.0
    upper = bounds[at] if at < len(bounds) else math.inf
    weight = (budget - lower) / (upper - lower) if math.isfinite(upper) else 0.0
    return BudgetEdges(budget, lower, upper, weight)


def counts_at(hist: Histogram, edges: BudgetEdges) -> tuple[float, float]:
    """Cumulative observations at or below the lower and the upper edge."""
    at = dict(zip(hist.bounds, hist.counts, strict=True))
    total = hist.counts[-1] if hist.counts else 0.0
    lower = at.get(edges.lower, 0.0)
    upper = at.get(edges.upper, total)
    return lower, upper


def within(lower: float, upper: float, edges: BudgetEdges) -> Bounded:
    """Observations within the budget from those at or below its two edges: between
    them, linearly interpolated inside the bucket."""
    return Bounded(lower + (upper - lower) * edges.weight, lower, upper)


@dataclass(frozen=True, slots=True)
class Attainment:
    """Share of a window's requests within the budget (`share`: estimate and bounds, all
    equal when the budget is a bucket edge), how many requests the window held, the
    edges around the budget, and in words how exact it is and how to make it exact."""

    share: Bounded
    requests: float
    edges: BudgetEdges
    reason: str

    @property
    def exact(self) -> bool:
        return self.edges.exact


def attainment_share(hist: Histogram, budget: float) -> tuple[Bounded, BudgetEdges] | None:
    """The share of a histogram's observations within `budget`, bounded by the bucket
    edges around it; None without observations."""
    requests = hist.counts[-1] if hist.counts else 0.0
    if requests <= 0:
        return None
    edges = budget_edges(hist.bounds, budget)
    lower, upper = counts_at(hist, edges)
    counted = within(lower, upper, edges)
    return Bounded(*(min(1.0, max(0.0, n / requests)) for n in counted)), edges


# vLLM's bucket families (--custom-histogram-buckets) by the latency kind they serve.
VLLM_BUCKET_FAMILIES = {
    "e2e": "request_latency",
    "queue": "request_latency",
    "inference": "request_latency",
    "ttft": "time_to_first_token",
    "tpot": "inter_token_latency",
    "itl": "inter_token_latency",
}


def edge_advice(engine: str, kind: str, budget: float) -> str:
    """How to give this engine's `kind` histogram a bucket edge at `budget`."""
    edge = f"{budget:g}"
    if "vllm" in engine.split("+") and kind in VLLM_BUCKET_FAMILIES:
        return (
            f'vLLM: --custom-histogram-buckets \'{{"{VLLM_BUCKET_FAMILIES[kind]}": '
            f"[..., {edge}, ...]}}' (the vLLM versions that have the option; 0.32 does)"
        )
    if "inhouse" in engine.split("+"):
        return (
            f"an in-house batcher: BatcherMetrics(..., latency_buckets=(..., {edge}, ...)) "
            "in batchscope.exporter.instrumentation"
        )
    return "the engine's histogram bucket settings"


def _percent(share: float) -> str:
    return f"{share * 100:.4g}%"


def attainment_reason(share: Bounded, edges: BudgetEdges, engine: str, kind: str) -> str:
    """In words: exact, or between which bounds and why; and where the nearest edge is
    far from the budget (FAR_EDGE), how to put one there."""
    budget = f"{edges.budget:g} s"
    if edges.exact:
        return f"Exact: {budget} is a bucket edge of the {kind} histogram."
    upper = f"{edges.upper:g} s" if math.isfinite(edges.upper) else "+Inf"
    text = (
        f"Between {_percent(share.lower)} (within {edges.lower:g} s) and "
        f"{_percent(share.upper)} (within {upper}), {_percent(share.estimate)} interpolated: "
        f"{budget} is not a bucket edge of the {kind} histogram."
    )
    if edges.nearest_distance > FAR_EDGE:
        text += (
            f" The nearest edge is {_percent(edges.nearest_distance)} of the budget away: put "
            f"an edge at {budget} for an exact share ({edge_advice(engine, kind, edges.budget)})."
        )
    return text


def measure_attainment(
    hist: Histogram | None, budget: float | None, engine: str, kind: str
) -> Attainment | None:
    """The window's attainment from the increase of its latency histogram `hist`; None
    without a budget or without requests."""
    if hist is None or budget is None or budget <= 0:
        return None
    measured = attainment_share(hist, budget)
    if measured is None:
        return None
    share, edges = measured
    return Attainment(share, hist.counts[-1], edges, attainment_reason(share, edges, engine, kind))


def burn_rate(attained: float, objective: float) -> float:
    """The error budget's burn rate: the share of requests that missed the budget over
    the share the objective allows to miss it."""
    return (1.0 - attained) / (1.0 - objective)


# ---------------------------------------------------------------- the history


class Totals(NamedTuple):
    """Requests counted since a history began: at or below the budget's lower edge, at or
    below its upper edge, within it as interpolated, and all of them."""

    lower: float
    upper: float
    estimate: float
    requests: float

    def minus(self, older: Totals) -> Totals:
        return Totals(*(a - b for a, b in zip(self, older, strict=True)))

    def plus(self, other: Totals) -> Totals:
        return Totals(*(a + b for a, b in zip(self, other, strict=True)))


# A window's checkpoints are kept flat in one array of doubles, STRIDE a checkpoint:
# (t, *Totals), 40 bytes, with no object per number.
STRIDE = 1 + len(Totals._fields)


class _Checkpoints:
    """One window's checkpoints, oldest first, in a flat array of doubles."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values = array("d")

    def __len__(self) -> int:
        return len(self.values) // STRIDE

    def t(self, index: int) -> float:
        return self.values[index * STRIDE]

    def totals(self, index: int) -> Totals:
        start = index * STRIDE + 1
        return Totals(*self.values[start : start + STRIDE - 1])

    def append(self, t: float, totals: Totals) -> None:
        self.values.append(t)
        self.values.extend(totals)

    def drop_oldest(self) -> None:
        del self.values[:STRIDE]

    def clear(self) -> None:
        del self.values[:]


ZERO = Totals(0.0, 0.0, 0.0, 0.0)


class SloHistory:
    """One series' requests within its budget and in all, counted from its latency
    histogram scrape by scrape, with checkpoints at each window's edge.

    `observe` adds each scrape's increase to running totals: a count that went down or a
    new bucket layout is a restarted server, whose counts start again from zero (as
    PromQL's increase); a scrape that did not read the histogram adds nothing (a gap,
    never a reset). A changed budget starts the history again: its totals would mix two
    promises.

    Memory: per window (each of `windows`, seconds), at most RESOLUTION + 2 checkpoints
    of five numbers (40 bytes), kept at least window / RESOLUTION apart; the oldest is
    the newest at or before the window's start, so the span `increase` reads is between
    the window and 1/RESOLUTION of it longer (shorter while the history is younger than
    the window).
    The five burn windows and a compliance period: at most 6 x 32 = 192 checkpoints a
    series, whatever the scrape interval and however long it runs.
    """

    def __init__(self, windows: Iterable[float]) -> None:
        self._tiers = {w: _Checkpoints() for w in sorted(set(windows))}
        self._start(None)

    def _start(self, budget: float | None) -> None:
        """Begin counting (again) against `budget`: no scrape seen, nothing counted."""
        for points in self._tiers.values():
            points.clear()
        self._budget = budget
        self._bounds: tuple[float, ...] = ()
        self._edges: BudgetEdges | None = None
        self._previous: tuple[float, float, float] | None = None
        self.totals = ZERO
        self.started_at: float | None = None
        self.updated_at: float | None = None

    def copy(self) -> SloHistory:
        """An independent history with everything counted so far."""
        return copy.deepcopy(self)

    def checkpoints(self) -> int:
        """Checkpoints held now, over every window."""
        return sum(len(points) for points in self._tiers.values())

    def observe(self, t: float, hist: Histogram | None, budget: float | None) -> Totals | None:
        """Count one scrape's histogram at `t` against `budget`; None of either: a gap.
        Returns what it counted (nothing at the history's first scrape), None for a gap."""
        if hist is None or budget is None or budget <= 0 or not hist.bounds:
            return None
        if budget != self._budget:
            self._start(budget)  # a new promise: a new history
        if hist.bounds != self._bounds:
            self._bounds = hist.bounds
            self._edges = budget_edges(hist.bounds, budget)
            restarted = self._previous is not None
        else:
            restarted = False
        edges = self._edges
        assert edges is not None
        lower, upper = counts_at(hist, edges)
        current = (lower, upper, hist.counts[-1])
        previous, self._previous = self._previous, current
        if previous is None:
            counted = ZERO
        else:
            if restarted or any(a < b for a, b in zip(current, previous, strict=True)):
                increase = current
            else:
                increase = tuple(a - b for a, b in zip(current, previous, strict=True))
            within_budget = within(increase[0], increase[1], edges)
            counted = Totals(increase[0], increase[1], within_budget.estimate, increase[2])
        self._count(t, counted)
        return counted

    def add(self, t: float, counted: Totals, budget: float) -> None:
        """Count requests another history counted since its previous scrape (a target
        total's: the sum of its series' `observe`), at `t` against `budget`. The first
        after a start begins the history at `t` and counts nothing: what was counted
        happened before it."""
        if budget != self._budget:
            self._start(budget)
        self._count(t, counted if self.started_at is not None else ZERO)

    def _count(self, t: float, counted: Totals) -> None:
        if self.started_at is None:
            self.started_at = t
        self.totals = self.totals.plus(counted)
        self.updated_at = t
        for seconds, points in self._tiers.items():
            if not points or t - points.t(len(points) - 1) >= seconds / RESOLUTION:
                points.append(t, self.totals)
            while len(points) >= 2 and points.t(1) <= t - seconds:
                points.drop_oldest()

    def increase(self, seconds: float) -> tuple[Totals, float] | None:
        """What was counted over the last `seconds` (one of the history's windows) up to
        the newest scrape, and the span it covers; None before any scrape."""
        points = self._tiers[seconds]
        if not points or self.updated_at is None:
            return None
        return self.totals.minus(points.totals(0)), self.updated_at - points.t(0)

    def covers(self, seconds: float) -> bool:
        """Whether the history reaches back `seconds` from its newest scrape."""
        return (
            self.started_at is not None
            and self.updated_at is not None
            and self.updated_at - self.started_at >= seconds
        )


def history_windows(scale: float, period_seconds: float) -> tuple[float, ...]:
    """The windows a history keeps checkpoints for: each standard window, scaled, and the
    compliance period."""
    return (*(window_seconds(name, scale) for name in WINDOWS), period_seconds)


# ---------------------------------------------------------------- burn rates


@dataclass(frozen=True, slots=True)
class BurnRate:
    """The burn rate over one standard window (`window`: its name, `seconds`: its length
    as scaled); None when no request finished in it."""

    window: str
    seconds: float
    rate: float | None


@dataclass(frozen=True, slots=True)
class SloStatus:
    """A series held to an objective, at one evaluation: the burn rate over each
    standard window, which window pairs burn (`burning_pairs`: both windows over the
    pair's factor, once the history covers the short window) and so which speeds of alert
    (`burning`), and the error budget left over the compliance period, known once the
    history covers the period (None before: `history_seconds` says how far it reaches)."""

    objective: float
    burn_rates: tuple[BurnRate, ...]
    burning_pairs: tuple[WindowPair, ...]
    error_budget_remaining: float | None
    history_seconds: float
    period_seconds: float

    @property
    def burning(self) -> tuple[str, ...]:
        """The speeds with a burning pair, fast first."""
        return tuple(s for s in SPEEDS if any(p.speed == s for p in self.burning_pairs))

    def rate(self, window: str) -> float | None:
        return next((b.rate for b in self.burn_rates if b.window == window), None)

    def speed_burn_rate(self, speed: str) -> float | None:
        """The highest burn rate over the long windows of `speed`'s burning pairs (an
        alert's value: the pair that fires it); None when none of them burns."""
        rates = [self.rate(p.long) for p in self.burning_pairs if p.speed == speed]
        known = [r for r in rates if r is not None]
        return max(known) if known else None


def pair_burning(
    pair: WindowPair, rates: dict[str, float | None], covered: Iterable[str] = WINDOWS
) -> bool:
    """Both windows of the pair burn faster than its factor, and the history reaches
    back over its short window (`covered`: the windows it reaches back over), so that a
    young history's first bad scrapes do not page for a burn it never watched."""
    return pair.short in covered and all(
        (rate := rates.get(name)) is not None and rate > pair.factor
        for name in (pair.long, pair.short)
    )


def slo_status(
    history: SloHistory, objective: float, scale: float, period_seconds: float
) -> SloStatus:
    """The burn rates, alerting speeds and error budget of a history held to `objective`,
    its windows scaled by `scale`."""
    rates: dict[str, float | None] = {}
    burn_rates = []
    covered = set()
    for name in WINDOWS:
        seconds = window_seconds(name, scale)
        if history.covers(seconds):
            covered.add(name)
        counted = history.increase(seconds)
        rate = None
        if counted is not None and counted[0].requests > 0:
            totals = counted[0]
            rate = burn_rate(totals.estimate / totals.requests, objective)
        rates[name] = rate
        burn_rates.append(BurnRate(name, seconds, rate))
    burning = tuple(p for p in WINDOW_PAIRS if pair_burning(p, rates, covered))
    remaining = None
    if history.covers(period_seconds):
        counted = history.increase(period_seconds)
        assert counted is not None
        remaining = error_budget_remaining(counted[0], objective)
    started, updated = history.started_at, history.updated_at
    spanned = updated - started if started is not None and updated is not None else 0.0
    return SloStatus(objective, tuple(burn_rates), burning, remaining, spanned, period_seconds)


def error_budget_remaining(totals: Totals, objective: float) -> float:
    """The share of the error budget left: 1 less the requests that missed the budget
    over those the objective allows to miss it (negative once overspent); 1 without
    requests."""
    if totals.requests <= 0:
        return 1.0
    missed = totals.requests - totals.estimate
    return 1.0 - missed / ((1.0 - objective) * totals.requests)
