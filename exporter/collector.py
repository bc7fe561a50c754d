"""The exporter's own /metrics: its families, and their exposition over the current signals.

`SignalsCollector` is a prometheus-client Collector, fresh families on every collect()
and no state in metric objects (client_python's pattern): what a registry takes.
`render_metrics` writes the same text directly, several times cheaper, and is what the
exporter serves; tests hold it byte for byte to generate_latest of the Collector.
A value that cannot be known is left out, never filled with a made-up number.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter.signals import DIAGNOSIS_STATES
from exporter.target import SeriesSignals, TargetSignals

# (metric name, help, attribute of SeriesSignals)
SERIES_GAUGES = (
    ("batchscope_running_requests", "Requests in the running batch (vLLM num_requests_running).",
     "running"),
    ("batchscope_waiting_requests", "Requests waiting for a batch slot.", "waiting"),
    ("batchscope_batch_cap", "Maximum batch size (configured cap or the batcher's own).", "cap"),
    ("batchscope_running_vs_cap_ratio",
     "Running batch over its cap (in-house: mean batch size over max batch size).",
     "running_vs_cap"),
    ("batchscope_batch_tokens", "Tokens the running batch holds or reserves (TGI).",
     "batch_tokens"),
    ("batchscope_token_cap", "Token budget of the running batch (configured token_cap).",
     "token_cap"),
    ("batchscope_tokens_vs_cap_ratio", "Batch tokens over the token budget.", "tokens_vs_cap"),
    ("batchscope_mean_batch_size", "Mean executed batch size over the window.",
     "mean_batch_size"),
    ("batchscope_preemptions_per_second", "Preemptions per second over the window.",
     "preemptions_per_second"),
    ("batchscope_kv_cache_usage_ratio", "KV cache usage, 0..1.", "kv_cache_usage"),
    ("batchscope_requests_per_second", "Finished requests per second over the window.",
     "requests_per_second"),
    ("batchscope_generation_tokens_per_second", "Generated tokens per second over the window.",
     "generation_tokens_per_second"),
    ("batchscope_budget_seconds", "Latency budget the utilisation is measured against.",
     "budget_seconds"),
    ("batchscope_budget_utilization_ratio",
     "Observed latency quantile over the latency budget.", "budget_utilization"),
    ("batchscope_budget_saturated_seconds",
     "Seconds the current episode at or above the saturation threshold has lasted.",
     "budget_saturated_seconds"),
    ("batchscope_throughput_gain_ratio",
     "Items per execution-second at the observed batch sizes over that at batch size 1.",
     "throughput_gain"),
    ("batchscope_padding_waste_ratio",
     "Share of the token positions in fired batches that were padding (in-house batchers).",
     "padding_waste"),
)  # fmt: skip


@dataclass(frozen=True)
class Family:
    """One metric family of /metrics: its name (a counter's without `_total`), help, type,
    and the labels the exporter sets on it besides `target` and a series' key labels
    (`exporter.labels` reserves them all)."""

    name: str
    documentation: str
    type: str = "gauge"
    labels: tuple[str, ...] = ()

    def header(self) -> str:
        """Its `# HELP` and `# TYPE` lines, as generate_latest writes them."""
        name = self.name + "_total" if self.type == "counter" else self.name
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {help_text}\n# TYPE {name} {self.type}\n"


TARGET_UP = Family("batchscope_target_up", "1 when the last scrape of the target succeeded.")
SCRAPE_DURATION = Family("batchscope_scrape_duration_seconds", "Duration of the last scrape.")
SERIES_GAUGE_FAMILIES = tuple(Family(name, doc) for name, doc, _ in SERIES_GAUGES)
LATENCY = Family(
    "batchscope_latency_seconds",
    "Latency quantile over the window, from the configured histogram's deltas.",
    labels=("quantile", "histogram"),
)
SATURATED = Family(
    "batchscope_budget_saturated",
    "1 while budget utilisation has stayed at or above the threshold for the hold time.",
)
STATIC_UTILIZATION = Family(
    "batchscope_static_utilization_ratio",
    "Expected share of useful slot-steps if this traffic were batched statically at the "
    "cap (estimate with lower/upper bounds from the output-length histogram).",
    labels=("bound",),
)
CONTINUOUS_GAIN = Family(
    "batchscope_continuous_batching_gain_ratio",
    "What continuous batching gains over static batching on this traffic (1/estimate).",
)
DIAGNOSIS = Family(
    "batchscope_diagnosis",
    "1 for the current diagnosis state of the target or series.",
    labels=("state",),
)
ADVICE = Family(
    "batchscope_advice_value",
    "One number of advice (kind label: what it is; /api/v1/advice has its inputs, "
    "confidence and the sentence).",
    labels=("kind",),
)
TARGET_ERRORS = Family(
    "batchscope_target_errors",
    "Payloads of the target that could not be read or evaluated, by reason.",
    "counter",
    labels=("reason",),
)
WINDOW_RESETS = Family(
    "batchscope_window_resets",
    "Times the target's window started again, by reason (engine_changed).",
    "counter",
    labels=("reason",),
)
# The families of /metrics, in the order they are written.
FAMILIES = (
    TARGET_UP, SCRAPE_DURATION, *SERIES_GAUGE_FAMILIES, LATENCY, SATURATED,
    STATIC_UTILIZATION, CONTINUOUS_GAIN, DIAGNOSIS, ADVICE, TARGET_ERRORS, WINDOW_RESETS,
)  # fmt: skip
BOUNDS = ("estimate", "lower", "upper")


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _statistic(series: SeriesSignals) -> str:
    """The `quantile` label: the quantile, or `mean` where the engine exposes only a mean."""
    return "mean" if series.latency_statistic == "mean" else f"{series.latency_quantile:g}"


def _metric(family: Family) -> Metric:
    return Metric(family.name, family.documentation, family.type)


class SignalsCollector(Collector):
    """Collects from `source()`, the list of current TargetSignals: the families as
    prometheus_client objects, for a registry. The exporter serves `render_metrics`,
    the same bytes written directly (tests hold the two together)."""

    def __init__(self, source: Callable[[], Iterable[TargetSignals]]) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        metrics = {family.name: _metric(family) for family in FAMILIES}
        up, duration, latency, saturated, static, gain, diagnosis, advice, errors, resets = (
            metrics[family.name]
            for family in (TARGET_UP, SCRAPE_DURATION, LATENCY, SATURATED, STATIC_UTILIZATION,
                           CONTINUOUS_GAIN, DIAGNOSIS, ADVICE, TARGET_ERRORS, WINDOW_RESETS)
        )  # fmt: skip
        for t in self.source():
            target_labels = {"target": t.target, **t.extra_labels}
            up.add_sample(up.name, target_labels, 1.0 if t.up else 0.0)
            for counter, counts in ((errors, t.errors_total), (resets, t.window_resets_total)):
                for reason, count in sorted(counts.items()):
                    counter.add_sample(counter.name + "_total",
                                       {**target_labels, "reason": reason}, float(count))  # fmt: skip
            if t.scrape_seconds is not None:
                duration.add_sample(duration.name, target_labels, t.scrape_seconds)
            for s in (*t.series, t.total) if t.up else (t.total,):
                labels = {**target_labels, **s.labels}
                for name, _, attribute in SERIES_GAUGES:
                    value = getattr(s, attribute)
                    if value is not None and math.isfinite(value):
                        metrics[name].add_sample(name, labels, float(value))
                if s.latency_seconds is not None and math.isfinite(s.latency_seconds):
                    latency.add_sample(
                        latency.name,
                        {**labels, "quantile": _statistic(s), "histogram": s.latency_histogram},
                        s.latency_seconds,
                    )  # fmt: skip
                saturated.add_sample(saturated.name, labels, float(s.budget_saturated))
                if s.static_utilization is not None:
                    u = s.static_utilization
                    for bound, value in zip(BOUNDS, (u.estimate, u.lower, u.upper), strict=True):
                        static.add_sample(static.name, {**labels, "bound": bound}, value)
                    gain.add_sample(gain.name, labels, u.continuous_batching_gain)
                for item in s.advice.items:
                    if math.isfinite(item.value):
                        advice.add_sample(advice.name, {**labels, "kind": item.kind}, item.value)
                for state in DIAGNOSIS_STATES if t.read else (s.diagnosis.state,):
                    diagnosis.add_sample(
                        diagnosis.name,
                        {**labels, "state": state},
                        1.0 if s.diagnosis.state == state else 0.0,
                    )
        yield from metrics.values()


def _pairs(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, `name="escaped value"`) of each label, sorted by name as generate_latest does."""
    return sorted((name, f'{name}="{_escape(value)}"') for name, value in labels.items())


def _braced(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join([text for _, text in pairs]) + "}" if pairs else ""


def _around(pairs: Sequence[tuple[str, str]], name: str) -> tuple[str, str]:
    """The braced label text with a label `name` added (in place of one so named), cut
    where that label goes: the text before it and the text after it."""
    before = "".join([text + "," for n, text in pairs if n < name])
    after = "".join(["," + text for n, text in pairs if n > name])
    return "{" + before, after + "}"


class _NumberTexts(dict):
    """floatToGoString(value) as `texts[value]`, remembered: a fleet's /metrics repeats
    few numbers (0, 1, caps, budgets), and a dict lookup costs a fraction of formatting.
    Zero is never remembered, since 0.0 == -0.0 would give one the other's text."""

    def __missing__(self, value: float) -> str:
        text = floatToGoString(value)
        if value:
            self[value] = text
        return text


def render_metrics(targets: Iterable[TargetSignals]) -> bytes:
    """The /metrics exposition of these targets' signals: byte for byte what
    generate_latest writes for a registry holding SignalsCollector over them, at a
    fraction of its CPU. Each line is written straight from the signals, without Metric
    or Sample objects; each series' labels are sorted and escaped once for all its lines,
    and a family that adds a label (`state`, `bound`, `kind`, `reason`) only slots it in."""
    lines: dict[str, list[str]] = {family.name: [] for family in FAMILIES}
    up, duration, latency, saturated, static, gain, diagnosis, advice = (
        lines[family.name]
        for family in (TARGET_UP, SCRAPE_DURATION, LATENCY, SATURATED, STATIC_UTILIZATION,
                       CONTINUOUS_GAIN, DIAGNOSIS, ADVICE)
    )  # fmt: skip
    counters = (TARGET_ERRORS, "errors_total"), (WINDOW_RESETS, "window_resets_total")
    gauges = tuple((lines[name], name, attribute) for name, _, attribute in SERIES_GAUGES)
    states = tuple((state, f'state="{_escape(state)}"') for state in DIAGNOSIS_STATES)
    text_of = _NumberTexts().__getitem__
    kind_label = functools.cache(lambda kind: f'kind="{_escape(kind)}"')
    for t in targets:
        target_labels = {"target": t.target, **t.extra_labels}
        target_pairs = _pairs(target_labels)
        target_text = _braced(target_pairs)
        up.append(f"{TARGET_UP.name}{target_text} {text_of(t.up)}\n")
        for family, attribute in counters:
            counts = getattr(t, attribute)
            if counts:
                before, after = _around(target_pairs, "reason")
                lines[family.name] += [
                    f'{family.name}_total{before}reason="{_escape(reason)}"{after} '
                    f"{text_of(count)}\n"
                    for reason, count in sorted(counts.items())
                ]
        if t.scrape_seconds is not None:
            duration.append(f"{SCRAPE_DURATION.name}{target_text} {text_of(t.scrape_seconds)}\n")
        for s in (*t.series, t.total) if t.up else (t.total,):
            labels = {**target_labels, **s.labels}
            pairs = _pairs(labels)
            text = _braced(pairs)
            for out, name, attribute in gauges:
                value = getattr(s, attribute)
                if value is not None and math.isfinite(value):
                    out.append(f"{name}{text} {text_of(value)}\n")
            if s.latency_seconds is not None and math.isfinite(s.latency_seconds):
                quantile = {"quantile": _statistic(s), "histogram": s.latency_histogram}
                latency_text = _braced(_pairs({**labels, **quantile}))
                latency.append(f"{LATENCY.name}{latency_text} {text_of(s.latency_seconds)}\n")
            saturated.append(f"{SATURATED.name}{text} {text_of(s.budget_saturated)}\n")
            if s.static_utilization is not None:
                u = s.static_utilization
                before, after = _around(pairs, "bound")
                for bound, value in zip(BOUNDS, (u.estimate, u.lower, u.upper), strict=True):
                    static.append(
                        f'{STATIC_UTILIZATION.name}{before}bound="{bound}"{after} {text_of(value)}\n'
                    )
                gain.append(f"{CONTINUOUS_GAIN.name}{text} {text_of(u.continuous_batching_gain)}\n")
            if s.advice.items:
                before, after = _around(pairs, "kind")
                advice += [
                    f"{ADVICE.name}{before}{kind_label(item.kind)}{after} {text_of(item.value)}\n"
                    for item in s.advice.items
                    if math.isfinite(item.value)
                ]
            before, after = _around(pairs, "state")
            current = s.diagnosis.state
            diagnosis += [
                f"{DIAGNOSIS.name}{before}{label}{after} {'1.0' if state == current else '0.0'}\n"
                for state, label in states
                if t.read or state == current
            ]
    parts: list[str] = []
    for family in FAMILIES:
        parts.append(family.header())
        parts.extend(lines[family.name])
    return "".join(parts).encode()
