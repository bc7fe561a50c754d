"""Grouping parsed samples by series and assembling histograms: what adapters share."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from exporter.histogram import Histogram
from exporter.promtext import Sample
from exporter.snapshot import LabelKey


def series_key(labels: dict[str, str], key_labels: Sequence[str]) -> LabelKey:
    """The identifying labels of a sample, in a fixed order, absent ones left out."""
    return tuple((k, labels[k]) for k in key_labels if k in labels)


def values_by_key(
    samples: Iterable[Sample], name: str, key_labels: Sequence[str]
) -> dict[LabelKey, float]:
    """Sample values of one metric name by series key; repeated keys (other labels) add up."""
    out: dict[LabelKey, float] = defaultdict(float)
    for s in samples:
        if s.name == name and not math.isnan(s.value):
            out[series_key(s.labels, key_labels)] += s.value
    return dict(out)


def histograms_by_key(
    samples: Iterable[Sample], family: str, key_labels: Sequence[str]
) -> dict[LabelKey, Histogram]:
    """Assemble `family`'s `_bucket`/`_sum`/`_count` samples into one Histogram per series."""
    bucket_name, sum_name, count_name = family + "_bucket", family + "_sum", family + "_count"
    buckets: dict[LabelKey, dict[float, float]] = defaultdict(dict)
    sums: dict[LabelKey, float] = {}
    counts: dict[LabelKey, float] = {}
    for s in samples:
        if s.name == bucket_name:
            le = s.labels.get("le")
            if le is None:
                continue
            key = series_key(s.labels, key_labels)
            bound = float(le)
            buckets[key][bound] = buckets[key].get(bound, 0.0) + s.value
        elif s.name == sum_name:
            key = series_key(s.labels, key_labels)
            sums[key] = sums.get(key, 0.0) + s.value
        elif s.name == count_name:
            key = series_key(s.labels, key_labels)
            counts[key] = counts.get(key, 0.0) + s.value
    return {
        key: Histogram.from_buckets(b, sums.get(key, 0.0), counts.get(key))
        for key, b in buckets.items()
        if b and math.isinf(max(b))
    }
