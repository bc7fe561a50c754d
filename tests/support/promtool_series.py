"""Scrapes as `promtool test rules` takes them: each payload's samples as input series."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families


def series_text(name: str, labels: Mapping[str, str]) -> str:
    """A series as promtool writes it: the name, then its labels sorted."""
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def input_series(scrapes: list[tuple[float, str]], scraped_as: Mapping[str, str]) -> list[dict]:
    """Each sample of the payloads, one a scrape, as Prometheus stores the scrapes
    (`scraped_as`: the job, instance and target labels added; `up` beside them), one value
    a scrape, `stale` where a series left the payload."""
    values: dict[str, list[str]] = {series_text("up", scraped_as): ["1"] * len(scrapes)}
    for index, (_, text) in enumerate(scrapes):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = series_text(sample.name, {**sample.labels, **scraped_as})
                values.setdefault(key, ["_"] * index).append(repr(float(sample.value)))
        for column in values.values():
            if len(column) == index:
                column.append("stale" if index and column[-1] not in ("_", "stale") else "_")
    return [{"series": key, "values": " ".join(column)} for key, column in values.items()]
