"""How a signal is declared: the `Signal` record the catalog (`exporter.core.catalog`)
lists every signal as, and the small functions its declarations share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchscope.exporter.core.families import Family
from batchscope.exporter.core.slo import SloStatus
from batchscope.exporter.core.snapshot import SeriesSnapshot

# A history column: its name, and the number it keeps of the signal's value.
Column = tuple[str, Callable[[Any], float | bool | None]]


@dataclass(frozen=True)
class Signal:
    """One field of a series' signals and where it shows.

    `compute`: its value from one evaluation's reading of the window (None: not known).
    `metric`: the gauge /metrics writes one sample of per series (None: not one gauge;
    `families` then names any labelled families a writer in exposition.py makes of it).
    `summary`: a field of the fleet's summary rows. `history`: the columns a history
    point keeps of it (`keep()` for its own value). `live`: the Live page's group of
    numbers it shows in. `published`: whether an engine publishes what it needs, where
    that can be absent (the API lists the signal under `not_exposed` then). `rule`: the
    series grafana/rules.py records with the same number for each vLLM engine series, on
    the fleet path (grafana/twins.py holds the two equal); where the twin needs labels or a
    tolerance, twins.py pairs them itself.
    """

    name: str
    title: str
    unit: str
    help: str
    compute: Callable[[Any], Any]
    default: Any = None
    metric: str | None = None
    families: tuple[Family, ...] = ()
    summary: bool = False
    history: tuple[Column, ...] = ()
    live: str | None = None
    published: Callable[[SeriesSnapshot, Any], bool] | None = None
    rule: str | None = None

    def gauge(self) -> Family:
        """The one-gauge family of `metric`."""
        return Family(self.metric or "", self.help)


def keep(name: str) -> tuple[Column, ...]:
    """A history column holding the signal's own value."""
    return ((name, lambda value: value),)


def estimate(value: Any) -> float | None:
    return None if value is None else value.estimate


def burning(speed: str) -> Callable[[SloStatus | None], bool]:
    return lambda slo: slo is not None and speed in slo.burning


def has_latency(last: SeriesSnapshot, settings: Any) -> bool:
    kind = settings.histogram
    return kind in last.latency or kind in last.latency_quantiles or kind in last.latency_means


def share(w: Any, part: str, whole: str) -> float | None:
    """One counter's increase over the window as a share of another's; None while the
    whole did not increase."""
    p, q = w.increases[part], w.increases[whole]
    return None if p is None or not q or q <= 0 else p / q


def counter(name: str) -> Callable[[SeriesSnapshot, Any], bool]:
    return lambda last, _settings: getattr(last, name) is not None
