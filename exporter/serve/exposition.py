"""The exporter's own /metrics: the exposition of `FAMILIES` over the current signals.

`render_metrics` writes the text straight from the signals; the tests hold it byte for
byte to prometheus_client's generate_latest over a Collector of the same families
(`tests.support.reference_exposition`). A value that cannot be known is left out,
never filled with a made-up number.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.utils import floatToGoString

from batchscope.exporter.core.catalog import FAMILIES, GAUGES
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.families import (
    ADVICE,
    BINDING_LIMIT,
    BOUNDS,
    CONTINUOUS_GAIN,
    CURRENT_REPLICAS,
    DESIRED_REPLICAS,
    DIAGNOSIS,
    GOODPUT,
    LATENCY,
    LIMIT_RATIO,
    MODEL_DEMAND,
    MODEL_FAMILIES,
    NEEDED_REPLICAS,
    REPLICA_CAPACITY,
    REPLICAS_STALE,
    SCRAPE_DURATION,
    SLO_ATTAINMENT,
    SLO_BURN_RATE,
    SLO_BURNING,
    SLO_ERROR_BUDGET,
    SLO_HISTORY,
    SLO_OBJECTIVE,
    STATIC_UTILIZATION,
    TARGET_ERRORS,
    TARGET_UP,
    WINDOW_RESETS,
)
from batchscope.exporter.core.limits import BINDING_CHOICES
from batchscope.exporter.core.replicas import ModelReplicas
from batchscope.exporter.core.slo import SPEEDS


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def statistic_label(series: SeriesSignals) -> str:
    """The `quantile` label: the quantile, or `mean` where the engine exposes only a mean."""
    return "mean" if series.latency_statistic == "mean" else f"{series.latency_quantile:g}"


def _pairs(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, `name="escaped value"`) of each label, sorted by name as generate_latest does."""
    return sorted((name, f'{name}="{escape(value)}"') for name, value in labels.items())


