"""Evaluating payloads the short way, for tests: a list of snapshots straight to signals,
and a payload straight to a snapshot, without a window kept across scrapes or a scrape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from batchscope.exporter.config.settings import Target
from batchscope.exporter.core.evaluate import TargetIdentity, TargetSignals, evaluate_window
from batchscope.exporter.core.signals import SaturationState, SignalSettings
from batchscope.exporter.core.snapshot import LabelKey, Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import read_payload


def evaluate_target(
    name: str,
    url: str,
    snapshots: Sequence[Snapshot],
    settings: SignalSettings,
    saturation: Mapping[LabelKey, SaturationState],
    now: float,
    extra_labels: Mapping[str, str] | None = None,
) -> tuple[TargetSignals, dict[LabelKey, SaturationState]]:
    """Signals for one target from a list of snapshots, all in the window (`evaluate_window`
    on a window of them); returns them and the next saturation states."""
    window = Window.of(snapshots, settings)
    return evaluate_window(
        TargetIdentity(name, url, dict(extra_labels or {})), window, saturation, now
    )


def snapshot_from_payload(
    target: Target,
    t: float,
    text: str | None,
    error: str | None,
    seconds: float,
    sample_limit: int | None = None,
) -> Snapshot:
    """Turn a scrape's text (or its error) into a snapshot, as the exporter reads it."""
    return read_payload(target, t, ScrapeResult(text, error, seconds), sample_limit)[0]
