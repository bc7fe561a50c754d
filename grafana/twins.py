"""Each recorded series that mirrors an exporter signal, and the exporter's reading it equals.

The recording rules (grafana/rules.py) compute the exporter's signals a second time, on
purpose: Prometheus evaluates them at fleet scale. `TWINS` says, one line a signal, which
recorded series (picked by its own labels) equals which reading of the exporter's
`SeriesSignals` for the same engine series; `MODEL_TWINS`, which recorded series by
`model_name` equals which reading of the exporter's count of the model. A signal whose
catalog entry names its `rule` is paired from the catalog; the others (labels, tolerances,
states) are paired here, one line each. tests/grafana/test_rule_twins.py holds every line
equal on fixed series through `promtool test rules` (test_replica_twins.py holds the model
lines for a model of two data-parallel engines); tests/e2e holds the rules equal to the
exporter through a real Prometheus.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from batchscope.exporter.core.catalog import SERIES
from batchscope.exporter.core.demand import Demand, ReplicaCapacity
from batchscope.exporter.core.evaluate import SeriesSignals
from batchscope.exporter.core.replicas import (
    ModelCount,
    ReplicaBounds,
    count_model,
    model_of,
    series_replica,
)
from batchscope.grafana import replica_rules, rules

# The labels the latency rules carry for a target judged by its default quantile and
# histogram (p99 of end-to-end latency).
P99_E2E = {"quantile": "0.99", "histogram": "e2e"}
# Inside a quantile's bucket PromQL multiplies the bucket's width by the rank's share of
# the bucket; the exporter multiplies by the rank, then divides: the last bits can differ.
INTERPOLATED = 1e-12
# The SLO rules over the exporter's window (no `window` label) and over the 5-minute one.
SLO_WINDOW = {"histogram": "e2e", "window": ""}
SLO_5M = {"histogram": "e2e", "window": "5m"}


@dataclass(frozen=True, slots=True)
class Twin:
    """`record` (with `labels`; "" for a label that must be absent) equals `read` of the
    exporter's signals, which /metrics exports as `exported`. `read` gives None where the
    exporter knows no value: nothing is compared there. `peak`: the exporter judges the
    running batch at its peak over the last few scrapes (`running_peak`), a rule at the
    instant, so the two agree where the batch held still. `rel_tol`: how far apart the two
    may be, relatively, where the arithmetic's order differs (0: to the last bit)."""

    exported: str
    record: str
    read: Callable[[SeriesSignals], float | None]
    labels: Mapping[str, str] = field(default_factory=dict)
    peak: bool = False
    rel_tol: float = 0.0
    # Recorded per model (`model_name` alone), not per engine: `read` sees the model of
    # the one engine series as its only replica (`_model`).
    model_level: bool = False


def _state(name: str) -> Callable[[SeriesSignals], float]:
    return lambda s: float(s.diagnosis.state == name)


def _binding(limit: str) -> Callable[[SeriesSignals], float]:
    return lambda s: float(s.limits.binding == limit)


def _known(value: object, read: Callable) -> float | None:
    """`read(value)`, or None where the exporter has no `value` (no request, no objective)."""
    return None if value is None else read(value)


def _model(read: Callable[[ModelCount], float | None]) -> Callable[[SeriesSignals], float | None]:
    """`read` of the count of the series' model, the series its one replica."""

    def of(s: SeriesSignals) -> float | None:
        model = model_of(None, s.labels, "")
        return read(count_model(model, [series_replica("", s)], ReplicaBounds()))

    return of


@dataclass(frozen=True, slots=True)
class ModelTwin:
    """`record` (by `model_name` alone) equals `read` of the exporter's count of the model
    (`ModelCount`, before it is held), as `Twin`'s fields say; `peak`: where every replica's
    batch held still."""

    exported: str
    record: str
    read: Callable[[ModelCount], float | None]
    peak: bool = False
    rel_tol: float = 0.0


# The replica count of a model: its demand, a replica's capacity, its replicas, its count.
MODEL_TWINS = (
    ModelTwin("batchscope_model_demand_per_second", replica_rules.MODEL_DEMAND, lambda c: c.demand),
    ModelTwin(
        "batchscope_replica_capacity",
        replica_rules.MODEL_CAPACITY_MEAN,
        lambda c: c.capacity,
        peak=True,
        rel_tol=INTERPOLATED,
    ),
    ModelTwin("batchscope_replicas", replica_rules.MODEL_REPLICAS, lambda c: c.current),
    ModelTwin(
        "batchscope_needed_replicas", replica_rules.MODEL_COUNT, lambda c: c.count, peak=True
    ),
)

TWINS = (
    # Each signal the catalog pairs with a recorded series one for one.
    *(Twin(s.metric, s.rule, attrgetter(s.name)) for s in SERIES if s.rule and s.metric),
    Twin(
        'batchscope_limit_ratio{limit="token_budget"}',
        rules.TOKEN_BUDGET_RATIO,
        lambda s: s.token_budget_ratio,
    ),
    Twin(
        "batchscope_latency_seconds",
        rules.LATENCY,
        lambda s: s.latency_seconds,
        P99_E2E,
        rel_tol=INTERPOLATED,
    ),
    Twin(
        "batchscope_budget_utilization_ratio",
        rules.BUDGET_UTILIZATION,
        lambda s: s.budget_utilization,
        P99_E2E,
        rel_tol=INTERPOLATED,
    ),
    Twin(
        "batchscope_budget_saturated",
        rules.BUDGET_SATURATED_RULE,
        lambda s: float(s.budget_saturated),
        P99_E2E,
    ),
    *(
        Twin(f'batchscope_diagnosis{{state="{state}"}}', record, _state(state), peak=True)
        for state, record in (
            ("memory_bound", rules.MEMORY_BOUND_RULE),
            ("stalled", rules.STALLED_RULE),
            ("token_budget_bound", rules.TOKEN_BUDGET_BOUND_RULE),
        )
    ),
    *(
        Twin(
            f'batchscope_binding_limit{{limit="{limit}"}}',
            rules.BINDING_LIMIT,
            _binding(limit),
            {"limit": limit},
            peak=True,
        )
        for limit in rules.BINDING_LIMITS
    ),
    Twin(
        'batchscope_slo_attainment_ratio{bound="estimate"}',
        rules.SLO_ATTAINMENT,
        lambda s: _known(s.slo_attainment, lambda a: a.share.estimate),
        SLO_WINDOW,
    ),
    Twin(
        'batchscope_goodput_requests_per_second{bound="estimate"}',
        rules.SLO_WITHIN,
        lambda s: _known(s.goodput_per_second, lambda g: g.estimate),
        SLO_WINDOW,
    ),
    Twin(
        'batchscope_slo_burn_rate_ratio{window="5m"}',
        rules.SLO_BURN_RATE,
        lambda s: _known(s.slo, lambda slo: slo.rate("5m")),
        SLO_5M,
    ),
    # The replica count: each engine's demand and capacity (the JSON's), the model's.
    Twin("series demand.per_second", replica_rules.DEMAND, lambda s: _known(s.demand, _per_second)),
    Twin(
        "series replica_capacity.per_second",
        replica_rules.CAPACITY,
        lambda s: _known(s.replica_capacity, _per_second),
        peak=True,
        rel_tol=INTERPOLATED,
    ),
    *(
        Twin(t.exported, t.record, _model(t.read), peak=t.peak, rel_tol=t.rel_tol, model_level=True)
        for t in MODEL_TWINS
    ),
)


def _per_second(value: Demand | ReplicaCapacity) -> float:
    return value.per_second
