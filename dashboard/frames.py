"""The exporter's JSON turned into pandas frames the pages draw: pure, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from batchscope.dashboard.formatting import number
from batchscope.dashboard.states import look
from batchscope.exporter.core import catalog
from batchscope.exporter.engines import ADAPTERS

TOTAL_CHOICE = "all models (target total)"
# Series labels that name a model, a batcher or a deployment: every engine adapter's, in
# the registry's order.
SERIES_NAME_LABELS = tuple(dict.fromkeys(n for a in ADAPTERS.values() for n in a.KEY_LABELS))

# The fleet table's data: its numbers as the JSON gives them, and the columns shown.
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
    "batch",
    "budget_percent",
    "kv_percent",
)
# A history point's columns: the catalog's, between its time and up flag and its state.
HISTORY_COLUMNS = ("t", "up", *(column for column, _, _ in catalog.HISTORY_COLUMNS), "diagnosis")


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


def _state_of(series: dict, up: bool) -> str:
    return (series.get("diagnosis") or {}).get("state", "down" if not up else "")


def _row_diagnosis(target: dict, budget: dict) -> tuple[str, str]:
    """The state and reason a target's row shows: its total's, unless the series whose
    budget the row shows is in a worse state (a batcher over its own budget beside an
    LLM that is fine): then that series', named, so the row tells one story."""
    up = bool(target.get("up"))
    total = target.get("total") or {}
    state = _state_of(total, up)
    reason = (total.get("diagnosis") or {}).get("reason") or target.get("error") or ""
    if budget is not total and look(_state_of(budget, up)).severity < look(state).severity:
        name = series_name(budget.get("labels") or {})
        return _state_of(budget, up), f"{name}: {(budget.get('diagnosis') or {}).get('reason')}"
    return state, reason


def _share_percent(value: float | None) -> float | None:
    return None if value is None else value * 100


def fleet_row(target: dict) -> dict:
    """One target's row of the fleet table, from its `target` or `target_summary` object.

    Running is the batch the diagnosis judged (the peak of the last scrapes), so the
    row and its state agree; the budget is the total's, or its worst series'."""
    total = target.get("total") or {}
    budget = _worst_budget(target)
    state, reason = _row_diagnosis(target, budget)
    utilization = budget.get("budget_utilization")
    running = total.get("running_peak", total.get("running"))
    cap = total.get("cap")
    return {
        "target": target.get("target", ""),
        "up": bool(target.get("up")),
        "state": look(state).words,
        "running": running,
        "cap": cap,
        "running_vs_cap": running / cap if running is not None and cap else None,
        "waiting": total.get("waiting"),
        "preemptions_per_second": total.get("preemptions_per_second"),
        "kv_cache_usage": total.get("kv_cache_usage"),
        "budget_utilization": utilization,
        "saturated_seconds": budget.get("budget_saturated_seconds") or 0.0,
        "reason": reason,
        "batch": f"{number(running, 1)} / {number(cap)}" if running is not None else None,
        "budget_percent": _share_percent(utilization),
        "kv_percent": _share_percent(total.get("kv_cache_usage")),
        "_severity": look(state).severity,
    }


# How the fleet table can be ordered: worst first (state severity, then the higher budget
# utilisation, then the fuller KV cache, then the name), or by one column.
SORTS = {
    "worst first": None,
    "budget used": "budget_utilization",
    "waiting": "waiting",
    "KV cache": "kv_cache_usage",
    "name": "target",
}


def _order(row: dict, sort: str) -> tuple:
    column = SORTS[sort]
    if column == "target":
        return (row["target"],)
    if column is not None:
        return (_sort_key_missing_last(row[column]), row["target"])
    return (
        row["_severity"],
        _sort_key_missing_last(row["budget_utilization"]),
        _sort_key_missing_last(row["kv_cache_usage"]),
        row["target"],
    )


def fleet_rows(signals_doc: dict) -> list[dict]:
    """One `fleet_row` per target, in the document's order."""
    return [fleet_row(target) for target in signals_doc.get("targets", [])]


def with_row(rows: list[dict], target: dict) -> list[dict]:
    """The rows with `target`'s replaced by one read from it (its full signals)."""
    row = fleet_row(target)
    return [row if r["target"] == row["target"] else r for r in rows]


