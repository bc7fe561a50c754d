"""PromQL over the exporter's own `batchscope_*` series, as its alerts and boards read them:
a target's total, its worst series, its diagnosis, its held saturation and SLO burn."""

from __future__ import annotations

from collections.abc import Mapping

from batchscope.exporter.core.slo import WINDOW_PAIRS
from batchscope.grafana.promql import latest, seconds


def total_selector(config: Mapping, extra: str = "") -> str:
    """The matchers that pick a target total among the exporter's series (no series label)."""
    matchers = [f'{label}=""' for label in config["series_labels"]]
    return "{" + ", ".join(([extra] if extra else []) + matchers) + "}"


def diagnosed(state: str, config: Mapping) -> str:
    """A target any of whose series (or its total) was in this diagnosis state at the
    exporter's last reading of it (an unread target exports only its down state)."""
    selector = f'batchscope_diagnosis{{state="{state}"}}'
    return f"max by (target) ({latest(selector, config)}) == 1"


def worst(series: str, config: Mapping) -> str:
    """The worst reading of `series` over a target's series and total, each its newest
    sample within the staleness (`latest`)."""
    return f"max by (target) ({latest(series, config)})"


def exporter_saturated(config: Mapping) -> str:
    """A target the exporter last reported saturated, at its worst series' utilisation.

    Read within the staleness (`latest`). Through a run of failed scrapes of the exporter
    that outlasts it (a starved exporter answers /metrics after the scrape timeout), a
    series stands as its exporter last reported it for `exporter_gap_seconds`, where that
    exporter (job and instance) has had no successful scrape for the staleness: a healthy
    exporter beside it, or one Prometheus no longer scrapes (no `up`), holds nothing.
    Prometheus cannot tell from a range read whether a series was in the exporter's last
    successful scrape: one the exporter stopped reporting while it answered (a target it
    could not read, whose state has ended) stands again through a gap of that exporter
    that begins within `exporter_gap_seconds`, until the gap ends.
    """
    gap = config["exporter_gap_seconds"]
    # The value is the newest utilisation within the gap: the exporter leaves it out while
    # it cannot read the target and keeps the held state, which alone says saturated.
    utilization = latest("batchscope_budget_utilization_ratio", config, gap)

    def saturated(within: float | None, where: str = "") -> str:
        held = latest("batchscope_budget_saturated", config, within)
        return f"max by (target) (\n{utilization}\nand {held} == 1{where}\n)"

    # No successful scrape of this series' own exporter within the staleness.
    up = f"up{{{config['exporter_selector']}}}"
    blind = (
        f"\nand on (job, instance) "
        f"max_over_time({up}[{seconds(config['saturation_hold_seconds'])}]) == 0"
    )
    return f"{saturated(None)}\nor\n{saturated(gap, blind)}"


def exporter_burning(speed: str, config: Mapping) -> str:
    """A target any of whose series (or its total) the exporter found burning at `speed`
    (`batchscope_slo_burning`), at the highest long-window burn rate of that speed's pairs
    whose two windows are over the pair's factor (as the exporter's own alert reads it)."""

    def burn(window: str) -> str:
        return latest(f'batchscope_slo_burn_rate_ratio{{window="{window}"}}', config)

    pairs = [
        f"({burn(p.long)} > {p.factor:g}\n and ignoring (window) {burn(p.short)} > {p.factor:g})"
        for p in WINDOW_PAIRS
        if p.speed == speed
    ]
    burning = latest(f'batchscope_slo_burning{{speed="{speed}"}}', config)
    return (
        "max by (target) (\n(\n"
        + "\nor ".join(pairs)
        + f"\n)\nand ignoring (window, speed) {burning} == 1\n)"
    )
