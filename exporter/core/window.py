"""A per-target ring buffer of snapshots covering the last `seconds`, kept by series.

An evaluation reads each series' points over the window, and the target total's (the
series of each scrape merged). The window sorts every scrape into them as it arrives,
with what the scrape implies against the one before it: whether each histogram
restarted, and whether the total is just the target's one series. So the work a scrape
brings is done once, when it arrives, and an evaluation does not compare every bucket
of every pair of scrapes again. The total's points are merged only once some scrape's
total is not its one series: until then the evaluation never reads them. Without this
bookkeeping the pure functions give the same results (`histogram_increase` without
`restarts`, `merge_series` on each scrape): tests/exporter/test_window.py holds the two against
each other.

A target held to an SLO objective keeps, beside the window, an `SloHistory` per series
and for the total: what its burn rates need over windows of hours and days, counted as
each scrape arrives (exporter/core/slo.py). The total's counts are the sum of its
series' own increases, never an increase of their sum: a series missing from one scrape
does not come back as new requests. It outlives a series' absence from the
window (a gap is not a reset) until it is older than the longest window it serves.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable

from batchscope.exporter.core.histogram import (
    Histogram,
    histogram_increase,
    histogram_restarted,
    histogram_sub,
)
from batchscope.exporter.core.signals import SignalSettings, counter_increase
from batchscope.exporter.core.slo import ZERO, SloHistory, Totals, history_windows
from batchscope.exporter.core.snapshot import (
    COUNTERS,
    LabelKey,
    SeriesSnapshot,
    Snapshot,
    histograms_of,
    merge_series,
    total_equals_sole_series,
)

_counter_values = operator.attrgetter(*COUNTERS)
_KINDS = len(COUNTERS)


class SeriesTrack:
    """One series' (time, snapshot) points in the window, oldest first, and for each of
    its histograms by name (`histograms_of`) whether it restarted at each point since the
    previous point that held it, as `histogram_restarts` says; so for each histogram and
    each counter (`COUNTERS`), whether its increase over the points is its newest value
    less its oldest."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, SeriesSnapshot]] = deque()
        # Each point's histograms by name, and each name's restart flags, one a point.
        self._hists: deque[dict[str, Histogram]] = deque()
        self._restarts: dict[str, deque[bool]] = {}
        # How many points in the window hold each histogram, and how many are flagged.
        self._held: dict[str, int] = {}
        self._flagged: dict[str, int] = {}
        # Each histogram at the newest point that held it: the next point compares with it.
        self._latest: dict[str, Histogram] = {}
        # Each point's counter values, in the order of COUNTERS, and its odd bits: bit i
        # when counter i is absent or NaN there, bit i + _KINDS when it is below the
        # point before's (a restart). `_masks`: how many points in the window have each
        # set of odd bits (a server's points mostly share one). A counter no point sets a
        # bit for increased by its last value less its first, as `counter_increase`
        # computes it then.
        self._counts: deque[tuple[float | None, ...]] = deque()
        self._odd: deque[int] = deque()
        self._masks: dict[int, int] = {}

    def add(self, t: float, series: SeriesSnapshot) -> None:
        """Append a point, noting whether each of its histograms restarted since the newest
        point that held it, and which of its counters are absent or went down."""
        self._add_counts(_counter_values(series))
        hists = histograms_of(series)
        for name in hists.keys() - self._restarts.keys():
            self._restarts[name] = deque([False] * len(self.points))
        held, flagged = self._held, self._flagged
        for name, restarts in self._restarts.items():
            current, previous = hists.get(name), self._latest.get(name)
            restarted = (
                current is not None
                and previous is not None
                and histogram_restarted(previous, current)
            )
            restarts.append(restarted)
            if current is not None:
                held[name] = held.get(name, 0) + 1
            if restarted:
                flagged[name] = flagged.get(name, 0) + 1
        self._latest.update(hists)
        self._hists.append(hists)
        self.points.append((t, series))

    def _add_counts(self, values: tuple[float | None, ...]) -> None:
        before = self._counts[-1] if self._counts else None
        odd = 0
        for i, value in enumerate(values):
            if value is None or value != value:
                odd |= 1 << i
            elif before is not None and (b := before[i]) is not None and value < b:
                odd |= 1 << (i + _KINDS)
        self._masks[odd] = self._masks.get(odd, 0) + 1
        self._counts.append(values)
        self._odd.append(odd)

    def drop_oldest(self) -> None:
        self.points.popleft()
        for name in self._hists.popleft():
            self._held[name] -= 1
        for name, restarts in self._restarts.items():
            if restarts.popleft():
                self._flagged[name] -= 1
        self._counts.popleft()
        odd = self._odd.popleft()
        left = self._masks[odd] - 1
        if left:
            self._masks[odd] = left
        else:
            del self._masks[odd]

    def counter_increases(self) -> dict[str, float | None]:
        """`counter_increase` of each counter over the points, by name (`COUNTERS`): its
        last value less its first where no point in the window has it absent or lower
        than the point before, which is what `counter_increase` computes then; worked out
        in full otherwise."""
        counts = self._counts
        first, last = counts[0], counts[-1]
        some, every = 0, -1  # the bits some point sets, and those every point sets
        for mask in self._masks:
            some |= mask
            every &= mask
        increases: dict[str, float | None] = {}
        for i, name in enumerate(COUNTERS):
            if len(counts) < 2 or every >> i & 1:
                increases[name] = None  # no increase, or no value at all
            elif some >> i & 1 or some >> (i + _KINDS) & 1:
                increases[name] = counter_increase([c[i] for c in counts])
            else:
                increases[name] = last[i] - first[i]
        return increases

    def histogram_increase(self, name: str) -> Histogram | None:
        """`histogram_increase` of one histogram (by `histograms_of` name) over the points:
        the newest less the oldest where every point holds it and none since the oldest
        restarted, which is what `histogram_increase` computes then; worked out in full
        otherwise, from the restarts kept. A point whose histogram's previous holder has
        left the window may be flagged either way: it is the first holder in the
        window, where `histogram_increase` reads no restart."""
        restarts = self._restarts.get(name)
        if restarts is None:
            return None  # no point holds it
        hists = self._hists
        n = len(hists)
        if n >= 2 and self._held.get(name) == n and self._flagged.get(name, 0) == restarts[0]:
            return histogram_sub(hists[-1][name], hists[0][name])
        return histogram_increase([h.get(name) for h in hists], restarts)


