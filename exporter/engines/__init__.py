"""Engine adapters: each maps one engine's metric names onto SeriesSnapshots.

An adapter module defines NAME, MARKER (a name prefix that only this engine emits),
KEY_LABELS (the labels that tell its series apart), FAMILIES (what to parse),
LATENCY_FAMILIES (latency kind -> the histogram family it fills, empty when the engine
has none) and `to_series(by_name)` over the parsed samples grouped by name. Adding an
engine is adding a file and one line in ADAPTERS: the configuration's engine and
histogram choices, the reserved labels, `auto` detection and the documentation test
all read this registry.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

from batchscope.exporter.core.demand import QUEUED_KINDS
from batchscope.exporter.core.snapshot import SeriesSnapshot, join_series
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
from batchscope.exporter.ingest import promtext

# Order matters where two adapters read the same series: the first one's fields win
# (TensorRT-LLM's waiting requests over Triton's pending count for the same model).
ADAPTERS: dict[str, ModuleType] = {
    m.NAME: m for m in (vllm, inhouse, sglang, tgi, trtllm, triton, rayserve, llamacpp)
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
    latency histogram, its service part (the replica count's headroom reads it) and e2e
    (adapters count finished requests from it) of the latency ones. Parsing a histogram
    nobody reads is most of a payload's cost."""
    if latency_kind is None:
        return list(adapter.FAMILIES)
    kinds = ("e2e", latency_kind, QUEUED_KINDS.get(latency_kind))
    wanted = {adapter.LATENCY_FAMILIES.get(kind) for kind in kinds if kind is not None}
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
    by_name = promtext.by_name(promtext.parse(text, families, sample_limit))
    found = [s for name in names for s in ADAPTERS[name].to_series(by_name)]
    series = join_series(found)
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
