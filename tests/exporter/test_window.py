"""The window's bookkeeping gives the signals the pure whole-window functions give.

The window sorts each scrape into per-series points as it arrives, with the restarts of
each histogram and whether the total is the target's one series; `evaluate_window` reads
that. The reference here walks the whole window on every evaluation, as the exporter did
before: every series' points gathered again, `merge_series` on every scrape, every
histogram's restarts worked out by `histogram_increase` itself, the total evaluated
like any series. Random scrape sequences (restarts, bucket layout changes, histograms
created mid-window, series that come and go, scrapes that fail, NaN, clocks that step
back) must give equal signals and saturation states at every scrape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscope.exporter.core.diagnosis import no_data_diagnosis
from batchscope.exporter.core.evaluate import (
    TOTAL,
    TargetIdentity,
    TargetSignals,
    down_signals,
    evaluate_window,
    series_signals,
    signals_without_series,
)
from batchscope.exporter.core.histogram import Histogram, histogram_increase, histogram_restarts
from batchscope.exporter.core.reading import counter_increases
from batchscope.exporter.core.signals import SaturationState, SignalSettings
from batchscope.exporter.core.snapshot import (
    COUNTERS,
    LabelKey,
    SeriesSnapshot,
    Snapshot,
    effective_cap,
    histograms_of,
    merge_series,
    total_equals_sole_series,
)
from batchscope.exporter.core.window import SeriesTrack, Window

INF = math.inf
MODEL_A: LabelKey = (("model_name", "a"),)
MODEL_B: LabelKey = (("model_name", "b"),)
LATENCY_LAYOUTS = ((0.1, 0.5, 1.0, INF), (0.2, 2.0, INF))
LENGTH_LAYOUTS = ((1.0, 2.0, 5.0, 10.0, 20.0, INF), (4.0, 8.0, INF))
BATCH_LAYOUTS = ((1.0, 2.0, 4.0, 8.0, INF),)
WINDOW_SECONDS = 20.0


def same(a: object, b: object) -> bool:
    """Equal values, field by field; NaN equals NaN (two evaluations make two NaNs); a
    function (an advice item's `words`) by what it returns."""
    if callable(a) and not isinstance(a, type):
        return callable(b) and same(a(), b())
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def reference_evaluation(
    snapshots: Sequence[Snapshot],
    settings: SignalSettings,
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
) -> tuple[TargetSignals, dict[LabelKey, SaturationState]]:
    """The whole window walked again: points gathered, every scrape merged, every series
    and the total evaluated by `series_signals` working out its own restarts."""
    latest = snapshots[-1]
    # A down scrape reads nothing and keeps the states, marking when the target first went
    # unread; a target unread for longer than the staleness since then (a saturated
    # episode: the staleness and the hold) ends them, at a down scrape or at the readable
    # one after it, and an episode not yet saturated ends once its last read is older than
    # the staleness. The total shows the episode open.
    stale = settings.stale_seconds
    unread_since = {
        key: state.unread_since if state.unread_since is not None else now
        for key, state in saturation.items()
    }

    def outlasted(key: LabelKey, state: SaturationState) -> bool:
        limit = stale + settings.hold_seconds if state.saturated else stale
        return now - unread_since[key] > limit or (
            not state.saturated and state.read_at is not None and now - state.read_at > stale
        )

    if not latest.up:
        held = {
            key: dataclasses.replace(state, unread_since=unread_since[key])
            for key, state in saturation.items()
            if state.read_at is not None and not outlasted(key, state)
        }
        down = down_signals(latest.error, settings)
        episode = held.get(TOTAL)
        if episode is not None and episode.above_since is not None:
            down = dataclasses.replace(
                down,
                budget_saturated=episode.saturated,
                budget_saturated_seconds=now - episode.above_since,
            )
        return TargetSignals("t", "u", latest.t, False, latest.error, (), down), held
    if not latest.series:
        total = signals_without_series(no_data_diagnosis(), settings)
        return TargetSignals("t", "u", latest.t, True, None, (), total), {}
    saturation = {
        key: state
        for key, state in saturation.items()
        if (state.unread_since is None and state.saturated)
        or state.read_at is None
        or not outlasted(key, state)
    }
    answered = [snap for snap in snapshots if snap.up]
    by_key: dict[LabelKey, list[tuple[float, SeriesSnapshot]]] = {}
    for snap in answered:
        for s in snap.series:
            by_key.setdefault(s.key, []).append((snap.t, s))
    totals = [
        (snap.t, merge_series(snap.series, settings.cap, settings.budget_seconds))
        for snap in answered
    ]
    states: dict[LabelKey, SaturationState] = {}
    series = []
    for key in sorted({s.key for s in latest.series}):
        signals, states[key] = series_signals(
            by_key[key], settings, saturation.get(key, SaturationState()), now
        )
        series.append(signals)
    total, states[TOTAL] = series_signals(
        totals, settings, saturation.get(TOTAL, SaturationState()), now
    )
    return TargetSignals("t", "u", latest.t, True, None, tuple(series), total), states


def _counts(draw: st.DrawFn) -> float:
    """An increment of a count: now and then NaN, as a broken server may send; now and
    then a fraction, whose sums round (a window's increase is then equal to the
    reference's only if both do the same arithmetic in the same order)."""
    return draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, 8.0] * 6 + [0.1, 0.7, math.nan]))