def fleet_table(rows: list[dict], sort: str = "worst first") -> pd.DataFrame:
    """The fleet table of these rows, worst first unless `sort` names another order."""
    ordered = sorted(rows, key=lambda row: _order(row, sort))
    return pd.DataFrame(ordered, columns=[*FLEET_COLUMNS, "_severity"]).drop(columns="_severity")


def fleet_frame(signals_doc: dict, sort: str = "worst first") -> pd.DataFrame:
    """One row per target (`fleet_row`), worst first unless `sort` names another order."""
    return fleet_table(fleet_rows(signals_doc), sort)


def _matches(row: dict, needle: str) -> bool:
    return needle in row["target"].lower() or needle in row["state"].lower()


def first_matching(rows: list[dict], text: str, sort: str, preferred: str | None) -> str | None:
    """The target among `rows` whose name or state contains `text` (any case), as the
    fleet table filters: `preferred` when it matches, else the first in `sort`'s order."""
    needle = text.strip().lower()
    matching = [r for r in rows if _matches(r, needle)] if needle else rows
    if any(r["target"] == preferred for r in matching):
        return preferred
    return min(matching, key=lambda row: _order(row, sort))["target"] if matching else None


@dataclass(frozen=True, slots=True)
class FleetPage:
    """What the fleet table shows: one page of the rows that match the filter, in order,
    and how many match and how many there are in all."""

    rows: pd.DataFrame
    matching: pd.DataFrame
    total: int
    page: int
    pages: int

    def at_page(self, page: int) -> FleetPage:
        """The same matching rows, page `page` of them (0-based, clamped to the last)."""
        page = min(max(page, 0), self.pages - 1)
        rows = self.matching.iloc[page * FLEET_PAGE_ROWS : (page + 1) * FLEET_PAGE_ROWS]
        return FleetPage(rows, self.matching, self.total, page, self.pages)

    @property
    def first(self) -> int:
        """The 1-based position of the page's first row among those that match."""
        return self.page * FLEET_PAGE_ROWS + 1 if len(self.rows) else 0

    def rest_by_state(self) -> dict[str, int]:
        """The matching targets not on this page, counted by state, most first."""
        shown = set(self.rows["target"])
        rest = self.matching[~self.matching["target"].isin(shown)]
        return rest["state"].value_counts().to_dict()


FLEET_PAGE_ROWS = 20


def fleet_page(frame: pd.DataFrame, text: str = "", page: int = 0) -> FleetPage:
    """The rows of `frame` whose target name or state contains `text` (any case), and
    page `page` of them (0-based, clamped to the last)."""
    matching = frame
    if text.strip():
        needle = text.strip().lower()
        hit = frame["target"].str.lower().str.contains(needle, regex=False) | frame[
            "state"
        ].str.lower().str.contains(needle, regex=False)
        matching = frame[hit]
    pages = max(1, -(-len(matching) // FLEET_PAGE_ROWS))
    return FleetPage(matching.iloc[:0], matching, len(frame), 0, pages).at_page(page)


def with_target(signals_doc: dict, target: dict) -> dict:
    """The fleet's document with one target's entry replaced by `target` (its full signals,
    read later than the fleet's summary): its row then shows the evaluation its panel
    shows."""
    name = target.get("target")
    targets = [target if t.get("target") == name else t for t in signals_doc.get("targets", [])]
    return {**signals_doc, "targets": targets}


def series_name(labels: dict[str, str]) -> str:
    """A series as people call it: its model's (or batcher's, or deployment's) name."""
    named = [labels[k] for k in SERIES_NAME_LABELS if k in labels]
    if named:
        return named[0]
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "unlabelled series"


def series_choices(target_doc: dict) -> dict[str, dict]:
    """The target total and each of its series, by the name the model selector shows:
    the model's name, with its other labels where two series share it."""
    series = target_doc.get("series", [])
    names = [series_name(s.get("labels") or {}) for s in series]
    choices = {TOTAL_CHOICE: target_doc.get("total") or {}}
    for name, one in zip(names, series, strict=True):
        labels = one.get("labels") or {}
        if names.count(name) > 1:
            rest = [f"{k}={v}" for k, v in labels.items() if v != name]
            name = f"{name} ({', '.join(rest)})"
        choices[name] = one
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
