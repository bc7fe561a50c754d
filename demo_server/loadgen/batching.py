"""A step's `batching` object: the server's batching signals over the step. Pure: the
step's readings in, a JSON-ready dict out.

A `BatchingReading` is one exporter evaluation of the server, as this object reads it.
It comes from either side of the exporter: a `SeriesSignals` (`reading_of_series`, the
--watch path, which runs the exporter's evaluator in-process) or the JSON of
/api/v1/signals?target=NAME (`reading_of_api_target`, the --exporter path, which polls a
running exporter). Both give the same reading for the same evaluation, and both go
through `step_batching`.

Gauges (running, running vs cap, waiting, KV usage) are the mean and max over the
readings; rates (preemptions/s, tokens per step) are the last reading's, over its
`window_seconds` (with --watch the step's own window; with --exporter the exporter's,
which may reach back into earlier steps); the binding limit and the diagnosis are the
time share of each over the readings, the binding limit being the one with the largest
share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals

# A binding limit of None (the gauges read no request) in the shares.
NO_LIMIT = "none"
# The numbers a reading holds: `SeriesSignals` fields, under the same names in the API's
# series JSON (exporter/serve/api_json.py: series_json).
READING_NUMBERS = (
    "running",
    "cap",
    "running_vs_cap",
    "waiting",
    "kv_cache_usage",
    "preemptions_per_second",
    "tokens_per_step",
    "token_budget",
    "window_seconds",
)


@dataclass(frozen=True, slots=True)
class BatchingReading:
    """One evaluation of the server: the signals the `batching` object summarises.
    Numbers are finite or None (not known)."""

    running: float | None
    cap: float | None
    running_vs_cap: float | None
    waiting: float | None
    kv_cache_usage: float | None
    preemptions_per_second: float | None
    tokens_per_step: float | None
    token_budget: float | None
    # The span the rates were measured over, the evaluator's window.
    window_seconds: float | None
    binding_limit: str | None
    diagnosis: str
    engine: str


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def reading_of_series(series: SeriesSignals) -> BatchingReading:
    """The reading of one evaluated series (a target's total)."""
    numbers = {name: _finite(getattr(series, name)) for name in READING_NUMBERS}
    return BatchingReading(
        **numbers,
        binding_limit=series.limits.binding,
        diagnosis=series.diagnosis.state,
        engine=series.engine,
    )


def readings_of_evaluations(evaluations: Sequence[TargetSignals]) -> list[BatchingReading | None]:
    """Each evaluation's total as a reading; None for one that did not read the server
    (`TargetSignals.read`)."""
    return [reading_of_series(e.total) if e.read else None for e in evaluations]


class NotSignals(ValueError):
    """A body that is not the shape of /api/v1/signals; `str()` names what is wrong."""


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NotSignals(f"total.{name} is {value!r}, not a number")
    return _finite(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise NotSignals(f"{where} is {value!r}, not a string")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise NotSignals(f"{where} is missing or not an object")
    return value


def reading_of_api_total(total: Mapping[str, Any]) -> BatchingReading:
    """The reading of a target's `total` in the API's JSON (`series_json`); raises
    NotSignals when it is not that shape."""
    total = _object(total, "total")
    limits = _object(total.get("limits"), "total.limits")
    binding = limits.get("binding")
    diagnosis = _object(total.get("diagnosis"), "total.diagnosis")
    return BatchingReading(
        **{name: _number(total, name) for name in READING_NUMBERS},
        binding_limit=None if binding is None else _text(binding, "total.limits.binding"),
        diagnosis=_text(diagnosis.get("state"), "total.diagnosis.state"),
        engine=_text(total.get("engine"), "total.engine"),
    )


def reading_of_api_target(target: Mapping[str, Any]) -> BatchingReading | None:
    """The reading of one target in the API's JSON (`target_json`); None when that
    evaluation did not read the server (down, or its payload unreadable: the exporter's
    `TargetSignals.read`). Raises NotSignals when it is not that shape."""
    target = _object(target, "target")
    if target.get("up") is not True or target.get("error") is not None:
        return None
    return reading_of_api_total(target.get("total"))


def _mean_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    read = [v for v in values if v is not None]
    if not read:
        return None, None
    return sum(read) / len(read), max(read)


def _shares(names: Sequence[str]) -> dict[str, float]:
    counts = Counter(names)
    return {name: n / len(names) for name, n in counts.most_common()}


def step_batching(readings: Sequence[BatchingReading | None], source: str) -> dict[str, Any] | None:
    """The step's batching signals from its readings, oldest first (None: an evaluation
    or a poll that read nothing); None when no reading read the server. `source` says
    which path read them (the flag: "--watch" or "--exporter")."""
    read = [r for r in readings if r is not None]
    if not read:
        return None
    last = read[-1]
    running_mean, running_max = _mean_max([r.running for r in read])
    vs_cap_mean, vs_cap_max = _mean_max([r.running_vs_cap for r in read])
    waiting_mean, waiting_max = _mean_max([r.waiting for r in read])
    kv_mean, kv_max = _mean_max([r.kv_cache_usage for r in read])
    bindings = _shares([r.binding_limit or NO_LIMIT for r in read])
    named = [name for name in bindings if name != NO_LIMIT]
    diagnoses = _shares([r.diagnosis for r in read])
    return {
        "source": source,
        "evaluations": len(read),
        "unread": len(readings) - len(read),
        "window_seconds": last.window_seconds,
        "engine": last.engine,
        "running_mean": running_mean,
        "running_max": running_max,
        "cap": last.cap,
        "running_vs_cap_mean": vs_cap_mean,
        "running_vs_cap_max": vs_cap_max,
        "waiting_mean": waiting_mean,
        "waiting_max": waiting_max,
        "kv_usage_mean": kv_mean,
        "kv_usage_max": kv_max,
        "preemptions_per_s": last.preemptions_per_second,
        "tokens_per_step": last.tokens_per_step,
        "token_budget": last.token_budget,
        "binding_limit": named[0] if named else None,
        "binding_shares": bindings,
        "diagnosis": next(iter(diagnoses)),
        "diagnosis_shares": diagnoses,
    }
