"""The JSON API's shape: every body the exporter's /api/v1/... endpoints return.

As all of /metrics lives in `exposition.py` (over `families.py`), all of the JSON lives here; docs/api.md
documents each field and a test holds the two together. Every body carries
`api_version`: fields may be added within a version, never renamed, removed or given
another meaning (that takes a new version).
"""

from __future__ import annotations

import functools
import json
import math
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from batchscope.exporter.config.settings import Settings, Target, config_fields
from batchscope.exporter.config.values import redacted_url
from batchscope.exporter.core.advice import Advice, AdviceItem
from batchscope.exporter.core.catalog import HISTORY_COLUMNS, HISTORY_FLAGS, SUMMARY_FIELDS
from batchscope.exporter.core.demand import Demand, ReplicaCapacity
from batchscope.exporter.core.diagnosis import Diagnosis
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.limits import LimitReading, Limits
from batchscope.exporter.core.replicas import ModelReplicas, Replica, ReplicaSettings
from batchscope.exporter.core.slo import Attainment, Bounded, SloStatus

API_VERSION = 1


def finite(value: Any) -> Any:
    """The value with NaN and infinities replaced by None, so the JSON stays valid."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def encode(body: Mapping[str, Any]) -> bytes:
    """A response body as JSON bytes (NaN and infinities as null)."""
    try:
        # Most bodies hold no NaN: json refuses one, and only then `finite` walks the body
        # (the walk costs more than the encoding).
        return json.dumps(body, allow_nan=False).encode()
    except ValueError:
        return json.dumps(finite(dict(body)), allow_nan=False).encode()


def _versioned(body: dict[str, Any]) -> dict[str, Any]:
    return {"api_version": API_VERSION, **body}


# ---------------------------------------------------------------- /api/v1/signals


def _fields(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, values as they are (asdict without its deep copy,
    which was most of the cost of /api/v1/signals at a fleet's size)."""
    return {name: getattr(instance, name) for name in _FIELD_NAMES[type(instance)]}


_FIELD_NAMES = {
    cls: tuple(f.name for f in fields(cls))
    for cls in (SeriesSignals, Diagnosis, Advice, LimitReading)
}
# An advice item's sentence is its `text`, written from its `words` when read.
_FIELD_NAMES[AdviceItem] = tuple(
    "text" if f.name == "words" else f.name for f in fields(AdviceItem)
)


def series_json(series: SeriesSignals) -> dict[str, Any]:
    """Every signal of one series (or a target total), each under its field name."""
    out = _fields(series)
    out["labels"] = dict(series.labels)
    static = series.static_utilization
    out["static_utilization"] = static.to_dict() if static is not None else None
    out["batch_size_distribution"] = [
        {"size": size if math.isfinite(size) else "+Inf", "fraction": fraction}
        for size, fraction in series.batch_size_distribution
    ]
    out["diagnosis"] = _fields(series.diagnosis)
    out["not_exposed"] = list(series.not_exposed)
    out["limits"] = limits_json(series.limits)
    out["advice"] = advice_json(series)
    out["slo_attainment"] = attainment_json(series.slo_attainment)
    out["goodput_per_second"] = bounded_json(series.goodput_per_second)
    out["slo"] = slo_json(series.slo)
    out["demand"] = demand_json(series.demand)
    out["replica_capacity"] = capacity_json(series.replica_capacity)
    return out


def demand_json(demand: Demand | None) -> dict[str, Any] | None:
    """A replica's demand over the window: per second, and its inputs."""
    if demand is None:
        return None
    return {"per_second": demand.per_second, "unit": demand.unit, "inputs": demand.inputs()}


def capacity_json(capacity: ReplicaCapacity | None) -> dict[str, Any] | None:
    """What a replica serves within the budget at its binding limit, as the advice says a
    number: its value, inputs, confidence, caveats and sentence."""
    if capacity is None:
        return None
    return {
        "per_second": capacity.per_second,
        "unit": capacity.unit,
        "limit": capacity.limit,
        "at_limit_per_second": capacity.at_limit_per_second,
        "concurrency": capacity.concurrency,
        "slot_seconds": capacity.slot_seconds,
        "headroom": capacity.headroom,
        "inputs": dict(capacity.inputs),
        "confidence": capacity.confidence,
        "caveats": list(capacity.caveats),
        "text": capacity.text,
    }


def bounded_json(value: Bounded | None) -> dict[str, float] | None:
    """A bounded value: its estimate and bounds."""
    return None if value is None else value._asdict()


