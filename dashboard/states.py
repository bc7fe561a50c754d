"""The diagnosis states as the dashboard shows them: words, colours, how bad each is.

One table, so a state reads and looks the same on every page and in every chart.
A state the exporter adds later still shows: in its own words, grey, mid-table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StateLook:
    words: str
    # Streamlit's named colour (badges, coloured text) and the same colour for plotly.
    badge: str
    hex: str
    # 0 is the worst: the fleet table lists targets in this order.
    severity: int


STATES: dict[str, StateLook] = {
    "down": StateLook("down", "red", "#7f1d1d", 0),
    "unreadable": StateLook("unreadable payload", "red", "#991b1b", 0),
    "budget_saturated": StateLook("budget saturated", "red", "#dc2626", 1),
    "stalled": StateLook("stalled", "violet", "#7c3aed", 2),
    "memory_bound": StateLook("memory-bound", "orange", "#ea580c", 3),
    "token_budget_bound": StateLook("token-budget-bound", "orange", "#c2410c", 3),
    "work_too_slow": StateLook("too slow for the budget", "orange", "#b45309", 3),
    "over_budget": StateLook("over budget", "orange", "#f97316", 3),
    "preempting": StateLook("preempting", "yellow", "#ca8a04", 4),
    "routing": StateLook("routed unevenly", "blue", "#4f46e5", 5),
    "batch_limited": StateLook("batch-limited", "blue", "#2563eb", 5),
    "queueing": StateLook("queueing", "blue", "#0891b2", 6),
    "underloaded": StateLook("underloaded", "gray", "#64748b", 8),
    "idle": StateLook("idle", "gray", "#94a3b8", 9),
    "no_data": StateLook("no data yet", "gray", "#cbd5e1", 9),
    "healthy": StateLook("healthy", "green", "#16a34a", 10),
}
UNKNOWN_SEVERITY = 7
UNKNOWN_HEX = "#6b7280"

# Chart colours that are not states.
CAP_HEX = "#111827"
THRESHOLD_HEX = "#dc2626"
SATURATED_SHADE = "rgba(220, 38, 38, 0.15)"


def look(state: str) -> StateLook:
    """How `state` is shown; an unknown state keeps its name, in grey."""
    known = STATES.get(state)
    if known is not None:
        return known
    return StateLook(state.replace("_", " "), "gray", UNKNOWN_HEX, UNKNOWN_SEVERITY)
