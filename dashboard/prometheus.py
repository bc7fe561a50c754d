"""History from a Prometheus server that scrapes the exporter, for spans longer than
the exporter keeps: one range query per target, turned into the exporter's history points.
"""

from __future__ import annotations

import re

from batchscope.dashboard.client import SourceError, api_url, get_json
from batchscope.dashboard.frames import SERIES_NAME_LABELS
from batchscope.exporter.core.catalog import GAUGES

# Exporter metric name -> history field, for the gauges whose value is the field.
FIELDS = {family.name: attribute for family, attribute in GAUGES} | {
    "batchscope_target_up": "up",
    "batchscope_latency_seconds": "latency_seconds",
    "batchscope_budget_saturated": "budget_saturated",
}
STATIC = "batchscope_static_utilization_ratio"
ATTAINMENT = "batchscope_slo_attainment_ratio"
BURNING = "batchscope_slo_burning"
DIAGNOSIS = "batchscope_diagnosis"
BOOLEAN_FIELDS = ("up", "budget_saturated")
# Gauges with a `bound` label whose estimate is the history field.
ESTIMATES = {STATIC: "static_utilization", ATTAINMENT: "slo_attainment"}


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def history_query(target: str) -> str:
    """The PromQL selector for every history field of one target."""
    names = "|".join(re.escape(n) for n in (*FIELDS, *ESTIMATES, BURNING, DIAGNOSIS))
    return f'{{__name__=~"{names}",target="{_quote(target)}"}}'


def _is_total(labels: dict[str, str]) -> bool:
    return not any(k in labels for k in SERIES_NAME_LABELS)


def points_from_matrix(result: list[dict]) -> list[dict]:
    """A query_range matrix of the exporter's metrics as history points (target totals)."""
    points: dict[float, dict] = {}
    for series in result:
        labels = series.get("metric", {})
        name = labels.get("__name__", "")
        if not _is_total(labels):
            continue
        if name in ESTIMATES and labels.get("bound") != "estimate":
            continue
        for t, text in series.get("values", []):
            point = points.setdefault(float(t), {"t": float(t)})
            value = float(text)
            if name == DIAGNOSIS:
                if value == 1.0:
                    point["diagnosis"] = labels.get("state")
            elif name == BURNING:
                point[f"slo_burning_{labels.get('speed')}"] = value == 1.0
            elif name in ESTIMATES:
                point[ESTIMATES[name]] = value
            elif name in FIELDS:
                field = FIELDS[name]
                point[field] = value == 1.0 if field in BOOLEAN_FIELDS else value
    return [points[t] for t in sorted(points)]


def history(base: str, target: str, start: float, end: float, step: float) -> list[dict]:
    """One target's history from Prometheus between `start` and `end` (unix seconds)."""
    url = api_url(
        base,
        "/api/v1/query_range",
        query=history_query(target),
        start=f"{start:.3f}",
        end=f"{end:.3f}",
        step=f"{step:g}",
    )
    doc = get_json(url, flag="--prometheus")
    if doc.get("status") != "success":
        raise SourceError(f"Prometheus at {base} refused the query: {doc.get('error', doc)}")
    return points_from_matrix(doc.get("data", {}).get("result", []))


def targets(base: str) -> list[str]:
    """The targets Prometheus has exporter data for."""
    doc = get_json(
        api_url(base, "/api/v1/label/target/values", **{"match[]": "batchscope_target_up"}),
        flag="--prometheus",
    )
    if doc.get("status") != "success":
        raise SourceError(f"Prometheus at {base} refused the query: {doc.get('error', doc)}")
    return sorted(doc.get("data", []))
