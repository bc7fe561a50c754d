"""The evaluator: every signal of a target, per series and in total, from its window.

Each series' window is read (`exporter.core.reading.read_window`) and every signal of
the catalog (`exporter.core.catalog`) computed from that reading; a target total is a
series like any other, over the series of each scrape merged. Saturation episodes are
held through scrapes that read nothing, until the evidence or the staleness ends them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from batchscope.exporter.core.catalog import SERIES, SeriesSignals
from batchscope.exporter.core.diagnosis import (
    Diagnosis,
    down_diagnosis,
    no_data_diagnosis,
    unreadable_diagnosis,
)
from batchscope.exporter.core.reading import IncreaseOf, read_window
from batchscope.exporter.core.replicas import routing_diagnosis
from batchscope.exporter.core.signals import (
    SaturationState,
    SignalSettings,
    outlasted,
    saturated_seconds,
    saturation_after_gap,
    saturation_through_gap,
)
from batchscope.exporter.core.slo import SloHistory, SloStatus, slo_status
from batchscope.exporter.core.snapshot import LabelKey, SeriesSnapshot
from batchscope.exporter.core.window import Window

__all__ = ["SeriesSignals", "TargetSignals", "TargetIdentity", "evaluate_window"]

TOTAL: LabelKey = ()
# A total in one of these states says something a routing problem does not explain.
UNROUTED_STATES = ("down", "unreadable", "no_data", "idle", "stalled")


# Not frozen: one or two built at every evaluation, and a frozen dataclass's __init__ costs
# several times a plain one's (an object.__setattr__ a field). Nothing changes one once
# built: the renders read it from other threads.
@dataclass(slots=True)
class TargetSignals:
    """What the exporter knows about one target at one evaluation.

    `extra_labels`: the target's configured `labels:`, carried by every series it exports.
    `errors_total`: payloads this target sent that could not be read, by reason, since start.
    `window_resets_total`: times its window started again, by reason, since start.
    """

    target: str
    url: str
    t: float
    up: bool
    error: str | None
    series: tuple[SeriesSignals, ...]
    total: SeriesSignals
    scrape_seconds: float | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    errors_total: Mapping[str, int] = field(default_factory=dict)
    window_resets_total: Mapping[str, int] = field(default_factory=dict)

    def with_counts(
        self, errors_total: Mapping[str, int], window_resets_total: Mapping[str, int]
    ) -> TargetSignals:
        """These signals with the target's counts since start."""
        return replace(self, errors_total=errors_total, window_resets_total=window_resets_total)

    @property
    def read(self) -> bool:
        """Whether this evaluation read the target: it answered with a payload that could be
        evaluated. One that did not (down, unreadable) is a gap in the evidence: it ends no
        held state, and of the diagnosis only its own state is known."""
        return self.up and self.error is None

    @property
    def measured(self) -> bool:
        """Whether this evaluation measured the target: read it over a window of two
        scrapes or more. A window of one scrape (the first after the target or the exporter
        went dark for longer than the window) measures no increase, and a saturation
        episode is carried through it as through a gap (`_next_saturation`)."""
        return self.read and bool(self.total.window_seconds)


def series_signals(
    points: Sequence[tuple[float, SeriesSnapshot]],
    settings: SignalSettings,
    saturation: SaturationState,
    now: float,
    increase_of: IncreaseOf | None = None,
    slo_history: SloHistory | None = None,
    counters: Mapping[str, float | None] | None = None,
) -> tuple[SeriesSignals, SaturationState]:
    """All signals of one series over the window `points` (time, snapshot), oldest first,
    and the next saturation state: each of the catalog's signals computed from the
    window's reading (`read_window`, which says what the arguments are)."""
    reading = read_window(points, settings, saturation, now, increase_of, slo_history, counters)
    return SeriesSignals(*[s.compute(reading) for s in SERIES]), reading.saturation


def signals_without_series(diagnosis: Diagnosis, settings: SignalSettings) -> SeriesSignals:
    """The total of a target with no series to evaluate: only the diagnosis says anything."""
    return SeriesSignals(
        cap=settings.cap,
        token_cap=settings.token_cap,
        token_budget=settings.token_budget,
        latency_quantile=settings.quantile,
        latency_histogram=settings.histogram,
        budget_seconds=settings.budget_seconds,
        diagnosis=diagnosis,
    )


def down_signals(error: str | None, settings: SignalSettings) -> SeriesSignals:
    """The signals of a target that did not answer: only the diagnosis says anything."""
    return signals_without_series(down_diagnosis(error), settings)


def held_saturation(
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
    settings: SignalSettings,
    readable: bool = False,
) -> dict[LabelKey, SaturationState]:
    """The saturation states an evaluation at `now` starts from: through a scrape that
    read nothing, each kept as it was until the target has gone unread for longer than the
    staleness, a saturated one for longer than the staleness and the hold
    (`saturation_through_gap`); at a `readable` one, each that no such outage ended
    (`saturation_after_gap`)."""
    carry = saturation_after_gap if readable else saturation_through_gap
    held = {}
    for key, state in saturation.items():
        kept = carry(state, now, settings.stale_seconds, settings.hold_seconds)
        if kept is not None:
            held[key] = kept
    return held


