"""How a share, a duration, a rate and a count read in the words a person sees: the
diagnosis' reasons, the replica count's and the dashboard's pages write them the same way.

Pure: numbers in, text out. A share is a whole percentage, with one decimal under 10%
(where a whole number would hide the difference between 0.4% and 4%); a duration is in
the unit that reads best, never to the hundredth of a second past ten seconds.
"""

from __future__ import annotations


def percent_text(ratio: float) -> str:
    """A 0..1 share as a percentage: 2.3298 -> "233%", 0.095 -> "9.5%", 0 -> "0%"."""
    percent = ratio * 100
    if percent != 0 and abs(percent) < 9.95:
        return f"{percent:.1f}%"
    return f"{percent:.0f}%"


def seconds_text(seconds: float) -> str:
    """A duration: 0.045 -> "45 ms", 4.975 -> "4.97 s", 2.0 -> "2 s", 57.01 -> "57 s",
    150 -> "2.5 min", 2700 -> "45 min", 9000 -> "2.5 h", 2592000 -> "30 d"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.3g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 10:
        return f"{minutes:.1f} min"
    if minutes < 120:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        return f"{hours:.1f} h"
    days = hours / 24
    return f"{days:.0f} d" if days >= 10 else f"{days:.1f} d"


def rate_text(x: float | None) -> str:
    """A rate in a sentence: three significant digits, whole with thousands' commas from
    100 on (None: 0)."""
    x = x or 0.0
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def count_text(x: float | None) -> str:
    """A count in a sentence: whole where it is, else one decimal (None: 0)."""
    x = x or 0.0
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"