class Window:
    """Snapshots of one target, oldest first, none older than `seconds` before the newest;
    the points of each series (`series`) and of the target total (`total`) among them.

    `settings`: the target's signal settings, of which the total's default cap and budget.
    """

    def __init__(self, seconds: float, settings: SignalSettings) -> None:
        if seconds <= 0:
            raise ValueError(f"window must be positive, got {seconds}")
        self.seconds = seconds
        self.settings = settings
        self._snapshots: deque[Snapshot] = deque()
        self.series: dict[LabelKey, SeriesTrack] = {}
        # The total's points, from the first scrape whose total is not its one series on.
        self._total: SeriesTrack | None = None
        # Per answered scrape: the key of its one series when its total is that series but
        # its labels (`total_equals_sole_series`), else None.
        self._sole_keys: deque[LabelKey | None] = deque()
        # How many of the last `_sole_keys` equal the last one (a key, not None): the
        # window's scrapes share one sole series when that is all of them. Kept as keys
        # come and go, since hashing every key of the window at every evaluation cost
        # 3% of a fleet's CPU.
        self._sole_run = 0
        # With an SLO objective: each series' history, and the total's (from the first
        # scrape on). While every scrape held one series, that series' own history is the
        # total's (`_total_slo_of`, its key): the total gets one of its own, a copy to go
        # on from, only once a scrape holds another.
        self._slo: dict[LabelKey, SloHistory] = {}
        self._total_slo: SloHistory | None = None
        self._total_slo_of: LabelKey | None = None

    @classmethod
    def of(cls, snapshots: Iterable[Snapshot], settings: SignalSettings) -> Window:
        """A window holding all these snapshots, whatever their age."""
        window = cls(float("inf"), settings)
        for snapshot in snapshots:
            window.add(snapshot)
        return window

    def add(self, snapshot: Snapshot) -> None:
        """Append a snapshot and drop those that fell out of the window. A scrape that did
        not answer adds no point: its series are unknown, not gone."""
        if snapshot.up:
            cap, budget = self.settings.cap, self.settings.budget_seconds
            sole = snapshot.series[0] if len(snapshot.series) == 1 else None
            itself = sole is not None and total_equals_sole_series(sole, cap)
            if not itself and self._total is None:
                self._total = self._merged(self._snapshots)
            if self._total is not None:
                # Merged before any point is added: a scrape it cannot read leaves the
                # window as it was.
                self._total.add(snapshot.t, merge_series(snapshot.series, cap, budget))
            self._part_total_slo(snapshot.series)
            counted = []
            for series in snapshot.series:
                track = self.series.get(series.key)
                if track is None:
                    track = self.series[series.key] = SeriesTrack()
                track.add(snapshot.t, series)
                counted.append(self._count_slo(snapshot.t, series))
            self._count_total_slo(snapshot.t, snapshot.series, counted)
            self._add_sole_key(sole.key if itself else None)
            self._forget_slo(snapshot)
        self._snapshots.append(snapshot)
        horizon = snapshot.t - self.seconds
        while self._snapshots and self._snapshots[0].t < horizon:
            self._drop(self._snapshots.popleft())

    def _drop(self, oldest: Snapshot) -> None:
        if not oldest.up:
            return
        for series in oldest.series:
            track = self.series[series.key]
            track.drop_oldest()
            if not track.points:
                del self.series[series.key]
        if self._total is not None:
            self._total.drop_oldest()
        self._sole_keys.popleft()
        self._sole_run = min(self._sole_run, len(self._sole_keys))

    def _add_sole_key(self, key: LabelKey | None) -> None:
        keys = self._sole_keys
        same = key is not None and bool(keys) and keys[-1] == key
        self._sole_run = self._sole_run + 1 if same else (0 if key is None else 1)
        keys.append(key)

    def _merged(self, snapshots: Iterable[Snapshot]) -> SeriesTrack:
        """The total's points over these snapshots: each answered scrape's series merged."""
        track = SeriesTrack()
        cap, budget = self.settings.cap, self.settings.budget_seconds
        for snapshot in snapshots:
            if snapshot.up:
                track.add(snapshot.t, merge_series(snapshot.series, cap, budget))
        return track

    def _new_slo_history(self) -> SloHistory:
        settings = self.settings
        return SloHistory(history_windows(settings.slo_window_scale, settings.slo_period_seconds))

    def _budget_of(self, series: SeriesSnapshot) -> float | None:
        """The budget a series is held to: its own (an in-house batcher's), else the
        configured one."""
        own = series.budget_seconds
        return own if own is not None else self.settings.budget_seconds

    def _count_slo(self, t: float, series: SeriesSnapshot) -> Totals | None:
        """Count a point in its series' SLO history; what it counted, None for a gap."""
        if self.settings.slo_objective is None:
            return None
        history = self._slo.get(series.key)
        if history is None:
            history = self._slo[series.key] = self._new_slo_history()
        return history.observe(
            t, series.latency.get(self.settings.histogram), self._budget_of(series)
        )

    def _part_total_slo(self, series: tuple[SeriesSnapshot, ...]) -> None:
        """Before a scrape is counted: give the total a history of its own, a copy of the
        sole series' so far, at the first scrape that holds another series."""
        if self.settings.slo_objective is None or self._total_slo is not None or not series:
            return
        if len(series) == 1 and self._total_slo_of in (None, series[0].key):
            self._total_slo_of = series[0].key
            return
        sole = self._slo.get(self._total_slo_of) if self._total_slo_of is not None else None
        self._total_slo = sole.copy() if sole is not None else self._new_slo_history()

    def _count_total_slo(
        self, t: float, series: Iterable[SeriesSnapshot], counted: Iterable[Totals | None]
    ) -> None:
        """Count a scrape in the total's SLO history: the sum of what each series' own
        history counted, so that a series absent for a while and back adds only what it
        served meanwhile, and each restart is its series' own. A gap for the total when
        its series have no common budget or bucket layout (`merge_series` then keeps no
        latency either)."""
        if self.settings.slo_objective is None:
            return
        series = list(series)
        kind = self.settings.histogram
        budgets = {self._budget_of(s) for s in series}
        layouts = {s.latency[kind].bounds for s in series if kind in s.latency}
        if len(budgets) != 1 or len(layouts) != 1:
            return
        budget = budgets.pop()
        if budget is None or budget <= 0:
            return
        if self._total_slo is None:
            return  # the sole series' own history counted it
        summed = ZERO
        for one in counted:
            if one is not None:
                summed = summed.plus(one)
        self._total_slo.add(t, summed, budget)

    def _forget_slo(self, snapshot: Snapshot) -> None:
        """Drop the histories of series absent for longer than the compliance period:
        none of their checkpoints reaches into any window any more."""
        horizon = snapshot.t - self.settings.slo_period_seconds
        gone = [
            key
            for key, history in self._slo.items()
            if history.updated_at is not None and history.updated_at < horizon
        ]
        for key in gone:
            del self._slo[key]

    def slo_history(self, key: LabelKey) -> SloHistory | None:
        """The SLO history of one series; None without an objective."""
        return self._slo.get(key)

    def total_slo_history(self) -> SloHistory | None:
        """The SLO history of the target total, counted from its first scrape on (the
        sum of its series' counts); None without an objective."""
        if self._total_slo is None and self._total_slo_of is not None:
            return self._slo.get(self._total_slo_of)
        return self._total_slo

    def total(self) -> SeriesTrack:
        """The target total's points: each answered scrape's series merged."""
        if self._total is None:
            self._total = self._merged(self._snapshots)
        return self._total

    def sole_series_key(self) -> LabelKey | None:
        """The key of the one series every answered scrape in the window held, when every
        scrape's total is that series but its labels; None otherwise."""
        keys = self._sole_keys
        return keys[-1] if keys and self._sole_run == len(keys) else None

    def snapshots(self) -> list[Snapshot]:
        return list(self._snapshots)

    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None
