"""Shared by the tests: moved out of tests/exporter/test_api_json.py so no test imports another."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from batchscope.exporter.core.advice import Advice
from batchscope.exporter.core.evaluate import SeriesSignals
from batchscope.exporter.serve import api_json as api


def reference_series_json(series: SeriesSignals) -> dict[str, Any]:
    """A series' JSON as the API first defined it: asdict, deep copies and all."""
    out = asdict(series)
    static = series.static_utilization
    out["static_utilization"] = static.to_dict() if static is not None else None
    out["advice"] = reference_advice_json(series.advice)
    out["batch_size_distribution"] = [
        {"size": size if math.isfinite(size) else "+Inf", "fraction": fraction}
        for size, fraction in series.batch_size_distribution
    ]
    attained, goodput, slo = series.slo_attainment, series.goodput_per_second, series.slo
    out["slo_attainment"] = (
        None
        if attained is None
        else {
            "estimate": attained.share.estimate,
            "lower": attained.share.lower,
            "upper": attained.share.upper,
            "exact": attained.edges.lower == attained.edges.upper,
            "requests": attained.requests,
            "lower_edge": attained.edges.lower,
            "upper_edge": attained.edges.upper,
            "reason": attained.reason,
        }
    )
    out["goodput_per_second"] = (
        None
        if goodput is None
        else {"estimate": goodput.estimate, "lower": goodput.lower, "upper": goodput.upper}
    )
    if slo is not None:
        # The API says which speeds burn, in the place of the pairs that make them burn.
        out["slo"] = {
            ("burning" if key == "burning_pairs" else key): value
            for key, value in out["slo"].items()
        }
        out["slo"]["burning"] = list(slo.burning)
        out["slo"]["burn_rates"] = [asdict(b) for b in slo.burn_rates]
    return out


def reference_advice_json(advice: Advice) -> dict[str, Any]:
    """An advice's JSON as the API first defined it (asdict), each item's sentence under
    `text` in the place of the `words` that write it."""
    out = asdict(advice)
    out["items"] = [
        {
            ("text" if key == "words" else key): (item.text if key == "words" else value)
            for key, value in fields.items()
        }
        for item, fields in zip(advice.items, out["items"], strict=True)
    ]
    return out


def reference_encode(body: dict[str, Any]) -> bytes:
    return json.dumps(api.finite(body), allow_nan=False).encode()