class Server:
    """One model's cumulative counters and histograms, grown, restarted and re-laid-out
    at random between scrapes."""

    def __init__(self, draw: st.DrawFn, key: LabelKey) -> None:
        self.draw = draw
        self.key = key
        self.counters: dict[str, float] = {}
        self.hists: dict[str, Histogram] = {}
        self.layouts = {
            "e2e": LATENCY_LAYOUTS,
            "output_tokens": LENGTH_LAYOUTS,
            "prompt_tokens": LENGTH_LAYOUTS,
            "batch_size": BATCH_LAYOUTS,
        }
        self.has_batch_size = draw(st.booleans())

    def _counter(self, name: str) -> float | None:
        draw = self.draw
        if draw(st.integers(0, 9)) == 0:
            return None  # not exposed at this scrape
        before = self.counters.get(name, 0.0)
        value = 0.0 if draw(st.integers(0, 7)) == 0 else before + _counts(draw)
        self.counters[name] = value
        return value

    def _hist(self, name: str) -> Histogram | None:
        draw = self.draw
        if draw(st.integers(0, 7)) == 0:
            return None  # absent at this scrape: not created yet, or a scrape that missed it
        previous = self.hists.get(name)
        event = draw(st.sampled_from(["grow", "grow", "grow", "restart", "layout"]))
        layouts = self.layouts[name]
        if previous is None or event == "layout":
            bounds = draw(st.sampled_from(layouts))
            counts = [0.0] * len(bounds)
            total = 0.0
        elif event == "restart":
            bounds, counts, total = previous.bounds, [0.0] * len(previous.bounds), 0.0
        else:
            bounds, counts, total = previous.bounds, list(previous.counts), previous.sum
        added = 0.0
        for i in range(len(bounds)):
            added += _counts(draw)
            counts[i] += added
        total += draw(st.sampled_from([0.0, 0.5, 3.0, 40.0, math.nan]))
        hist = Histogram(tuple(bounds), tuple(counts), total, counts[-1])
        self.hists[name] = hist
        return hist

    def scrape(self) -> SeriesSnapshot:
        draw = self.draw
        gauge = st.one_of(st.none(), st.sampled_from([0.0, 1.0, 4.0, 7.0, 8.0, 30.0]))
        latency = {kind: h for kind in ("e2e",) if (h := self._hist(kind)) is not None}
        requests, seconds = self._counter("mean_requests"), self._counter("mean_seconds")
        return SeriesSnapshot(
            key=self.key,
            engine=draw(st.sampled_from(["vllm", "inhouse"])),
            running=draw(gauge),
            waiting=draw(gauge),
            preemptions_total=self._counter("preemptions"),
            kv_usage=draw(st.one_of(st.none(), st.sampled_from([0.2, 0.95]))),
            cap=draw(st.one_of(st.none(), st.just(8.0))),
            engine_cap=draw(st.one_of(st.none(), st.just(16.0))),
            budget_seconds=draw(st.one_of(st.none(), st.just(0.5))),
            requests_total=self._counter("requests"),
            generation_tokens_total=self._counter("tokens"),
            items_total=self._counter("items"),
            batches_total=self._counter("batches"),
            batch_tokens_total=self._counter("batch_tokens"),
            padding_tokens_total=self._counter("padding"),
            latency=latency,
            latency_means={"e2e": (requests, seconds)}
            if requests is not None and seconds is not None
            else {},
            output_tokens=self._hist("output_tokens"),
            prompt_tokens=self._hist("prompt_tokens"),
            batch_size=self._hist("batch_size") if self.has_batch_size else None,
            execution_by_size={1: (4.0, 0.02), 8: (self.counters.get("batches", 1.0), 0.5)},
            kv_capacity_tokens=draw(st.one_of(st.none(), st.just(4096.0))),
            block_size=16.0,
        )