def _braced(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join([text for _, text in pairs]) + "}" if pairs else ""


def _split_at_label(pairs: Sequence[tuple[str, str]], name: str) -> tuple[str, str]:
    """The braced label text with a label `name` added (in place of one so named), cut
    where that label goes: the text before it and the text after it."""
    before = "".join([text + "," for n, text in pairs if n < name])
    after = "".join(["," + text for n, text in pairs if n > name])
    return "{" + before, after + "}"


class _LabelTexts:
    """A label set written out: `text`, braced, and `at(name)`, the text before and after
    a label a family adds (`_split_at_label`), each cut once, when first asked; and
    `block(...)`, a family's lines that follow from one choice, written once a change."""

    __slots__ = ("_pairs", "_cuts", "_blocks", "text")

    def __init__(self, labels: tuple[tuple[str, str], ...]) -> None:
        self._pairs = _pairs(dict(labels))
        self._cuts: dict[str, tuple[str, str]] = {}
        self._blocks: dict[str, tuple[Hashable, str]] = {}
        self.text = _braced(self._pairs)

    def at(self, name: str) -> tuple[str, str]:
        cut = self._cuts.get(name)
        if cut is None:
            cut = self._cuts[name] = _split_at_label(self._pairs, name)
        return cut

    def block(self, family: str, choice: Hashable, write: Callable[[_LabelTexts, Any], str]) -> str:
        """The lines of `family` for this label set that `write` makes from this choice
        alone (the diagnosis state: one line a state, 1.0 at the current one; the binding
        limit, likewise). A series' state holds for many rounds, and writing its ~20 lines
        anew every render took a tenth of it. The rule that binds: `write` reads nothing
        but `choice` and these texts. Only the latest choice is kept, a few KB a series."""
        kept = self._blocks.get(family)
        if kept is not None and kept[0] == choice:
            return kept[1]
        text = write(self, choice)
        self._blocks[family] = (choice, text)
        return text


@functools.lru_cache(maxsize=65536)
def _label_texts(labels: tuple[tuple[str, str], ...]) -> _LabelTexts:
    """The texts of a label set, made once for every render that writes it: a fleet's
    targets and series keep their labels from one round to the next, and sorting,
    escaping and cutting them anew took a fifth of a render. A target's label sets (its
    own, its series', their latency's) hold about 5 KB."""
    return _LabelTexts(labels)


def number_text(value: float) -> str:
    """floatToGoString(value), in a third less time: it is Python's repr of the float but
    for infinities and NaN, and for a positive number with more than six digits before the
    point, which Go writes with an exponent; those it leaves to floatToGoString. About a
    fifth of the lines a render writes hold a number no other line of it holds."""
    text = repr(float(value))
    if text[-1] in "fn" or (value > 0 and text.find(".") > 6):  # inf, -inf, nan; 1234567.0
        return floatToGoString(value)
    return text


class _NumberTexts(dict):
    """number_text(value) as `texts[value]`, remembered: a fleet's /metrics repeats few
    numbers (0, 1, caps, budgets), and a dict lookup costs a fraction of formatting.
    Zero is never remembered, since 0.0 == -0.0 would give one the other's text."""

    def __missing__(self, value: float) -> str:
        text = number_text(value)
        if value:
            self[value] = text
        return text


def _slo_lines(
    lines: dict[str, list[str]],
    series: SeriesSignals,
    texts: _LabelTexts,
    text_of: Callable[[float], str],
) -> None:
    """A series' attainment and goodput (by bound) and, held to an objective, its SLO
    families, into `lines` by family name."""
    text = texts.text
    before, after = texts.at("bound")
    for family, bounded in (
        (SLO_ATTAINMENT, series.slo_attainment.share if series.slo_attainment else None),
        (GOODPUT, series.goodput_per_second),
    ):
        if bounded is not None:
            lines[family.name] += [
                f'{family.name}{before}bound="{bound}"{after} {text_of(value)}\n'
                for bound, value in zip(BOUNDS, bounded, strict=True)
            ]
    slo = series.slo
    if slo is None:
        return
    lines[SLO_OBJECTIVE.name].append(f"{SLO_OBJECTIVE.name}{text} {text_of(slo.objective)}\n")
    before, after = texts.at("window")
    lines[SLO_BURN_RATE.name] += [
        f'{SLO_BURN_RATE.name}{before}window="{b.window}"{after} {text_of(b.rate)}\n'
        for b in slo.burn_rates
        if b.rate is not None
    ]
    before, after = texts.at("speed")
    lines[SLO_BURNING.name] += [
        f'{SLO_BURNING.name}{before}speed="{speed}"{after} '
        f"{'1.0' if speed in slo.burning else '0.0'}\n"
        for speed in SPEEDS
    ]
    if slo.error_budget_remaining is not None:
        lines[SLO_ERROR_BUDGET.name].append(
            f"{SLO_ERROR_BUDGET.name}{text} {text_of(slo.error_budget_remaining)}\n"
        )
    lines[SLO_HISTORY.name].append(f"{SLO_HISTORY.name}{text} {text_of(slo.history_seconds)}\n")


_STATE_LABELS = tuple((state, f'state="{escape(state)}"') for state in DIAGNOSIS_STATES)


@functools.cache
def _limit_label(limit: str) -> str:
    return f'limit="{escape(limit)}"'


def _diagnosis_lines(texts: _LabelTexts, choice: tuple[str, bool]) -> str:
    """A series' diagnosis lines for (its state, whether its target was read): one a
    state, 1.0 at the current one; a target not read this scrape knows only its own
    state (down, unreadable, stalled), so only that line."""
    current, read = choice
    before, after = texts.at("state")
    return "".join(
        [
            f"{DIAGNOSIS.name}{before}{label}{after} {'1.0' if state == current else '0.0'}\n"
            for state, label in _STATE_LABELS
            if read or state == current
        ]
    )


def _binding_lines(texts: _LabelTexts, binding: str | None) -> str:
    """A series' binding-limit lines: one a limit, 1.0 at the one that binds."""
    before, after = texts.at("limit")
    return "".join(
        [
            f"{BINDING_LIMIT.name}{before}{_limit_label(limit)}{after} "
            f"{'1.0' if limit == binding else '0.0'}\n"
            for limit in BINDING_CHOICES
        ]
    )


def render_metrics(targets: Iterable[TargetSignals]) -> bytes:
    """The /metrics exposition of these targets' signals: byte for byte what
    generate_latest writes for a registry holding a Collector of FAMILIES over them, at a
    fraction of its CPU. Each line is written straight from the signals, without Metric
    or Sample objects; each series' labels are sorted and escaped once for all its lines,
    and a family that adds a label (`state`, `bound`, `kind`, `reason`) only slots it in."""
    lines: dict[str, list[str]] = {family.name: [] for family in FAMILIES}
    gauges = tuple((lines[family.name], family.name, attribute) for family, attribute in GAUGES)
    text_of = _NumberTexts().__getitem__
    for t in targets:
        target_labels = {"target": t.target, **t.extra_labels}
        _target_lines(lines, t, _label_texts(tuple(target_labels.items())), text_of)
        for s in (*t.series, t.total) if t.up else (t.total,):
            labels = {**target_labels, **s.labels}
            texts = _label_texts(tuple(labels.items()))
            _series_lines(lines, gauges, s, labels, texts, text_of)
            choice = (s.diagnosis.state, t.read)
            lines[DIAGNOSIS.name].append(texts.block(DIAGNOSIS.name, choice, _diagnosis_lines))
            if t.read:
                _limit_lines(lines, s, texts, text_of)
    parts: list[str] = []
    for family in FAMILIES:
        parts.append(family.header())
        parts.extend(lines[family.name])
    return "".join(parts).encode()


def _target_lines(
    lines: dict[str, list[str]],
    t: TargetSignals,
    target_texts: _LabelTexts,
    text_of: Callable[[float], str],
) -> None:
    """A target's own lines: up, its error and reset counters, its scrape's duration."""
    target_text = target_texts.text
    lines[TARGET_UP.name].append(f"{TARGET_UP.name}{target_text} {text_of(t.up)}\n")
    for family, attribute in (
        (TARGET_ERRORS, "errors_total"),
        (WINDOW_RESETS, "window_resets_total"),
    ):
        counts = getattr(t, attribute)
        if counts:
            before, after = target_texts.at("reason")
            lines[family.name] += [
                f'{family.name}_total{before}reason="{escape(reason)}"{after} {text_of(count)}\n'
                for reason, count in sorted(counts.items())
            ]
    if t.scrape_seconds is not None:
        lines[SCRAPE_DURATION.name].append(
            f"{SCRAPE_DURATION.name}{target_text} {text_of(t.scrape_seconds)}\n"
        )


def _series_lines(
    lines: dict[str, list[str]],
    gauges: tuple[tuple[list[str], str, str], ...],
    s: SeriesSignals,
    labels: dict[str, str],
    texts: _LabelTexts,
    text_of: Callable[[float], str],
) -> None:
    """A series' gauges, latency, static utilisation and gain, SLO and advice lines."""
    text = texts.text
    for out, name, attribute in gauges:
        value = getattr(s, attribute)
        if value is not None and math.isfinite(value):
            out.append(f"{name}{text} {text_of(value)}\n")
    if s.latency_seconds is not None and math.isfinite(s.latency_seconds):
        quantile = {"quantile": statistic_label(s), "histogram": s.latency_histogram}
        latency_text = _label_texts(tuple({**labels, **quantile}.items())).text
        lines[LATENCY.name].append(f"{LATENCY.name}{latency_text} {text_of(s.latency_seconds)}\n")
    if s.static_utilization is not None:
        u = s.static_utilization
        before, after = texts.at("bound")
        for bound, value in zip(BOUNDS, (u.estimate, u.lower, u.upper), strict=True):
            lines[STATIC_UTILIZATION.name].append(
                f'{STATIC_UTILIZATION.name}{before}bound="{bound}"{after} {text_of(value)}\n'
            )
        lines[CONTINUOUS_GAIN.name].append(
            f"{CONTINUOUS_GAIN.name}{text} {text_of(u.continuous_batching_gain)}\n"
        )
    _slo_lines(lines, s, texts, text_of)
    if s.advice.items:
        before, after = texts.at("kind")
        lines[ADVICE.name] += [
            f"{ADVICE.name}{before}{_kind_label(item.kind)}{after} {text_of(item.value)}\n"
            for item in s.advice.items
            if math.isfinite(item.value)
        ]


def _limit_lines(
    lines: dict[str, list[str]],
    s: SeriesSignals,
    texts: _LabelTexts,
    text_of: Callable[[float], str],
) -> None:
    """A read series' limit ratios and its binding limit."""
    before, after = texts.at("limit")
    lines[LIMIT_RATIO.name] += [
        f"{LIMIT_RATIO.name}{before}{_limit_label(r.limit)}{after} {text_of(r.ratio)}\n"
        for r in s.limits.readings
        if r.ratio is not None and math.isfinite(r.ratio)
    ]
    lines[BINDING_LIMIT.name].append(
        texts.block(BINDING_LIMIT.name, s.limits.binding, _binding_lines)
    )


@functools.cache
def _kind_label(kind: str) -> str:
    return f'kind="{escape(kind)}"'


def render_models(models: Iterable[ModelReplicas]) -> bytes:
    """The /metrics exposition of the models' replica counts (MODEL_FAMILIES), as
    generate_latest writes them for a Collector of those families: a count that is not
    known is left out; the stale flag is written for every model."""
    lines: dict[str, list[str]] = {family.name: [] for family in MODEL_FAMILIES}
    for m in models:
        count = m.count
        label = f'model_name="{escape(count.model)}"'
        values = (
            (DESIRED_REPLICAS, m.desired),
            (NEEDED_REPLICAS, count.count),
            (CURRENT_REPLICAS, count.current),
            (MODEL_DEMAND, count.demand),
        )
        for family, value in values:
            if value is not None and math.isfinite(value):
                lines[family.name].append(f"{family.name}{{{label}}} {number_text(value)}\n")
        capacity = count.capacity
        if capacity is not None and math.isfinite(capacity) and count.limit is not None:
            lines[REPLICA_CAPACITY.name].append(
                f'{REPLICA_CAPACITY.name}{{limit="{escape(count.limit)}",{label}}} '
                f"{number_text(capacity)}\n"
            )
        stale = "1.0" if m.held.stale else "0.0"
        lines[REPLICAS_STALE.name].append(f"{REPLICAS_STALE.name}{{{label}}} {stale}\n")
    return "".join(
        family.header() + "".join(lines[family.name]) for family in MODEL_FAMILIES
    ).encode()