def attainment_json(attained: Attainment | None) -> dict[str, Any] | None:
    """The window's attainment: share (estimate, bounds), requests, the edges around the
    budget, and how exact it is in words."""
    if attained is None:
        return None
    edges = attained.edges
    return {
        **attained.share._asdict(),
        "exact": edges.exact,
        "requests": attained.requests,
        "lower_edge": edges.lower,
        "upper_edge": edges.upper,
        "reason": attained.reason,
    }


def slo_json(slo: SloStatus | None) -> dict[str, Any] | None:
    """The objective's status: burn rate per window, the speeds burning, the error budget."""
    if slo is None:
        return None
    return {
        "objective": slo.objective,
        "burn_rates": [
            {"window": b.window, "seconds": b.seconds, "rate": b.rate} for b in slo.burn_rates
        ],
        "burning": list(slo.burning),
        "error_budget_remaining": slo.error_budget_remaining,
        "history_seconds": slo.history_seconds,
        "period_seconds": slo.period_seconds,
    }


def limits_json(limits: Limits) -> dict[str, Any]:
    """What limits the batch: the binding limit, those at their bound, each reading."""
    return {
        "readings": [_fields(reading) for reading in limits.readings],
        "binding": limits.binding,
        "at_bound": list(limits.at_bound),
    }


def target_json(signals: TargetSignals) -> dict[str, Any]:
    """One target at its latest evaluation: up/down, each series and the total."""
    return {
        "target": signals.target,
        "url": redacted_url(signals.url),
        "labels": dict(signals.extra_labels),
        "t": signals.t,
        "up": signals.up,
        "error": signals.error,
        "scrape_seconds": signals.scrape_seconds,
        "series": [series_json(s) for s in signals.series],
        "total": series_json(signals.total),
    }


def evaluation_json(settings: Settings) -> dict[str, Any]:
    """How every target is evaluated: the time frames its signals are read over."""
    return {
        "interval_seconds": settings.interval_seconds,
        "window_seconds": settings.window_seconds,
        "hold_seconds": settings.hold_seconds,
        "saturation_threshold": settings.saturation_threshold,
    }


def signals_response(
    generated_at: float, targets: Iterable[TargetSignals], evaluation: Mapping[str, Any]
) -> dict[str, Any]:
    """GET /api/v1/signals (and `?target=NAME`: the list holds that target alone)."""
    return _versioned(
        {
            "generated_at": generated_at,
            "evaluation": dict(evaluation),
            "targets": [target_json(t) for t in targets],
        }
    )


def series_summary_json(series: SeriesSignals) -> dict[str, Any]:
    """The fields of one series (or total) a fleet overview shows."""
    out = {name: getattr(series, name) for name in SUMMARY_FIELDS}
    out["labels"] = dict(series.labels)
    out["diagnosis"] = _fields(series.diagnosis)
    out["not_exposed"] = list(series.not_exposed)
    return out


def target_summary_json(signals: TargetSignals) -> dict[str, Any]:
    """One target in a fleet's overview: its total, and each series where it has several."""
    series = signals.series if len(signals.series) > 1 else ()
    return {
        "target": signals.target,
        "t": signals.t,
        "up": signals.up,
        "error": signals.error,
        "series": [series_summary_json(s) for s in series],
        "total": series_summary_json(signals.total),
    }


def summary_response(
    generated_at: float, targets: Iterable[TargetSignals], evaluation: Mapping[str, Any]
) -> dict[str, Any]:
    """GET /api/v1/signals?view=summary: every target's row of a fleet overview, a few
    hundred bytes each where the full body carries kilobytes (limits, advice, ...)."""
    return _versioned(
        {
            "generated_at": generated_at,
            "evaluation": dict(evaluation),
            "targets": [target_summary_json(t) for t in targets],
        }
    )


# ---------------------------------------------------------------- /api/v1/advice


def advice_json(series: SeriesSignals) -> dict[str, Any]:
    """One series' advice: its summary and items, each with its inputs and confidence."""
    advice = series.advice
    items = [
        {**_fields(item), "inputs": dict(item.inputs), "caveats": list(item.caveats)}
        for item in advice.items
    ]
    return {**_fields(advice), "items": items}


