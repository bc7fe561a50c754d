"""The normalized view of one scrape: what every engine adapter produces.

An engine adapter maps one engine's metric names onto `SeriesSnapshot`s; the signal
math only ever sees these, so adding an engine touches one adapter file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.histogram import Histogram

LabelKey = tuple[tuple[str, str], ...]

# Latency histograms an adapter may fill, by the name `--histogram` uses.
LATENCY_KINDS = ("e2e", "ttft", "queue", "inference")


@dataclass(frozen=True, slots=True)
class SeriesSnapshot:
    """One engine instance or model inside a target, at one scrape.

    Fields an engine does not expose stay None (or empty): a signal that needs them
    is then absent rather than guessed. Counters are cumulative, as scraped.
    """

    key: LabelKey
    engine: str
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    kv_usage: float | None = None
    cap: float | None = None
    budget_seconds: float | None = None
    requests_total: float | None = None
    generation_tokens_total: float | None = None
    items_total: float | None = None
    batches_total: float | None = None
    latency: Mapping[str, Histogram] = field(default_factory=dict)
    output_tokens: Histogram | None = None
    batch_size: Histogram | None = None
    # batch size -> (batches executed, execution seconds), cumulative
    execution_by_size: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.key)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of one target: up with its series, or down with the reason."""

    target: str
    t: float
    up: bool
    series: tuple[SeriesSnapshot, ...] = ()
    error: str | None = None
    scrape_seconds: float | None = None
