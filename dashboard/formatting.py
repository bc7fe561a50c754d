"""How numbers and target-supplied text are written on the dashboard's pages.

Shares and durations read as the diagnosis writes them (`batchscope.exporter.core.units`): whole
percentages (one decimal under 10%), durations in ms, s, min or h. A missing value is a
dash, and the page says why beside it (`missing_reason`).
"""

from __future__ import annotations

import re

from batchscope.exporter.core.units import percent_text, seconds_text

MISSING = "–"
# A signal whose raw series the target's engine does not publish (the JSON's not_exposed).
NOT_EXPOSED = "not exposed by this engine"

# Characters Streamlit's markdown gives a meaning to (emphasis, links, code, LaTeX,
# colour directives, HTML): a backslash before each shows it as itself.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$:=&])")

# Why a signal that the engine does publish has no value, by the JSON field.
_UNKNOWN_BECAUSE = {
    "cap": "no cap is configured for this target",
    "latency_seconds": "no request finished in the window",
    "budget_utilization": "no request finished in the window, or no budget is configured",
    "preemptions_per_second": "the window holds a single scrape",
    "throughput_gain": "the batcher timed no batch of size 1 or none in the window",
    "static_utilization": "no request finished in the window, or no cap is configured",
    "mean_batch_size": "no batch was fired in the window",
    "slo_attainment": "no request finished in the window, or no budget is configured",
    "goodput_per_second": "no request finished in the window, or no budget is configured",
}


def percent(value: float | None, digits: int | None = None) -> str:
    """A 0..1 share as a percentage: 0.9 -> "90%", 0.043 -> "4.3%"; `digits` fixes the
    decimals; None -> "–"."""
    if value is None:
        return MISSING
    if digits is None:
        return percent_text(value)
    return f"{value * 100:.{digits}f}%"


def number(value: float | None, digits: int = 0) -> str:
    """A plain number with `digits` decimals (whole numbers without); None -> "–"."""
    if value is None:
        return MISSING
    if float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def count(value: float | None) -> str:
    """A count short enough for a tile: 421 -> "421", 15500 -> "15.5k"; None -> "–"."""
    if value is None:
        return MISSING
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    return number(value, 1)


def seconds(value: float | None) -> str:
    """A duration in the unit that reads best: 0.045 -> "45 ms", 57.01 -> "57 s"."""
    if value is None:
        return MISSING
    return seconds_text(value)


def age(value: float) -> str:
    """How long ago something happened, in words: 42 -> "42 s ago"."""
    if value < 1:
        return "just now"
    if value < 120:
        return f"{value:.0f} s ago"
    if value < 7200:
        return f"{value / 60:.0f} min ago"
    return f"{value / 3600:.1f} h ago"


def exposed(series: dict, field: str) -> bool:
    """Whether the series' engine publishes what the signal `field` is computed from."""
    return field not in (series.get("not_exposed") or ())


def missing_reason(series: dict, field: str) -> str | None:
    """Why the series' `field` has no value, in words; None when it has one."""
    if not exposed(series, field):
        return f"{NOT_EXPOSED} ({series.get('engine') or 'unknown engine'})"
    if series.get(field) is not None:
        return None
    return _UNKNOWN_BECAUSE.get(field, "not known at this evaluation")


def tile(series: dict, field: str, text: str, frame: str) -> tuple[str, str]:
    """A tile's value and its tooltip: what it reads over which frame, or why it is a
    dash."""
    why = missing_reason(series, field)
    if why is not None:
        return MISSING, f"{frame}. {MISSING}: {why}."
    return text, f"{frame}."


def plain_markdown(text: str) -> str:
    """Text from a target (names, labels, errors) made inert for a markdown element."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("\n", " ")
