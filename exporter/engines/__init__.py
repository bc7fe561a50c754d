"""Engine adapters: each maps one engine's metric names onto SeriesSnapshots.

An adapter module defines NAME, MARKER (a name prefix that only this engine emits),
KEY_LABELS (the labels that tell its series apart), FAMILIES (what to parse),
LATENCY_FAMILIES (latency kind -> the histogram family it fills, empty when the engine
has none) and `to_series(by_name)` over the parsed samples grouped by name. Adding an
engine is adding a file and one line in ADAPTERS: the configuration's engine and
histogram choices, the reserved labels, `auto` detection and the documentation test
all read this registry.

The adapter rule: an adapter never truth-tests, compares, rounds or divides a scraped
value, it only moves values into place and adds, subtracts or multiplies them. A
payload's layout is then read once and replayed as a compiled plan at every later
scrape (`batchscope.exporter.ingest.compiled_reads`); an adapter that steers by value cannot be
planned and is read the general way, about twice as slowly. Those are listed in
UNPLANNED with the reason, and a test holds every other adapter planned on its fixtures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import fields, replace
from types import ModuleType

from batchscope.exporter.core.snapshot import SeriesSnapshot
from batchscope.exporter.engines import (
    inhouse,
    llamacpp,
    rayserve,
    sglang,
    tgi,
    triton,
    trtllm,
    vllm,
)
from batchscope.exporter.engines.grouping import group_by_name
from batchscope.exporter.ingest import promtext
from batchscope.exporter.ingest.compiled_reads import Plan, compile_plan
from batchscope.exporter.ingest.promtext import Layout, Sample

# Order matters where two adapters read the same series: the first one's fields win
# (TensorRT-LLM's waiting requests over Triton's pending count for the same model).
ADAPTERS: dict[str, ModuleType] = {
    m.NAME: m for m in (vllm, inhouse, sglang, tgi, trtllm, triton, rayserve, llamacpp)
}


# Adapters read the general way on purpose, and the use of a value that steers each.
UNPLANNED = {
    "inhouse": "a published max batch size of 0 reads as none (`cap or None`)",
    "trtllm": "a max batch size of 0 reads as none (`cap or None`)",
    "rayserve": "the cap is derived by dividing and rounding two histogram sums, "
    "when the utilisation sum is positive",
}


def engine_choices() -> tuple[str, ...]:
    """What a target's `engine` may be: `auto` or a registered adapter's NAME."""
    return ("auto", *ADAPTERS)


def latency_kinds() -> tuple[str, ...]:
    """Every latency histogram some adapter fills, by the name a target's `histogram` uses."""
    return tuple(
        dict.fromkeys(kind for adapter in ADAPTERS.values() for kind in adapter.LATENCY_FAMILIES)
    )


class UnrecognisedPayload(ValueError):
    """The payload holds none of the metrics the chosen engine(s) expose."""


class NoSamplesYet(UnrecognisedPayload):
    """The engine's metric names are in the payload (registered families) but no series:
    a server before its first request, or one whose metrics are not enabled."""


def detect(text: str) -> list[str]:
    """Engines whose metrics appear in the payload (a server may hold several)."""
    return [name for name, adapter in ADAPTERS.items() if adapter.MARKER in text]


def _registered(text: str, families: Sequence[str]) -> bool:
    """Whether the payload declares (# TYPE) any of these families."""
    return any(f"# TYPE {family}" in text for family in families)


def families_read(adapter: ModuleType, latency_kind: str | None) -> list[str]:
    """The families to parse for one adapter: all, or with `latency_kind` given, only that
    latency histogram and e2e (adapters count finished requests from it) of the latency
    ones. Parsing a histogram nobody reads is most of a payload's cost."""
    if latency_kind is None:
        return list(adapter.FAMILIES)
    wanted = {adapter.LATENCY_FAMILIES.get(kind) for kind in ("e2e", latency_kind)}
    unread = set(adapter.LATENCY_FAMILIES.values()) - wanted
    return [f for f in adapter.FAMILIES if f not in unread]


