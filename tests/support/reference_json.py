"""Shared by the tests: moved out of tests/exporter/test_api_json.py so no test imports another."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from exporter.core.evaluate import SeriesSignals
from exporter.serve import api_json as api


def reference_series_json(series: SeriesSignals) -> dict[str, Any]:
    """A series' JSON as the API first defined it: asdict, deep copies and all."""
    out = asdict(series)
    static = series.static_utilization
    out["static_utilization"] = static.to_dict() if static is not None else None
    out["advice"] = asdict(series.advice)
    out["batch_size_distribution"] = [
        {"size": size if math.isfinite(size) else "+Inf", "fraction": fraction}
        for size, fraction in series.batch_size_distribution
    ]
    return out


def reference_encode(body: dict[str, Any]) -> bytes:
    return json.dumps(api.finite(body), allow_nan=False).encode()