def held_slo(window: Window, held: SaturationState | None, now: float) -> SloStatus | None:
    """The total's SLO status through a scrape that read nothing: its history's, which
    that scrape left as the last read did; None without an objective, and once the target
    has gone unread past the staleness (`held`: the total's saturation state from
    `held_saturation`, whose clocks say how long; a saturated episode alone outlasts the
    staleness, by the hold), as the alert book ends an SLO burn's alert."""
    settings = window.settings
    history = window.total_slo_history()
    if held is None or history is None or settings.slo_objective is None:
        return None
    if outlasted(held.unread_since, held.read_at, held.saturated, now, settings.stale_seconds):
        return None
    return slo_status(
        history, settings.slo_objective, settings.slo_window_scale, settings.slo_period_seconds
    )


def _with_episode(
    total: SeriesSignals, state: SaturationState | None, slo: SloStatus | None, now: float
) -> SeriesSignals:
    """A total that read nothing, carrying the saturation episode still open (if any) and
    the SLO status held through it (`held_slo`), so neither episode splits."""
    if slo is not None:
        total = replace(total, slo=slo)
    if state is None or state.above_since is None:
        return total
    return replace(
        total,
        budget_saturated=state.saturated,
        budget_saturated_seconds=saturated_seconds(state, now),
    )


@dataclass(frozen=True, slots=True)
class TargetIdentity:
    """Which target signals belong to: its name, its URL and its configured `labels:`."""

    name: str
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def signals(
        self,
        t: float,
        up: bool,
        error: str | None,
        series: tuple[SeriesSignals, ...],
        total: SeriesSignals,
        scrape_seconds: float | None,
    ) -> TargetSignals:
        return TargetSignals(
            self.name, self.url, t, up, error, series, total, scrape_seconds, dict(self.labels)
        )


def unreadable_signals(
    target: TargetIdentity,
    t: float,
    error: str,
    settings: SignalSettings,
    scrape_seconds: float | None,
    episode: SaturationState | None = None,
    slo: SloStatus | None = None,
) -> TargetSignals:
    """A target that answered (up, as Prometheus would say) whose payload could not be
    evaluated: the error is its state and its diagnosis, and it has no series. `episode`:
    the total's saturation state held through it (`held_saturation`); `slo`: its SLO
    status held through it (`held_slo`)."""
    unreadable = signals_without_series(unreadable_diagnosis(error), settings)
    total = _with_episode(unreadable, episode, slo, t)
    return target.signals(t, True, error, (), total, scrape_seconds)


def evaluate_window(
    target: TargetIdentity,
    window: Window,
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
) -> tuple[TargetSignals, dict[LabelKey, SaturationState]]:
    """Signals for one target from its window; returns them and the next saturation states.

    The newest snapshot decides up/down; up without a series means the engine's families
    are registered with no samples yet. A down scrape (failed, timed out, unreadable)
    reads nothing: the saturation states are held through it, and the total shows the
    episode still open; a target unread for longer than the staleness (a saturated
    episode: the staleness and the hold), counted from the first scrape that read nothing,
    ends its states (`held_saturation`): two readable
    scrapes in a row continue them, however late the second. Series absent from the newest snapshot
    (a model
    that was unloaded) are dropped; the total is computed like any series, over the
    merged series of each scrape, so its own saturation state is kept under key (). A
    total whose series of one model (data-parallel engines) hold one queueing at its limit
    while another idles is diagnosed `routing` (`replicas.routing_diagnosis`).
    A target whose every scrape held the same one series, with a total that is that
    series but its labels, in the same saturation state, has the series' signals as its
    total: computing them again would give the same.
    """
    settings = window.settings
    latest = window.latest()
    if latest is None:
        raise ValueError(f"target {target.name}: evaluating an empty window")
    saturation = held_saturation(saturation, now, settings, readable=latest.up)
    if not latest.up:
        held = saturation.get(TOTAL)
        down = _with_episode(
            down_signals(latest.error, settings), held, held_slo(window, held, now), now
        )
        return target.signals(
            latest.t, False, latest.error, (), down, latest.scrape_seconds
        ), saturation
    if not latest.series:
        total = signals_without_series(no_data_diagnosis(), settings)
        return target.signals(latest.t, True, None, (), total, latest.scrape_seconds), {}
    next_states: dict[LabelKey, SaturationState] = {}
    series = []
    for key in sorted({s.key for s in latest.series}):
        track = window.series[key]
        signals, next_states[key] = series_signals(
            track.points,
            settings,
            saturation.get(key, SaturationState()),
            now,
            track.histogram_increase,
            window.slo_history(key),
            track.counter_increases(),
        )
        series.append(signals)
    sole = window.sole_series_key()
    total_state = saturation.get(TOTAL, SaturationState())
    if sole is not None and total_state == saturation.get(sole, SaturationState()):
        total, next_states[TOTAL] = replace(series[0], labels={}), next_states[sole]
    else:
        total_track = window.total()
        total, next_states[TOTAL] = series_signals(
            total_track.points,
            settings,
            total_state,
            now,
            total_track.histogram_increase,
            window.total_slo_history(),
            total_track.counter_increases(),
        )
    if len(series) > 1 and total.diagnosis.state not in UNROUTED_STATES:
        routed = routing_diagnosis(target.name, series)
        if routed is not None:
            total = replace(total, diagnosis=routed)
    return (
        target.signals(latest.t, True, None, tuple(series), total, latest.scrape_seconds),
        next_states,
    )