def read_series(
    text: str,
    engine: str = "auto",
    sample_limit: int | None = None,
    latency_kind: str | None = None,
) -> tuple[SeriesSnapshot, ...]:
    """Parse a /metrics payload into series with the named engine's adapter (or all found).

    Raises promtext.ParseError on a malformed line of a family it reads,
    promtext.SampleLimitExceeded past `sample_limit` samples of those families,
    (`latency_kind`: see `families_read`)
    NoSamplesYet when the engine's families are declared without a series, and
    UnrecognisedPayload when no engine's metrics are there.
    """
    names = detect(text) if engine == "auto" else [engine]
    if not names:
        raise UnrecognisedPayload(
            "no known engine's metrics in the payload (looked for "
            + ", ".join(f"{name} {a.MARKER}*" for name, a in ADAPTERS.items())
            + ")"
        )
    families = _families(tuple(names), latency_kind)
    known = promtext.read_values(text, families, sample_limit)
    if known is None:
        samples = promtext.parse(text, families, sample_limit)
    else:
        layout, values = known
        plan = _plan(tuple(names), layout)
        # A plan holds for finite values only (series_plan); an overflowing sum is no harm.
        if plan is not None and math.isfinite(sum(values)):
            return plan(values)
        samples = promtext.samples_of(layout, values)
    series = series_of(names, samples)
    if not series:
        missing = (
            f"no {'/'.join(names)} series in the payload (looked for "
            + ", ".join(", ".join(ADAPTERS[name].FAMILIES) for name in names)
            + ")"
        )
        if _registered(text, families):
            raise NoSamplesYet(f"{missing}, only their registered families")
        raise UnrecognisedPayload(missing)
    return series


@functools.cache
def _families(names: tuple[str, ...], latency_kind: str | None) -> tuple[str, ...]:
    """The families `read_series` parses for these engines: `families_read` of each, worked
    out once per engines and kind rather than at every scrape."""
    return tuple(f for name in names for f in families_read(ADAPTERS[name], latency_kind))


def series_of(names: Sequence[str], samples: list[Sample]) -> tuple[SeriesSnapshot, ...]:
    """The named adapters' series of the samples, joined."""
    by_name = group_by_name(samples)
    return join_series([s for name in names for s in ADAPTERS[name].to_series(by_name)])


def _plan(names: tuple[str, ...], layout: Layout) -> Plan | None:
    """`series_of` compiled for a layout (series_plan), from the second payload that has
    it on: a target whose labels churn, one layout a scrape, never pays for compiling.
    None also where the adapters cannot be traced or find no series (the general path
    then raises what it raises)."""
    key = (names, id(layout))
    entry = _PLANS.get(key)
    if entry is None or entry[0] is not layout:  # an entry holds its layout: ids stay unique
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = (layout, None, False)
        return None
    _, plan, compiled = entry
    if not compiled:
        plan = compiled_plan(names, layout)
        _PLANS[key] = (layout, plan, True)
    return plan


def compiled_plan(names: Sequence[str], layout: Layout) -> Plan | None:
    """`series_of(names, ...)` compiled for `layout`; None where an adapter steers by value."""
    return compile_plan(layout, lambda samples: _some_series(names, samples))


def clear_caches() -> None:
    """Forget the layouts, label sets and plans seen so far (benchmarks time a first scrape so)."""
    promtext.clear_caches()
    _PLANS.clear()


def _some_series(names: Sequence[str], samples: list[Sample]) -> tuple[SeriesSnapshot, ...]:
    series = series_of(names, samples)
    if not series:
        raise ValueError("no series: read_series raises its error on the general path")
    return series


# (adapter names, id(layout)) -> (layout, its plan, compiled yet). Bounded as promtext's
# layouts (a vLLM plan is about 9 KiB beside its layout's 15 KB).
_PLANS: dict[tuple[tuple[str, ...], int], tuple[Layout, Plan | None, bool]] = {}
_PLANS_MAX = 4_096


def join_series(series: list[SeriesSnapshot]) -> tuple[SeriesSnapshot, ...]:
    """One series per key: where two adapters read the same model (Triton's counters and
    its TensorRT-LLM backend's gauges), each field comes from the first that fills it."""
    joined: dict = {}
    for s in series:
        first = joined.get(s.key)
        if first is None:
            joined[s.key] = s
            continue
        missing = {
            f.name: getattr(s, f.name)
            for f in fields(s)
            if getattr(first, f.name) in (None, {}) and f.name != "engine"
        }
        joined[s.key] = replace(first, engine=f"{first.engine}+{s.engine}", **missing)
    return tuple(joined.values())
