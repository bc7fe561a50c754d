"""Grouping parsed samples by series and assembling histograms: what adapters share."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from batchscope.exporter.core.histogram import Histogram
from batchscope.exporter.core.snapshot import LabelKey
from batchscope.exporter.ingest.promtext import Sample, SamplesByName


def series_key(labels: dict[str, str], key_labels: Sequence[str]) -> LabelKey:
    """The identifying labels of a sample, in a fixed order, absent ones left out."""
    return tuple([(k, labels[k]) for k in key_labels if k in labels])


def series_keys(samples: Sequence[Sample], key_labels: tuple[str, ...]) -> list[LabelKey]:
    """`series_key` of each sample, in order."""
    return [series_key(s.labels, key_labels) for s in samples]


def values_by_key(
    by_name: SamplesByName,
    name: str,
    key_labels: tuple[str, ...],
    where: Mapping[str, str] | None = None,
) -> dict[LabelKey, float]:
    """Sample values of one metric name by series key; repeated keys (other labels) add up.

    `where`: only samples carrying these label values count.
    """
    out: dict[LabelKey, float] = {}
    samples = by_name.get(name, ())
    for key, s in zip(series_keys(samples, key_labels), samples, strict=True):
        value = s.value
        if not math.isfinite(value):  # a NaN or infinite gauge is unknown, never a signal
            continue
        if where and any(s.labels.get(k) != v for k, v in where.items()):
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def histograms_by_key(
    by_name: SamplesByName, family: str, key_labels: tuple[str, ...], scale: float = 1.0
) -> dict[LabelKey, Histogram]:
    """Assemble `family`'s `_bucket`/`_sum`/`_count` samples into one Histogram per series.

    `scale` multiplies bounds and sums: 0.001 reads a histogram in milliseconds as seconds.
    """
    samples = by_name.get(family + "_bucket")
    if not samples:  # a family the payload lacks (most latency kinds): nothing to build
        return {}
    buckets: dict[LabelKey, dict[float, float]] = {}
    for key, s in zip(series_keys(samples, key_labels), samples, strict=True):
        le = s.labels.get("le")
        if le is None:
            continue
        try:
            bound = float(le) * scale
        except ValueError:
            raise ValueError(f"{family}_bucket: le={le!r} is not a number") from None
        series = buckets.get(key)
        if series is None:
            series = buckets[key] = {}
        series[bound] = series.get(bound, 0.0) + s.value
    sums: dict[LabelKey, float] = {}
    samples = by_name.get(family + "_sum", ())
    for key, s in zip(series_keys(samples, key_labels), samples, strict=True):
        sums[key] = sums.get(key, 0.0) + s.value * scale
    counts: dict[LabelKey, float] = {}
    samples = by_name.get(family + "_count", ())
    for key, s in zip(series_keys(samples, key_labels), samples, strict=True):
        counts[key] = counts.get(key, 0.0) + s.value
    # A series without its +Inf bucket is not a histogram; one with a NaN or infinite count
    # or sum is left out of this scrape, as if absent, so that no signal becomes NaN.
    return {
        key: Histogram.from_buckets(b, sums.get(key, 0.0), counts.get(key))
        for key, b in buckets.items()
        if b
        and math.isinf(max(b))
        and all(map(math.isfinite, (*b.values(), sums.get(key, 0.0), counts.get(key, 0.0))))
    }


def latency_by_key(
    by_name: SamplesByName,
    families: Mapping[str, str],
    key_labels: tuple[str, ...],
    scale: float = 1.0,
) -> dict[LabelKey, dict[str, Histogram]]:
    """Each series' latency histograms by kind (an adapter's LATENCY_FAMILIES: kind ->
    family), the kinds it has."""
    by_key: dict[LabelKey, dict[str, Histogram]] = defaultdict(dict)
    for kind, family in families.items():
        for key, histogram in histograms_by_key(by_name, family, key_labels, scale).items():
            by_key[key][kind] = histogram
    return dict(by_key)


def added_by_key(*values: Mapping[LabelKey, float]) -> dict[LabelKey, float]:
    """Several metrics' values by series key, added: a key is in the result when it is in
    any of them."""
    out: dict[LabelKey, float] = {}
    for by_key in values:
        for key, value in by_key.items():
            out[key] = out.get(key, 0.0) + value
    return out


def quantiles_by_key(
    by_name: SamplesByName, family: str, key_labels: tuple[str, ...], scale: float = 1.0
) -> dict[LabelKey, dict[float, float]]:
    """A summary's `{quantile: value}` per series (NaN quantiles of an idle window left out)."""
    out: dict[LabelKey, dict[float, float]] = defaultdict(dict)
    for s in by_name.get(family, ()):
        q = s.labels.get("quantile")
        if q is None or math.isnan(s.value):
            continue
        out[series_key(s.labels, key_labels)][float(q)] = s.value * scale
    return dict(out)
