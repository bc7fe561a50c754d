"""How numbers and target-supplied text are written on the dashboard's pages."""

from __future__ import annotations

import re

MISSING = "–"
# A signal whose raw series the target's engine does not publish (the JSON's not_exposed).
NOT_EXPOSED = "not exposed by this engine"

# Characters Streamlit's markdown gives a meaning to (emphasis, links, code, LaTeX,
# colour directives, HTML): a backslash before each shows it as itself.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$:=&])")


def percent(value: float | None, digits: int = 0) -> str:
    """A 0..1 share as a percentage: 0.9 -> "90%"; None -> "–"."""
    if value is None:
        return MISSING
    return f"{value * 100:.{digits}f}%"


def number(value: float | None, digits: int = 0) -> str:
    """A plain number with `digits` decimals (whole numbers without); None -> "–"."""
    if value is None:
        return MISSING
    if float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def seconds(value: float | None) -> str:
    """A duration in the unit that reads best: 0.045 -> "45 ms", 2.5 -> "2.50 s"."""
    if value is None:
        return MISSING
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


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


def shown(series: dict, field: str, text: str) -> str:
    """The signal's text, or NOT_EXPOSED where the engine does not publish it."""
    return text if exposed(series, field) else NOT_EXPOSED


def plain_markdown(text: str) -> str:
    """Text from a target (names, labels, errors) made inert for a markdown element."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("\n", " ")
