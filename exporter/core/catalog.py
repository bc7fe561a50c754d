"""Every signal the product shows, declared once.

A `Signal` is one field of a series' (or a target total's) signals: its name, its unit,
its help text, the pure function of the window that computes it (`compute`, over an
`exporter.core.evaluate.WindowReading`), and where it shows: its /metrics family, the
fleet summary, the history's columns, the Live page. Everything else is derived from
`SERIES`: the `SeriesSignals` dataclass, the families /metrics writes (`FAMILIES`), the
JSON API's fields, the history's columns, the dashboard's columns and the tables of
docs/metrics.md (a test holds the docs to them). The PromQL twin in grafana/ stays a
second implementation on purpose, and a test holds every signal that has a recording
rule equal to it (grafana/rules.py names which).

Adding a signal from an engine's counter: the adapter reads it into the snapshot
(`exporter/engines/`, `exporter/core/snapshot.py`), one `Signal` here, and its
recording rule in grafana/rules.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, make_dataclass
from typing import Any

from batchscope.exporter.core.advice import Advice
from batchscope.exporter.core.declare import (
    Signal,
    burning,
    counter,
    estimate,
    has_latency,
    keep,
    share,
)
from batchscope.exporter.core.demand import demand, replica_capacity
from batchscope.exporter.core.diagnosis import Diagnosis
from batchscope.exporter.core.families import (
    ADVICE,
    BINDING_LIMIT,
    CONTINUOUS_GAIN,
    DIAGNOSIS,
    GOODPUT,
    LATENCY,
    LIMIT_RATIO,
    SCRAPE_DURATION,
    SLO_ATTAINMENT,
    SLO_BURN_RATE,
    SLO_BURNING,
    SLO_ERROR_BUDGET,
    SLO_HISTORY,
    SLO_OBJECTIVE,
    STATIC_UTILIZATION,
    TARGET_ERRORS,
    TARGET_UP,
    WINDOW_RESETS,
    Family,
)
from batchscope.exporter.core.limits import Limits
from batchscope.exporter.core.signals import (
    batch_size_distribution,
    execution_increase,
    running_vs_cap,
    throughput_gain,
)

# The Live page's groups of numbers (`live`): the last scrape's, the window's, the
# caches' (the vLLM board shows that group in a row of its own).
NOW, WINDOW, CACHES = "now", "window", "caches"

SERIES: tuple[Signal, ...] = (
    Signal(
        "labels",
        "series",
        "labels",
        "The series' own labels (model_name, engine, batcher, ...); none for a target total.",
        lambda w: w.last.labels,
        default=field(default_factory=dict),
    ),
    Signal(
        "engine",
        "engine",
        "name",
        "The engine adapter that read the series.",
        lambda w: w.last.engine,
        default="",
        summary=True,
    ),
    Signal(
        "running",
        "running",
        "requests",
        "Requests in the running batch (vLLM num_requests_running).",
        lambda w: w.last.running,
        metric="batchscope_running_requests",
        summary=True,
        history=keep("running"),
        live=NOW,
        published=counter("running"),
        rule="target_model_engine:vllm_num_requests_running:sum",
    ),
    Signal(
        "running_peak",
        "running (peak)",
        "requests",
        "The batch the diagnosis and the limits judge: the peak of the running gauge over "
        "the last 3 scrapes (a batcher: its mean fired batch over the window).",
        lambda w: w.peak,
        summary=True,
    ),
    Signal(
        "waiting",
        "waiting",
        "requests",
        "Requests waiting for a batch slot.",
        lambda w: w.last.waiting,
        metric="batchscope_waiting_requests",
        summary=True,
        history=keep("waiting"),
        live=NOW,
        published=counter("waiting"),
        rule="target_model_engine:vllm_num_requests_waiting:sum",
    ),
    Signal(
        "cap",
        "cap",
        "requests",
        "Maximum batch size (configured cap or the batcher's own).",
        lambda w: w.cap,
        metric="batchscope_batch_cap",
        summary=True,
        history=keep("cap"),
    ),
    Signal(
        "running_vs_cap",
        "running / cap",
        "ratio",
        "Running batch over its cap (in-house: mean batch size over max batch size).",
        lambda w: running_vs_cap(w.batch, w.cap),
        metric="batchscope_running_vs_cap_ratio",
        history=keep("running_vs_cap"),
        rule="target_model_engine:vllm_running_vs_cap:ratio",
    ),
    Signal(
        "batch_tokens",
        "batch tokens",
        "tokens",
        "Tokens the running batch holds or reserves (TGI).",
        lambda w: w.last.batch_tokens,
        metric="batchscope_batch_tokens",
        live=NOW,
        published=counter("batch_tokens"),
    ),
    Signal(
        "token_cap",
        "token cap",
        "tokens",
        "Token budget of the running batch (configured token_cap).",
        lambda w: w.settings.token_cap,
        metric="batchscope_token_cap",
    ),
    Signal(
        "tokens_vs_cap",
        "tokens / cap",
        "ratio",
        "Batch tokens over the token budget.",
        lambda w: running_vs_cap(w.last.batch_tokens, w.settings.token_cap),
        metric="batchscope_tokens_vs_cap_ratio",
    ),
    Signal(
        "mean_batch_size",
        "mean batch",
        "requests",
        "Mean executed batch size over the window.",
        lambda w: w.rates.mean_batch,
        metric="batchscope_mean_batch_size",
        history=keep("mean_batch_size"),
        live=WINDOW,
        published=lambda last, _: last.items_total is not None and last.batches_total is not None,
    ),
    Signal(
        "preemptions_per_second",
        "preemptions/s",
        "per_second",
        "Preemptions per second over the window.",
        lambda w: w.rates.preemptions,
        metric="batchscope_preemptions_per_second",
        summary=True,
        history=keep("preemptions_per_second"),
        live=WINDOW,
        published=counter("preemptions_total"),
        rule="target_model_engine:vllm_num_preemptions:rate",
    ),
    Signal(
        "kv_cache_usage",
        "KV cache",
        "ratio",
        "KV cache usage, 0..1.",
        lambda w: w.last.kv_usage,
        metric="batchscope_kv_cache_usage_ratio",
        summary=True,
        history=keep("kv_cache_usage"),
        live=NOW,
        published=counter("kv_usage"),
        rule="target_model_engine:vllm_kv_cache_usage:ratio",
    ),
    Signal(
        "requests_per_second",
        "requests/s",
        "per_second",
        "Finished requests per second over the window.",
        lambda w: w.rates.requests,
        metric="batchscope_requests_per_second",
        history=keep("requests_per_second"),
        live=WINDOW,
        published=counter("requests_total"),
        rule="target_model_engine:vllm_request_success:rate",
    ),
    Signal(
        "generation_tokens_per_second",
        "tokens/s",
        "per_second",
        "Generated tokens per second over the window.",
        lambda w: w.rates.tokens,
        metric="batchscope_generation_tokens_per_second",
        history=keep("generation_tokens_per_second"),
        live=WINDOW,
        published=counter("generation_tokens_total"),
        rule="target_model_engine:vllm_generation_tokens:rate",
    ),
    Signal(
        "window_seconds",
        "window",
        "seconds",
        "The span the rates, the latency and the advice were measured over.",
        lambda w: w.span,
        summary=True,
    ),
    Signal(
        "latency_quantile",
        "quantile",
        "ratio",
        "The latency quantile judged against the budget.",
        lambda w: w.settings.quantile,
        default=0.99,
    ),
    Signal(
        "latency_histogram",
        "latency histogram",
        "name",
        "Which latency the quantile is of (e2e, ttft, queue, inference, tpot, itl).",
        lambda w: w.settings.histogram,
        default="e2e",
    ),
    Signal(
        "latency_seconds",
        "latency",
        "seconds",
        "The window's latency quantile (or the engine's own summary's, or a mean where the "
        "engine exposes only that).",
        lambda w: w.latency,
        families=(LATENCY,),
        summary=True,
        history=keep("latency_seconds"),
        live=WINDOW,
        published=has_latency,
    ),
    Signal(
        "latency_statistic",
        "statistic",
        "name",
        "quantile, or mean where the engine exposes only a mean.",
        lambda w: w.statistic,
    ),
    Signal(
        "budget_seconds",
        "budget",
        "seconds",
        "Latency budget the utilisation is measured against.",
        lambda w: w.budget,
        metric="batchscope_budget_seconds",
        summary=True,
    ),
    Signal(
        "budget_utilization",
        "budget used",
        "ratio",
        "Observed latency quantile over the latency budget.",
        lambda w: w.utilization,
        metric="batchscope_budget_utilization_ratio",
        summary=True,
        history=keep("budget_utilization"),
        published=has_latency,
    ),
    Signal(
        "budget_saturated",
        "saturated",
        "bool",
        "1 while budget utilisation has stayed at or above the threshold for the hold time.",
        lambda w: w.saturation.saturated,
        default=False,
        metric="batchscope_budget_saturated",
        summary=True,
        history=keep("budget_saturated"),
    ),
    Signal(
        "budget_saturated_seconds",
        "at threshold",
        "seconds",
        "Seconds the current episode at or above the saturation threshold has lasted.",
        lambda w: w.above_seconds,
        default=0.0,
        metric="batchscope_budget_saturated_seconds",
        summary=True,
        history=keep("budget_saturated_seconds"),
    ),
    Signal(
        "throughput_gain",
        "throughput gain",
        "ratio",
        "Items per execution-second at the observed batch sizes over that at batch size 1.",
        lambda w: throughput_gain(
            execution_increase(w.first.execution_by_size, w.last.execution_by_size),
            dict(w.last.execution_by_size),
        ),
        metric="batchscope_throughput_gain_ratio",
        history=keep("throughput_gain"),
        live=WINDOW,
        published=lambda last, _: bool(last.execution_by_size),
    ),
    Signal(
        "padding_waste",
        "padding",
        "ratio",
        "Share of the token positions in fired batches that were padding (in-house batchers).",
        lambda w: w.padding,
        metric="batchscope_padding_waste_ratio",
        history=keep("padding_waste"),
        live=WINDOW,
    ),
    Signal(
        "slo_attainment",
        "within budget",
        "ratio",
        "Share of the window's requests within the latency budget, from the latency "
        "histogram's buckets (estimate and bounds).",
        lambda w: w.attained,
        families=(SLO_ATTAINMENT,),
        history=(("slo_attainment", lambda a: None if a is None else a.share.estimate),),
        published=lambda last, settings: settings.histogram in last.latency,
    ),
    Signal(
        "goodput_per_second",
        "goodput",
        "per_second",
        "Requests per second within the latency budget over the window.",
        lambda w: w.goodput,
        families=(GOODPUT,),
    ),
    Signal(
        "slo",
        "SLO",
        "status",
        "With an objective: the burn rates over the standard windows, the pairs burning "
        "and the error budget left.",
        lambda w: w.slo,
        families=(SLO_OBJECTIVE, SLO_BURN_RATE, SLO_BURNING, SLO_ERROR_BUDGET, SLO_HISTORY),
        history=(
            ("slo_burning_fast", burning("fast")),
            ("slo_burning_slow", burning("slow")),
        ),
    ),
    Signal(
        "tokens_per_step",
        "tokens/step",
        "tokens",
        "Mean tokens an engine step carried over the window (vLLM iteration_tokens).",
        lambda w: w.tokens_per_step,
        metric="batchscope_tokens_per_step",
        live=WINDOW,
        rule="target_model_engine:vllm_iteration_tokens:mean",
    ),
    Signal(
        "token_budget",
        "token budget",
        "tokens",
        "Tokens one engine step may carry (configured max_num_batched_tokens).",
        lambda w: w.settings.token_budget,
        metric="batchscope_token_budget",
    ),
    Signal(
        "token_budget_ratio",
        "tokens/step / budget",
        "ratio",
        "Tokens per step over the configured token budget.",
        lambda w: w.limits.ratio("token_budget"),
    ),
    Signal(
        "waiting_deferred",
        "deferred",
        "requests",
        "Waiting requests deferred by a transient constraint, not short of room (vLLM).",
        lambda w: w.last.waiting_deferred,
        metric="batchscope_deferred_requests",
        live=NOW,
        rule="target_model_engine:vllm_num_requests_waiting_deferred:sum",
    ),
    Signal(
        "rejections_per_second",
        "rejected/s",
        "per_second",
        "Requests refused at admission by a queue limit, per second over the window.",
        lambda w: w.rates.rejections,
        metric="batchscope_admission_rejections_per_second",
        live=WINDOW,
    ),
    Signal(
        "prefix_cache_hit_rate",
        "prefix cache hits",
        "ratio",
        "Share of the prompt tokens looked up in the prefix cache that it held, over the "
        "window (vLLM prefix_cache_hits / prefix_cache_queries).",
        lambda w: share(w, "prefix_cache_hits_total", "prefix_cache_queries_total"),
        metric="batchscope_prefix_cache_hit_ratio",
        history=keep("prefix_cache_hit_rate"),
        live=CACHES,
        published=counter("prefix_cache_queries_total"),
        rule="target_model_engine:vllm_prefix_cache_hit:ratio",
    ),
    Signal(
        "spec_decode_acceptance_rate",
        "draft tokens accepted",
        "ratio",
        "Share of the speculative decoder's draft tokens the target model accepted, over "
        "the window (vLLM spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens).",
        lambda w: share(w, "spec_accepted_tokens_total", "spec_draft_tokens_total"),
        metric="batchscope_spec_decode_acceptance_ratio",
        history=keep("spec_decode_acceptance_rate"),
        live=CACHES,
        published=counter("spec_draft_tokens_total"),
        rule="target_model_engine:vllm_spec_decode_acceptance:ratio",
    ),
    Signal(
        "limits",
        "limits",
        "limits",
        "What limits the batch: each limit's reading against its bound, the one that binds.",
        lambda w: w.limits,
        default=Limits(),
        families=(LIMIT_RATIO, BINDING_LIMIT),
    ),
    Signal(
        "static_utilization",
        "static utilisation",
        "ratio",
        "Expected useful share of slot-steps if this window's traffic were batched "
        "statically at the cap (estimate and bounds).",
        lambda w: w.static,
        families=(STATIC_UTILIZATION, CONTINUOUS_GAIN),
        history=(("static_utilization", estimate),),
        published=lambda last, _: last.output_tokens is not None,
    ),
    Signal(
        "batch_size_distribution",
        "batch sizes",
        "shares",
        "Share of batches by size: a batcher's batch-size histogram over the window, or "
        "the sampled running gauge.",
        lambda w: batch_size_distribution(w.running_samples, w.increase("batch_size")),
        default=field(default_factory=list),
    ),
    Signal(
        "demand",
        "demand",
        "demand",
        "What the series was asked per second over the window: requests finished, refused "
        "at admission, and the growth of those running and waiting (a batcher: items).",
        demand,
    ),
    Signal(
        "replica_capacity",
        "replica capacity",
        "capacity",
        "What the series serves per second within the budget at its binding limit, with "
        "its inputs and confidence (the model's replica count divides demand by it).",
        replica_capacity,
    ),
    Signal(
        "diagnosis",
        "diagnosis",
        "state",
        "One state with a plain-language reason (docs/metrics.md lists the states).",
        lambda w: w.diagnosis,
        default=Diagnosis("idle", ""),
        families=(DIAGNOSIS,),
        summary=True,
    ),
    Signal(
        "not_exposed",
        "not exposed",
        "names",
        "Signals whose raw series this engine does not publish (absent, not merely unknown).",
        lambda w: w.not_exposed,
        default=(),
        summary=True,
    ),
    Signal(
        "advice",
        "advice",
        "advice",
        "What to change and by how much, each number with its inputs and confidence.",
        lambda w: w.advice,
        default=Advice(),
        families=(ADVICE,),
    ),
)


def _dataclass_field(signal: Signal) -> tuple[str, Any, Any]:
    default = signal.default
    return (
        signal.name,
        Any,
        default if isinstance(default, type(field())) else field(default=default),
    )


# Every signal of one series (or a target total) at one evaluation, a field per `Signal`
# of SERIES in its order; a signal that cannot be known stays at its default (None
# mostly). Not frozen: one or two are built at every evaluation, and a frozen
# dataclass's __init__ costs several times a plain one's; nothing changes one once built.
SeriesSignals = make_dataclass(
    "SeriesSignals",
    [_dataclass_field(s) for s in SERIES],
    namespace={"__module__": __name__},
    slots=True,
)
SeriesSignals.__doc__ = "Every signal of one series (or a target total) at one evaluation."


def rule_of(name: str) -> str:
    """The recorded series of the signal called `name` (its `rule`)."""
    rule = next(s.rule for s in SERIES if s.name == name)
    if rule is None:
        raise ValueError(f"signal {name} has no recording rule")
    return rule


# What /metrics writes one gauge sample of per series: (family, SeriesSignals field).
GAUGES: tuple[tuple[Family, str], ...] = tuple((s.gauge(), s.name) for s in SERIES if s.metric)
# The fields of a series a fleet's summary rows carry.
SUMMARY_FIELDS = tuple(s.name for s in SERIES if s.summary)
# A history point's numbers: (column, SeriesSignals field, the number kept of its value).
HISTORY_COLUMNS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = tuple(
    (column, s.name, number) for s in SERIES for column, number in s.history
)
# The history's columns that are flags (kept as 0 or 1, read back as True or False).
HISTORY_FLAGS = ("budget_saturated", "slo_burning_fast", "slo_burning_slow")

# The families of /metrics, in the order they are written: the target's, then each
# signal's in the catalog's order, then the target's counters.
FAMILIES: tuple[Family, ...] = (
    TARGET_UP,
    SCRAPE_DURATION,
    *(f for s in SERIES for f in (*((s.gauge(),) if s.metric else ()), *s.families)),
    TARGET_ERRORS,
    WINDOW_RESETS,
)
