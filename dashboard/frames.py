"""The exporter's JSON turned into pandas frames the pages draw: pure, no I/O."""

from __future__ import annotations

import math

import pandas as pd

from dashboard.states import look
from exporter.engines import ADAPTERS

TOTAL_CHOICE = "all models (target total)"
# Series labels that name a model, a batcher or a deployment: every engine adapter's, in
# the registry's order.
SERIES_NAME_LABELS = tuple(dict.fromkeys(n for a in ADAPTERS.values() for n in a.KEY_LABELS))

FLEET_COLUMNS = (
    "target",
    "up",
    "state",
    "running",
    "cap",
    "running_vs_cap",
    "waiting",
    "preemptions_per_second",
    "kv_cache_usage",
    "budget_utilization",
    "saturated_seconds",
    "reason",
)
HISTORY_COLUMNS = (
    "t",
    "up",
    "running",
    "waiting",
    "cap",
    "running_vs_cap",
    "mean_batch_size",
    "preemptions_per_second",
    "kv_cache_usage",
    "requests_per_second",
    "generation_tokens_per_second",
    "latency_seconds",
    "budget_utilization",
    "budget_saturated",
    "throughput_gain",
    "static_utilization",
    "slo_attainment",
    "slo_burning_fast",
    "slo_burning_slow",
    "diagnosis",
)


def _sort_key_missing_last(value: float | None) -> float:
    return -value if value is not None and math.isfinite(value) else math.inf


def _worst_budget(target: dict) -> dict:
    """The total, or when the total has no budget utilisation (its series answer to
    different budgets), the series closest to its budget: what the alerts fire on."""
    total = target.get("total") or {}
    if total.get("budget_utilization") is not None:
        return total
    judged = [s for s in target.get("series") or [] if s.get("budget_utilization") is not None]
    return max(judged, key=lambda s: s["budget_utilization"], default=total)


def fleet_frame(signals_doc: dict) -> pd.DataFrame:
    """One row per target, worst first: by state severity, then the higher budget
    utilisation, then the fuller KV cache, then the name."""
    rows = []
    for target in signals_doc.get("targets", []):
        total = target.get("total") or {}
        diagnosis = total.get("diagnosis") or {}
        state = diagnosis.get("state", "down" if not target.get("up") else "")
        budget = _worst_budget(target)
        utilization = budget.get("budget_utilization")
        saturated = budget.get("budget_saturated_seconds") or 0.0
        rows.append(
            {
                "target": target.get("target", ""),
                "up": bool(target.get("up")),
                "state": look(state).words,
                "running": total.get("running"),
                "cap": total.get("cap"),
                "running_vs_cap": total.get("running_vs_cap"),
                "waiting": total.get("waiting"),
                "preemptions_per_second": total.get("preemptions_per_second"),
                "kv_cache_usage": total.get("kv_cache_usage"),
                "budget_utilization": utilization,
                "saturated_seconds": saturated,
                "reason": diagnosis.get("reason") or target.get("error") or "",
                "_order": (
                    look(state).severity,
                    _sort_key_missing_last(utilization),
                    _sort_key_missing_last(total.get("kv_cache_usage")),
                    target.get("target", ""),
                ),
            }
        )
    rows.sort(key=lambda row: row["_order"])
    frame = pd.DataFrame(rows, columns=[*FLEET_COLUMNS, "_order"])
    return frame.drop(columns="_order")


def find_target(signals_doc: dict, name: str) -> dict | None:
    return next((t for t in signals_doc.get("targets", []) if t.get("target") == name), None)


def series_name(labels: dict[str, str]) -> str:
    """A series as people call it: its model (or batcher) and engine labels."""
    named = [f"{k}={labels[k]}" for k in SERIES_NAME_LABELS if k in labels]
    rest = [f"{k}={v}" for k, v in sorted(labels.items()) if k not in SERIES_NAME_LABELS]
    return ", ".join(named + rest) or "unlabelled series"


def series_choices(target_doc: dict) -> dict[str, dict]:
    """The target total and each of its series, by the name the model selector shows."""
    choices = {TOTAL_CHOICE: target_doc.get("total") or {}}
    for series in target_doc.get("series", []):
        choices[series_name(series.get("labels") or {})] = series
    return choices


def history_frame(points: list[dict]) -> pd.DataFrame:
    """History points as a frame with a `time` column (UTC); fields added later are kept."""
    keys = dict.fromkeys(HISTORY_COLUMNS)
    for point in points[:1]:
        keys.update(dict.fromkeys(point))
    keys.pop("series", None)  # per-series points: series_points picks one
    # Column by column: five times faster than pd.DataFrame(points) on 720 points.
    frame = pd.DataFrame({k: [p.get(k) for p in points] for k in keys})
    for column in HISTORY_COLUMNS:
        if frame[column].isna().all():
            frame[column] = frame[column].astype("float64")
    # Naive UTC: plotly takes datetime64 arrays ten times faster than tz-aware Series.
    frame["time"] = pd.to_datetime(frame["t"].astype("float64"), unit="s")
    return frame


def series_points(points: list[dict], labels: dict[str, str]) -> list[dict]:
    """One series' history out of a target's points (each point's `series` entries, kept
    by the exporter for targets with several series); empty when none match."""
    found = []
    for point in points:
        for series in point.get("series") or []:
            if series.get("labels") == labels:
                found.append({**series, "t": point["t"], "up": point.get("up")})
                break
    return found


def target_points(history_doc: dict, name: str) -> list[dict]:
    """One target's points from the every-target history (a list, or {"points": [...]})."""
    points = (history_doc.get("targets") or {}).get(name) or []
    return points.get("points", []) if isinstance(points, dict) else points


def fleet_history_frame(history_doc: dict) -> pd.DataFrame:
    """Every target's history as one long frame with a `target` column."""
    frames = []
    for name in history_doc.get("targets") or {}:
        frame = history_frame(target_points(history_doc, name))
        frame["target"] = name
        frames.append(frame)
    if not frames:
        return history_frame([]).assign(target=pd.Series(dtype="object"))
    return pd.concat(frames, ignore_index=True)


def last_seconds(frame: pd.DataFrame, seconds: float | None, now: float) -> pd.DataFrame:
    """The rows from the last `seconds` before `now` (all rows when seconds is None)."""
    if seconds is None or frame.empty:
        return frame
    return frame[frame["t"] >= now - seconds]


def batch_size_frame(distribution: list[dict]) -> pd.DataFrame:
    """The batch size distribution as (size label, fraction); "+Inf" stays a label."""
    return pd.DataFrame(
        [
            {
                "size": str(d["size"]) if d["size"] == "+Inf" else f"{d['size']:g}",
                "fraction": d["fraction"],
            }
            for d in distribution
        ],
        columns=["size", "fraction"],
    )