@st.composite
def scrape_sequences(draw: st.DrawFn) -> list[Snapshot]:
    servers = {key: Server(draw, key) for key in (MODEL_A, MODEL_B)}
    t = 1000.0
    snapshots = []
    for _ in range(draw(st.integers(1, 24))):
        t += draw(st.sampled_from([1.0, 3.0, 5.0, 5.0, 5.0, 12.0, 25.0, -4.0]))
        state = draw(st.sampled_from(["a", "a", "a", "a", "b", "ab", "ab", "none", "down"]))
        if state == "down":
            snapshots.append(Snapshot("t", t, False, error="timed out"))
            continue
        keys = {"a": [MODEL_A], "b": [MODEL_B], "ab": [MODEL_A, MODEL_B], "none": []}[state]
        snapshots.append(Snapshot("t", t, True, tuple(servers[k].scrape() for k in keys)))
    return snapshots


SETTINGS = st.builds(
    SignalSettings,
    cap=st.one_of(st.none(), st.just(8.0)),
    budget_seconds=st.one_of(st.none(), st.just(1.0), st.just(0.05)),
    hold_seconds=st.sampled_from([0.0, 10.0]),
    stale_seconds=st.sampled_from([10.0, 60.0]),
    stall_seconds=st.just(5.0),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scrapes=scrape_sequences(), signal_settings=SETTINGS)
def test_a_sliding_window_evaluates_as_the_whole_window_walked_again(
    scrapes: list[Snapshot], signal_settings: SignalSettings
) -> None:
    window = Window(WINDOW_SECONDS, signal_settings)
    kept: list[Snapshot] = []  # what the window holds, by its rule
    states: dict[LabelKey, SaturationState] = {}
    reference_states: dict[LabelKey, SaturationState] = {}
    for snapshot in scrapes:
        window.add(snapshot)
        kept.append(snapshot)
        while kept[0].t < snapshot.t - WINDOW_SECONDS:
            kept.pop(0)
        assert window.snapshots() == kept
        assert window.sole_series_key() == reference_sole_key(kept, signal_settings.cap)
        outcome = evaluation_outcome(
            evaluate_window, TargetIdentity("t", "u"), window, states, snapshot.t
        )
        expected = evaluation_outcome(
            reference_evaluation, kept, signal_settings, reference_states, snapshot.t
        )
        assert same(outcome, expected)
        if not isinstance(outcome, str):  # the exporter keeps the states of a failed one
            (_, states), (_, reference_states) = outcome, expected


def reference_sole_key(kept: Sequence[Snapshot], cap: float | None) -> LabelKey | None:
    """The key of the one series that every answered scrape kept holds alone, when each
    scrape's total is that series but its labels: every scrape's key (None where not)
    gathered into a set, as the window once did at every evaluation."""
    keys = {
        s.series[0].key
        if len(s.series) == 1 and total_equals_sole_series(s.series[0], cap)
        else None
        for s in kept
        if s.up
    }
    return keys.pop() if len(keys) == 1 else None


def evaluation_outcome(evaluate: Callable[..., tuple], *args: object) -> tuple | str:
    """The signals and states, or the error: a payload value the formulas cannot take
    (a NaN bucket count) fails both sides alike, and the exporter isolates it."""
    try:
        return evaluate(*args)
    except ValueError as err:
        return f"{type(err).__name__}: {err}"


@st.composite
def single_series(draw: st.DrawFn) -> SeriesSnapshot:
    server = Server(draw, MODEL_A)
    series = server.scrape()
    nan_in = draw(st.sampled_from([None, "running", "cap", "latency_means", "execution"]))
    if nan_in == "running":
        series = dataclasses.replace(series, running=math.nan)
    elif nan_in == "cap":
        series = dataclasses.replace(series, cap=math.nan)
    elif nan_in == "latency_means":
        series = dataclasses.replace(series, latency_means={"e2e": (1.0, math.nan)})
    elif nan_in == "execution":
        series = dataclasses.replace(series, execution_by_size={1: (math.nan, 0.1)})
    return series


@settings(max_examples=300, deadline=None)
@given(
    series=single_series(), cap=st.sampled_from([None, 8.0]), budget=st.sampled_from([None, 1.0])
)
def test_the_total_is_the_series_exactly_when_merging_one_series_changes_only_its_labels(
    series: SeriesSnapshot, cap: float | None, budget: float | None
) -> None:
    merged = merge_series([series], cap, budget)
    relabelled = dataclasses.replace(
        series,
        key=(),
        cap=effective_cap(series, cap),
        engine_cap=None,
        budget_seconds=series.budget_seconds if series.budget_seconds is not None else budget,
    )
    assert total_equals_sole_series(series, cap) == (merged == relabelled)


