"""The normalized view of one scrape: what every engine adapter produces.

An engine adapter maps one engine's metric names onto `SeriesSnapshot`s; the signal
math only ever sees these, so adding an engine touches one adapter file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from batchscope.exporter.core.histogram import Histogram, histogram_add

LabelKey = tuple[tuple[str, str], ...]


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
    # The most requests the engine reports it runs at once (TensorRT-LLM's max, Ray's
    # max_batch_size): used when the configuration gives no cap, where `cap` (an
    # in-house batcher's own setting) wins over the configuration.
    engine_cap: float | None = None
    budget_seconds: float | None = None
    requests_total: float | None = None
    generation_tokens_total: float | None = None
    items_total: float | None = None
    batches_total: float | None = None
    # in-house batchers: token positions in fired batches (real + padding), and padding
    batch_tokens_total: float | None = None
    padding_tokens_total: float | None = None
    latency: Mapping[str, Histogram] = field(default_factory=dict)
    # Engines with no latency histogram: kind -> (requests, seconds), both cumulative
    # (Triton's duration counters over its request count): a mean over the window.
    latency_means: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # kind -> {quantile: seconds} over the engine's own sliding window (a summary).
    latency_quantiles: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    # Tokens the running batch holds or reserves, against a token cap (TGI).
    batch_tokens: float | None = None
    output_tokens: Histogram | None = None
    batch_size: Histogram | None = None
    # batch size -> (batches executed, execution seconds), cumulative
    execution_by_size: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    prompt_tokens: Histogram | None = None
    max_wait_seconds: float | None = None
    # The engine's KV cache as it states it (vLLM's cache_config_info).
    kv_capacity_tokens: float | None = None
    block_size: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None
    # The most requests of max_model_len the KV cache holds, as the engine states it.
    kv_max_concurrency: float | None = None
    # Tokens credited per engine step (vLLM's iteration_tokens: see engines/vllm.py).
    step_tokens: Histogram | None = None
    # Waiting requests held back by a transient constraint, not by a limit (vLLM's
    # waiting_by_reason "deferred"); requests refused at admission (a queue limit).
    waiting_deferred: float | None = None
    rejections_total: float | None = None
    # In-house batchers: batches fired by trigger (full, timeout, budget), cumulative.
    batches_by_trigger: Mapping[str, float] = field(default_factory=dict)
    # Prompt tokens the prefix cache was asked for and held; a speculative decoder's draft
    # tokens and those the model accepted (vLLM), cumulative.
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.key)


def join_series(series: Sequence[SeriesSnapshot]) -> tuple[SeriesSnapshot, ...]:
    """One series per key: where two adapters read the same model (Triton's counters and
    its TensorRT-LLM backend's gauges), each field comes from the first that fills it."""
    joined: dict[LabelKey, SeriesSnapshot] = {}
    for s in series:
        first = joined.get(s.key)
        if first is None:
            joined[s.key] = s
            continue
        missing = {
            f.name: getattr(s, f.name)
            for f in fields(s)
            if getattr(first, f.name) in (None, {}) and f.name != "engine"
        }
        joined[s.key] = replace(first, engine=f"{first.engine}+{s.engine}", **missing)
    return tuple(joined.values())


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of one target: up with its series, or down with the reason."""

    target: str
    t: float
    up: bool
    series: tuple[SeriesSnapshot, ...] = ()
    error: str | None = None
    scrape_seconds: float | None = None


def _sum_known(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _merge_histograms(hists: Sequence[Histogram]) -> Histogram | None:
    merged: Histogram | None = None
    for h in hists:
        merged = histogram_add(merged, h)
        if merged is None:
            return None
    return merged


def effective_cap(series: SeriesSnapshot, configured: float | None) -> float | None:
    """The cap a series is judged against: its own `cap`, else the configured one, else
    the maximum the engine reports."""
    if series.cap is not None:
        return series.cap
    return configured if configured is not None else series.engine_cap


# A series' cumulative counters: what an evaluation reads as increases over its window.
COUNTERS = (
    "preemptions_total",
    "requests_total",
    "generation_tokens_total",
    "items_total",
    "batches_total",
    "batch_tokens_total",
    "padding_tokens_total",
    "rejections_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
)

# The counts and gauges a target total adds up over its series.
SUMMED = ("running", "waiting", "batch_tokens", "waiting_deferred", *COUNTERS)


def merge_series(
    series: Sequence[SeriesSnapshot],
    default_cap: float | None,
    default_budget: float | None = None,
) -> SeriesSnapshot:
    """All series of one scrape as one (the target total): counts and histograms add up,
    KV usage is the fullest engine's, the cap is the sum of the series' caps (None if any
    is unknown). A histogram whose series use different bucket layouts is left out, and
    so are summary quantiles when there are several series. The KV cache's settings are
    kept only when the target has one series (a total's KV usage is the fullest engine's,
    which no summed capacity matches).

    Series held to different latency budgets (an in-house batcher's own beside the
    configured one) have no common budget: the total keeps no latency, so one service's
    latency is never judged against another's budget.
    """
    caps = [effective_cap(s, default_cap) for s in series]
    budgets = {s.budget_seconds if s.budget_seconds is not None else default_budget for s in series}
    one_budget = len(budgets) <= 1
    latency: dict[str, Histogram] = {}
    for kind in {k for s in series for k in s.latency} if one_budget else ():
        merged = _merge_histograms([s.latency[kind] for s in series if kind in s.latency])
        if merged is not None:
            latency[kind] = merged
    means: dict[str, tuple[float, float]] = {}
    for s in series if one_budget else ():
        for kind, (n, secs) in s.latency_means.items():
            n0, s0 = means.get(kind, (0.0, 0.0))
            means[kind] = (n0 + n, s0 + secs)
    by_size: dict[int, tuple[float, float]] = {}
    for s in series:
        for size, (n, secs) in s.execution_by_size.items():
            n0, s0 = by_size.get(size, (0.0, 0.0))
            by_size[size] = (n0 + n, s0 + secs)
    triggers: dict[str, float] = {}
    for s in series:
        for trigger, n in s.batches_by_trigger.items():
            triggers[trigger] = triggers.get(trigger, 0.0) + n
    kv = [s.kv_usage for s in series if s.kv_usage is not None]
    only = series[0] if len(series) == 1 else SeriesSnapshot(key=(), engine="")
    return SeriesSnapshot(
        key=(),
        engine="+".join(sorted({s.engine for s in series})),
        **{name: _sum_known([getattr(s, name) for s in series]) for name in SUMMED},
        kv_usage=max(kv) if kv else None,
        cap=None if any(c is None for c in caps) or not caps else sum(caps),
        budget_seconds=budgets.pop() if len(budgets) == 1 else None,
        latency=latency,
        latency_means=means,
        # Quantiles of several series do not add up: the total has them for one series only.
        latency_quantiles=series[0].latency_quantiles if len(series) == 1 else {},
        output_tokens=_merge_histograms(
            [s.output_tokens for s in series if s.output_tokens is not None]
        ),
        execution_by_size=by_size,
        batches_by_trigger=triggers,
        step_tokens=_merge_histograms([s.step_tokens for s in series if s.step_tokens is not None]),
        prompt_tokens=_merge_histograms(
            [s.prompt_tokens for s in series if s.prompt_tokens is not None]
        ),
        max_wait_seconds=only.max_wait_seconds,
        kv_capacity_tokens=only.kv_capacity_tokens,
        block_size=only.block_size,
        gpu_memory_utilization=only.gpu_memory_utilization,
        kv_cache_memory_bytes=only.kv_cache_memory_bytes,
        kv_max_concurrency=only.kv_max_concurrency,
    )


def histograms_of(series: SeriesSnapshot) -> dict[str, Histogram]:
    """The histograms a series holds, by name: `latency:KIND` (`latency_histogram`),
    `output_tokens`, `prompt_tokens`, `batch_size`, `step_tokens`."""
    named = {latency_histogram(kind): hist for kind, hist in series.latency.items()}
    for name, hist in (
        ("output_tokens", series.output_tokens),
        ("prompt_tokens", series.prompt_tokens),
        ("batch_size", series.batch_size),
        ("step_tokens", series.step_tokens),
    ):
        if hist is not None:
            named[name] = hist
    return named


def latency_histogram(kind: str) -> str:
    """The name `histograms_of` gives a series' latency histogram of this kind."""
    return f"latency:{kind}"


def total_equals_sole_series(series: SeriesSnapshot, default_cap: float | None) -> bool:
    """Whether the total of a target whose scrape holds only this series
    (`merge_series([series], default_cap, ...)`) holds what the series holds but its
    labels, with its cap and budget resolved: every other field equal, as dataclasses
    compare them. The signals of such a total are the series' own, without labels.

    It does unless the series has a batch-size histogram (no total keeps one), or a NaN
    among the values a total adds up (a sum of one NaN is another NaN, unequal).
    """
    added = [getattr(series, name) for name in SUMMED]
    added.append(effective_cap(series, default_cap))
    for pair in (*series.latency_means.values(), *series.execution_by_size.values()):
        added.extend(pair)
    added.extend(series.batches_by_trigger.values())
    return series.batch_size is None and not any(v is not None and math.isnan(v) for v in added)
