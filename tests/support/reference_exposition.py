"""The reference /metrics writer: prometheus_client's own objects over the same families.

`SignalsCollector` is a prometheus-client Collector, fresh families on every collect()
and no state in metric objects (client_python's pattern). The exporter serves
`render_metrics`, which writes the same text directly; the tests and the render
benchmark hold the two byte for byte together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from batchscope.exporter.core.catalog import FAMILIES, GAUGES
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.families import (
    ADVICE,
    BINDING_LIMIT,
    BOUNDS,
    CONTINUOUS_GAIN,
    DIAGNOSIS,
    GOODPUT,
    LATENCY,
    LIMIT_RATIO,
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
    Family,
)
from batchscope.exporter.core.limits import BINDING_CHOICES
from batchscope.exporter.core.slo import SPEEDS
from batchscope.exporter.serve.exposition import statistic_label


def _metric(family: Family) -> Metric:
    return Metric(family.name, family.documentation, family.type)


def _add_slo(metrics: dict[str, Metric], s: SeriesSignals, labels: dict[str, str]) -> None:
    """A series' attainment, goodput and SLO samples."""
    attained = s.slo_attainment.share if s.slo_attainment is not None else None
    for family, bounded in ((SLO_ATTAINMENT, attained), (GOODPUT, s.goodput_per_second)):
        if bounded is not None:
            for bound, value in zip(BOUNDS, bounded, strict=True):
                metrics[family.name].add_sample(family.name, {**labels, "bound": bound}, value)
    slo = s.slo
    if slo is None:
        return
    metrics[SLO_OBJECTIVE.name].add_sample(SLO_OBJECTIVE.name, labels, slo.objective)
    for burn in slo.burn_rates:
        if burn.rate is not None:
            metrics[SLO_BURN_RATE.name].add_sample(
                SLO_BURN_RATE.name, {**labels, "window": burn.window}, burn.rate
            )
    for speed in SPEEDS:
        metrics[SLO_BURNING.name].add_sample(
            SLO_BURNING.name, {**labels, "speed": speed}, 1.0 if speed in slo.burning else 0.0
        )
    if slo.error_budget_remaining is not None:
        metrics[SLO_ERROR_BUDGET.name].add_sample(
            SLO_ERROR_BUDGET.name, labels, slo.error_budget_remaining
        )
    metrics[SLO_HISTORY.name].add_sample(SLO_HISTORY.name, labels, slo.history_seconds)


class SignalsCollector(Collector):
    """Collects from `source()`, the list of current TargetSignals: the families as
    prometheus_client objects, for a registry. The exporter serves `render_metrics`,
    the same bytes written directly (tests hold the two together)."""

    def __init__(self, source: Callable[[], Iterable[TargetSignals]]) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        metrics = {family.name: _metric(family) for family in FAMILIES}
        (up, duration, latency, static, gain, diagnosis, limit_ratio, binding) = (
            metrics[family.name]
            for family in (
                TARGET_UP,
                SCRAPE_DURATION,
                LATENCY,
                STATIC_UTILIZATION,
                CONTINUOUS_GAIN,
                DIAGNOSIS,
                LIMIT_RATIO,
                BINDING_LIMIT,
            )
        )
        advice, errors, resets = (
            metrics[family.name]
            for family in (
                ADVICE,
                TARGET_ERRORS,
                WINDOW_RESETS,
            )
        )
        for t in self.source():
            target_labels = {"target": t.target, **t.extra_labels}
            up.add_sample(up.name, target_labels, 1.0 if t.up else 0.0)
            for counter, counts in ((errors, t.errors_total), (resets, t.window_resets_total)):
                for reason, count in sorted(counts.items()):
                    counter.add_sample(
                        counter.name + "_total", {**target_labels, "reason": reason}, float(count)
                    )
            if t.scrape_seconds is not None:
                duration.add_sample(duration.name, target_labels, t.scrape_seconds)
            for s in (*t.series, t.total) if t.up else (t.total,):
                labels = {**target_labels, **s.labels}
                for family, attribute in GAUGES:
                    value = getattr(s, attribute)
                    if value is not None and math.isfinite(value):
                        metrics[family.name].add_sample(family.name, labels, float(value))
                if s.latency_seconds is not None and math.isfinite(s.latency_seconds):
                    latency.add_sample(
                        latency.name,
                        {
                            **labels,
                            "quantile": statistic_label(s),
                            "histogram": s.latency_histogram,
                        },
                        s.latency_seconds,
                    )
                if s.static_utilization is not None:
                    u = s.static_utilization
                    for bound, value in zip(BOUNDS, (u.estimate, u.lower, u.upper), strict=True):
                        static.add_sample(static.name, {**labels, "bound": bound}, value)
                    gain.add_sample(gain.name, labels, u.continuous_batching_gain)
                _add_slo(metrics, s, labels)
                for item in s.advice.items:
                    if math.isfinite(item.value):
                        advice.add_sample(advice.name, {**labels, "kind": item.kind}, item.value)
                for state in DIAGNOSIS_STATES if t.read else (s.diagnosis.state,):
                    diagnosis.add_sample(
                        diagnosis.name,
                        {**labels, "state": state},
                        1.0 if s.diagnosis.state == state else 0.0,
                    )
                if not t.read:
                    continue
                for r in s.limits.readings:
                    if r.ratio is not None and math.isfinite(r.ratio):
                        limit_ratio.add_sample(
                            limit_ratio.name, {**labels, "limit": r.limit}, r.ratio
                        )
                for limit in BINDING_CHOICES:
                    binding.add_sample(
                        binding.name,
                        {**labels, "limit": limit},
                        1.0 if s.limits.binding == limit else 0.0,
                    )
        yield from metrics.values()