def hist(counts: Sequence[float], bounds: tuple[float, ...] = LATENCY_LAYOUTS[0]) -> Histogram:
    return Histogram(bounds, tuple(float(c) for c in counts), 0.0, float(counts[-1]))


def test_a_kept_restart_flag_at_the_first_histogram_in_the_window_is_not_read() -> None:
    # The window flags a restart against a scrape that has since left it.
    hists = [None, hist([1, 2, 3, 3]), hist([2, 4, 6, 7])]
    assert histogram_restarts(hists) == [False, False, False]
    inc = histogram_increase(hists, [False, True, False])
    assert inc == histogram_increase(hists)
    assert inc.counts == (2, 4, 6, 7)


def test_restarts_worked_out_are_those_between_histograms_present() -> None:
    hists = [
        hist([3, 3, 3, 3]),
        None,
        hist([1, 1, 1, 1]),
        hist([2, 2, 2, 2]),
        hist([1, 1], (0.2, INF)),
    ]
    assert histogram_restarts(hists) == [False, False, True, False, True]


def _batcher(t: float, batches: float) -> Snapshot:
    sizes = hist([batches] * 4, (1.0, 2.0, 4.0, INF))
    return Snapshot(
        "t",
        t,
        True,
        (SeriesSnapshot(MODEL_A, "inhouse", running=4.0, batches_total=batches, batch_size=sizes),),
    )


def test_the_total_of_one_series_is_evaluated_apart_where_merging_changes_it() -> None:
    settings = SignalSettings(cap=8.0)
    window = Window.of([_batcher(0.0, 1.0), _batcher(5.0, 3.0)], settings)
    # A total keeps no batch-size histogram: it is not the series but its labels.
    assert window.sole_series_key() is None
    signals, _ = evaluate_window(TargetIdentity("t", "u"), window, {}, 5.0)
    assert signals.series[0].batch_size_distribution == [(1.0, 1.0)]
    assert signals.total.batch_size_distribution == [(4.0, 1.0)]


def test_the_total_of_one_plain_series_is_the_series_without_labels() -> None:
    def scrape(t: float, running: float) -> Snapshot:
        return Snapshot("t", t, True, (SeriesSnapshot(MODEL_A, "vllm", running=running),))

    window = Window.of([scrape(0.0, 3.0), scrape(5.0, 6.0)], SignalSettings(cap=8.0))
    assert window.sole_series_key() == MODEL_A
    signals, states = evaluate_window(TargetIdentity("t", "u"), window, {}, 5.0)
    assert signals.total == dataclasses.replace(signals.series[0], labels={})
    assert signals.total.running_vs_cap == 0.75 and signals.series[0].labels == {"model_name": "a"}
    assert states[TOTAL] == states[MODEL_A]