def advice_response(generated_at: float, targets: Iterable[TargetSignals]) -> dict[str, Any]:
    """GET /api/v1/advice: per target, each series' advice and the total's."""
    return _versioned(
        {
            "generated_at": generated_at,
            "targets": [
                {
                    "target": t.target,
                    "up": t.up,
                    "series": [
                        {"labels": s.labels, "engine": s.engine, "advice": advice_json(s)}
                        for s in t.series
                    ],
                    "total": advice_json(t.total),
                }
                for t in targets
            ],
        }
    )


# ---------------------------------------------------------------- /api/v1/replicas


def replica_json(replica: Replica) -> dict[str, Any]:
    """One replica of a model as this round read it: the spread across a model's replicas."""
    return {
        "target": replica.target,
        "labels": dict(replica.labels),
        "read": replica.read,
        "running": replica.running,
        "waiting": replica.waiting,
        "cap": replica.cap,
        "limit": replica.limit,
        "role": replica.role,
        "demand_per_second": None if replica.demand is None else replica.demand.per_second,
        "capacity_per_second": (None if replica.capacity is None else replica.capacity.per_second),
    }


def model_replicas_json(model: ModelReplicas, settings: ReplicaSettings) -> dict[str, Any]:
    """One model's replica count: held (`desired_replicas`) and now (`needed_replicas`),
    the demand and a replica's capacity with their inputs, the change pending, the spread."""
    count, held = model.count, model.held
    wait = settings.scale_up_seconds
    if held.pending is not None and held.desired is not None and held.pending < held.desired:
        wait = settings.scale_down_seconds
    return {
        "model": count.model,
        "desired_replicas": held.desired,
        "stale": held.stale,
        "needed_replicas": count.count,
        "unbounded_replicas": count.needed,
        "replicas": count.current,
        "replicas_read": count.read,
        "min_replicas": count.bounds.min_replicas,
        "max_replicas": count.bounds.max_replicas,
        "state": count.state,
        "reason": count.reason,
        "demand": None
        if count.demand is None
        else {"per_second": count.demand, "inputs": dict(count.demand_inputs)},
        "capacity": None
        if count.capacity is None
        else {
            "per_second": count.capacity,
            "limit": count.limit,
            "inputs": dict(count.capacity_inputs),
            "confidence": count.confidence,
            "caveats": list(count.caveats),
        },
        "pending": None
        if held.pending is None or held.since is None
        else {"replicas": held.pending, "since": held.since, "at": held.since + wait},
        "spread": [replica_json(r) for r in count.replicas],
    }


def replicas_response(
    generated_at: float,
    models: Iterable[ModelReplicas],
    settings: ReplicaSettings,
    counting: bool = True,
) -> dict[str, Any]:
    """GET /api/v1/replicas: every model's replica count (none, `counting` false, where
    --replica-count is off)."""
    return _versioned(
        {
            "generated_at": generated_at,
            "counting": counting,
            "scale_up_seconds": settings.scale_up_seconds,
            "scale_down_seconds": settings.scale_down_seconds,
            "models": [model_replicas_json(m, settings) for m in models],
        }
    )


# ---------------------------------------------------------------- /api/v1/history


# A target's history keeps one row per evaluation, as compact as the API allows: at
# 1,000 targets and 720 points each, a dict per point held 662 MiB and gave the garbage
# collector 1.4 million more objects to walk; a row is a tuple of a time, a flag, the
# numbers packed in one bytes object and two strings (216 MiB for the same), and holds
# nothing the collector tracks. Rows become the API's points (dicts) only when read.
#
# A point's numbers, the catalog's history columns (`HISTORY_COLUMNS`) in order; None is
# packed as NaN, which the JSON says as null either way. The flags (`HISTORY_FLAGS`) are
# packed as 0 or 1.
POINT_NUMBERS = tuple(column for column, _, _ in HISTORY_COLUMNS)
PACKED_NUMBERS = struct.Struct(f"<{len(POINT_NUMBERS)}d")
POINT_FLAGS = HISTORY_FLAGS

# (numbers packed, diagnosis state, diagnosis reason) of one series at one evaluation.
SeriesRow = tuple[bytes, str, str]
# (t, up, the three items of the total's SeriesRow, and for a target with several series
# each one's labels as (name, value) pairs with its SeriesRow). Flat, so that one pass of
# the collector finds a one-series row untrackable (it untracks a tuple of untracked items).
HistoryRow = tuple[
    float, bool, bytes, str, str, tuple[tuple[tuple[tuple[str, str], ...], SeriesRow], ...]
]


