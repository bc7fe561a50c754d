"""A step's `batching` object: the server's batching signals over the step, from the
exporter's own evaluations. Pure: the evaluations (`TargetSignals`, one a scrape) in, a
JSON-ready dict out.

Gauges (running, running vs cap, waiting, KV usage) are the mean and max over the
evaluations; rates (preemptions/s, tokens per step) are the last evaluation's, whose
window is the step's own; the binding limit and the diagnosis are the time share of each
over the evaluations, the binding limit being the one with the largest share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from exporter.core.evaluate import SeriesSignals, TargetSignals

# A binding limit of None (nothing ran or waited) in the shares.
NO_LIMIT = "none"


def _mean_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    read = [v for v in values if v is not None]
    if not read:
        return None, None
    return sum(read) / len(read), max(read)


def _shares(names: Sequence[str]) -> dict[str, float]:
    counts = Counter(names)
    return {name: n / len(names) for name, n in counts.most_common()}


def step_batching(evaluations: Sequence[TargetSignals]) -> dict[str, Any] | None:
    """The step's batching signals from its evaluations, oldest first; None when no
    evaluation read the server."""
    read = [e for e in evaluations if e.read]
    if not read:
        return None
    totals: list[SeriesSignals] = [e.total for e in read]
    last = totals[-1]
    running_mean, running_max = _mean_max([s.running for s in totals])
    vs_cap_mean, vs_cap_max = _mean_max([s.running_vs_cap for s in totals])
    waiting_mean, waiting_max = _mean_max([s.waiting for s in totals])
    kv_mean, kv_max = _mean_max([s.kv_cache_usage for s in totals])
    bindings = _shares([s.limits.binding or NO_LIMIT for s in totals])
    named = [name for name in bindings if name != NO_LIMIT]
    diagnoses = _shares([s.diagnosis.state for s in totals])
    return {
        "evaluations": len(read),
        "unread": len(evaluations) - len(read),
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