# How a counter moves between scrapes: grows (by fractions whose sums round, or by
# enough to lose a fraction), restarts, or reads absent or NaN at that scrape.
COUNTER_MOVES = st.sampled_from([0.1, 0.7, 1.0, 3.0, 1e16] * 4 + ["restart", None, math.nan])


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.booleans(),
            st.lists(COUNTER_MOVES, min_size=len(COUNTERS), max_size=len(COUNTERS)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_a_tracks_counter_increases_are_counter_increase_over_its_points_to_the_bit(
    steps: list[tuple[bool, list[float | str | None]]],
) -> None:
    # The track's shortcut (the last value less the first, where no point in the window
    # holds a counter absent, NaN or lower than the point before) against the plain
    # definition over the points it holds, as points come and go.
    track = SeriesTrack()
    totals = [0.0] * len(COUNTERS)
    for drop, moves in steps:
        if drop and len(track.points) > 1:
            track.drop_oldest()
        values: list[float | None] = []
        for i, move in enumerate(moves):
            if move is None or move != move:  # absent or NaN at this scrape
                values.append(move)
                continue
            totals[i] = 0.2 if move == "restart" else totals[i] + move
            values.append(totals[i])
        series = SeriesSnapshot(MODEL_A, "vllm", **dict(zip(COUNTERS, values, strict=True)))
        track.add(0.0, series)
        expected = counter_increases([p for _, p in track.points])
        assert same(track.counter_increases(), expected)


@st.composite
def track_steps(draw: st.DrawFn) -> list[tuple[bool, SeriesSnapshot]]:
    """Points for one series' track, each after the oldest left or not: a server's
    histograms grown, restarted, re-laid-out, absent now and then."""
    server = Server(draw, MODEL_A)
    return [(draw(st.booleans()), server.scrape()) for _ in range(draw(st.integers(1, 20)))]


@settings(max_examples=300, deadline=None)
@given(steps=track_steps())
def test_a_tracks_histogram_increases_are_histogram_increase_over_its_points(
    steps: list[tuple[bool, SeriesSnapshot]],
) -> None:
    # The track's shortcut (the newest less the oldest, where every point holds the
    # histogram and none since the oldest restarted) against the plain definition over
    # the points it holds, as points come and go.
    track = SeriesTrack()
    for drop, series in steps:
        if drop and len(track.points) > 1:
            track.drop_oldest()
        track.add(0.0, series)
        points = [p for _, p in track.points]
        for name in ("latency:e2e", "output_tokens", "prompt_tokens", "batch_size"):
            plain = histogram_increase([histograms_of(p).get(name) for p in points])
            assert same(track.histogram_increase(name), plain), name


def test_a_counter_that_went_down_in_the_window_is_counted_through_its_restart() -> None:
    track = SeriesTrack()
    for requests in (0.1, 0.2, 1.1, 0.5, 0.9):
        track.add(0.0, SeriesSnapshot(MODEL_A, "vllm", requests_total=requests))
    # 1.1 less 0.1 before the restart, 0.9 after it: 0.9 - 0.1 + 1.1
    assert track.counter_increases()["requests_total"] == 0.9 - 0.1 + 1.1
    for _ in range(3):  # the drop (1.1 to 0.5) leaves with the point before it
        track.drop_oldest()
    assert track.counter_increases()["requests_total"] == 0.9 - 0.5
    assert track.counter_increases()["items_total"] is None


def test_points_leave_with_their_scrape_even_when_the_clock_steps_back() -> None:
    def scrape(t: float) -> Snapshot:
        return Snapshot("t", t, True, (SeriesSnapshot(MODEL_A, "vllm", running=t),))

    window = Window(10.0, SignalSettings())
    for t in (100.0, 95.0, 112.0):  # 112 - 10 drops 100, and then 95 behind it
        window.add(scrape(t))
    assert [t for t, _ in window.series[MODEL_A].points] == [112.0]
    window.add(Snapshot("t", 200.0, False, error="timed out"))
    assert window.series == {} and not window.total().points


def test_a_saturated_episode_unread_between_the_staleness_and_the_hold_is_the_references():
    # A case the random sequences seldom reach: a saturated total unread for longer than
    # the staleness (10 s) but not the staleness and the hold (20 s) stands, down or read
    # again, in the exporter and in the reference alike.
    from batchscope.exporter.config.settings import Target
    from batchscope.exporter.scrape.fetch import ScrapeResult
    from batchscope.exporter.scrape.loop import read_payload
    from tests.support.vllm_payload import VllmState, render

    settings = SignalSettings(cap=8, budget_seconds=0.5, hold_seconds=10.0, stale_seconds=10.0)
    target = Target("t", "http://127.0.0.1:1/metrics", engine="vllm", cap=8, budget_seconds=0.5)
    server = VllmState(running=8, waiting=20, kv_usage=0.5)
    window, kept = Window(WINDOW_SECONDS, settings), []
    states: dict[LabelKey, SaturationState] = {}
    reference_states: dict[LabelKey, SaturationState] = {}
    for t in [*range(1000, 1016), 1017, 1029, 1033]:
        server.finish(10, 1.2, 100)
        read = t not in (1017, 1029)
        result = ScrapeResult(render(server) if read else None, None if read else "refused", 0.1)
        snapshot = read_payload(target, float(t), result)[0]
        window.add(snapshot)
        kept = [*(s for s in kept if s.t >= t - WINDOW_SECONDS), snapshot]
        signals, states = evaluate_window(TargetIdentity("t", "u"), window, states, float(t))
        expected = reference_evaluation(kept, settings, reference_states, float(t))
        # The reference leaves out the scrape's duration, which the payload read keeps.
        outcome = (dataclasses.replace(signals, scrape_seconds=None), states)
        assert same(outcome, expected), t
        reference_states = expected[1]
        if t in (1029, 1033):  # 12 and 16 s after the first unread scrape
            assert signals.total.budget_saturated and states[TOTAL].above_since == 1001.0