def _series_row(series: SeriesSignals) -> SeriesRow:
    numbers = [number(getattr(series, name)) for _, name, number in HISTORY_COLUMNS]
    packed = PACKED_NUMBERS.pack(*[math.nan if v is None else v for v in numbers])
    # Interned: one copy of each distinct state and reason, however many rows hold it.
    return packed, sys.intern(series.diagnosis.state), sys.intern(series.diagnosis.reason)


@functools.lru_cache(maxsize=65536)
def _shared_labels(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """One tuple for equal label sets: a series' labels are kept once, not once a row."""
    return labels


def history_row(signals: TargetSignals) -> HistoryRow:
    """The row kept in a target's history for one evaluation (`history_point` reads it):
    the total's numbers, and each series' when the target has more than one."""
    series = (
        tuple((_shared_labels(tuple(s.labels.items())), _series_row(s)) for s in signals.series)
        if len(signals.series) > 1
        else ()
    )
    return signals.t, signals.up, *_series_row(signals.total), series


def _series_point(row: SeriesRow) -> dict[str, Any]:
    packed, state, reason = row
    point = {
        name: None if value != value else value  # NaN is None
        for name, value in zip(POINT_NUMBERS, PACKED_NUMBERS.unpack(packed), strict=True)
    }
    for flag in POINT_FLAGS:
        point[flag] = point[flag] == 1.0
    point["diagnosis"] = state
    point["diagnosis_reason"] = reason
    return point


def history_point(row: HistoryRow) -> dict[str, Any]:
    """One history point as the API answers it: the total's numbers, and each series'
    under `series` when the target has more than one."""
    t, up, packed, state, reason, series = row
    return {
        "t": t,
        "up": up,
        **_series_point((packed, state, reason)),
        "series": [{"labels": dict(labels), **_series_point(s)} for labels, s in series],
    }


def history_response(target: str, rows: Sequence[HistoryRow]) -> dict[str, Any]:
    """GET /api/v1/history?target=NAME."""
    return _versioned({"target": target, "points": [history_point(r) for r in rows]})


# GET /api/v1/history without a target answers a page of targets, the last points of each:
# a bounded body whatever the fleet and history sizes.
HISTORY_PAGE_TARGETS = 100
DEFAULT_POINTS_PER_TARGET = 60


class BadRequest(ValueError):
    """A query parameter out of range; `str()` is the error answered with HTTP 400."""


def history_page_request(query: Mapping[str, str], history_points: int) -> tuple[int, int]:
    """(page, points per target) from the query of GET /api/v1/history; raises BadRequest.
    More points than a history keeps means all of them."""

    def whole(name: str, default: int) -> int:
        text = query.get(name)
        if text is None:
            return default
        if not text.isdigit() or (name == "points" and int(text) < 1):
            lowest = 1 if name == "points" else 0
            raise BadRequest(f"{name} must be a whole number >= {lowest}")
        return int(text)

    points = whole("points", DEFAULT_POINTS_PER_TARGET)
    return whole("page", 0), min(points, history_points)


def pages(targets: int) -> int:
    """How many pages of HISTORY_PAGE_TARGETS targets hold `targets` (at least one)."""
    return max(1, -(-targets // HISTORY_PAGE_TARGETS))


def all_histories_response(
    histories: Mapping[str, Sequence[HistoryRow]], page: int, page_count: int, points: int
) -> dict[str, Any]:
    """GET /api/v1/history without a target: one page of targets, their last points each."""
    return _versioned(
        {
            "page": page,
            "pages": page_count,
            "points_per_target": points,
            "targets": {name: [history_point(r) for r in rows] for name, rows in histories.items()},
        }
    )


# ---------------------------------------------------------------- /api/v1/targets


def targets_response(
    targets: Iterable[Target], interval_seconds: float, window_seconds: float
) -> dict[str, Any]:
    """GET /api/v1/targets: what is monitored and how it is judged: every configurable
    field of each `Target` and its labels (never credentials, and query values, which may
    hold keys, redacted)."""
    return _versioned(
        {
            "targets": [
                {
                    **{key: getattr(t, key) for key in config_fields(Target)},
                    "url": redacted_url(t.url),
                    "labels": dict(t.labels),
                }
                for t in targets
            ],
            "interval_seconds": interval_seconds,
            "window_seconds": window_seconds,
        }
    )


def error_response(message: str) -> dict[str, Any]:
    """Any error answer, e.g. an unknown target (HTTP 404)."""
    return _versioned({"error": message})
