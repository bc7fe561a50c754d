"""The exporter's own /metrics: a prometheus-client Collector over the current signals.

Fresh families on every collect(), no state in metric objects (client_python's pattern).
A value that cannot be known is left out, never filled with a made-up number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

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


def _gauge(name: str, documentation: str) -> Metric:
    return Metric(name, documentation, "gauge")


def _labels(target: TargetSignals, series: SeriesSignals) -> dict[str, str]:
    return {"target": target.target, **target.extra_labels, **series.labels}


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_exposition(families: Iterable[Metric]) -> bytes:
    """The text exposition (0.0.4) of gauge and counter families: byte for byte what
    prometheus_client's generate_latest writes, several times faster at a fleet's size,
    since each label set (a target's, a series') is escaped once for all its metrics."""
    label_texts: dict[tuple[tuple[str, str], ...], str] = {}
    out: list[str] = []
    for metric in families:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        help_text = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            key = tuple(sample.labels.items())
            labels = label_texts.get(key)
            if labels is None:
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(key))
                labels = label_texts[key] = f"{{{pairs}}}" if pairs else ""
            out.append(f"{sample.name}{labels} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


def _statistic(series: SeriesSignals) -> str:
    """The `quantile` label: the quantile, or `mean` where the engine exposes only a mean."""
    return "mean" if series.latency_statistic == "mean" else f"{series.latency_quantile:g}"


class SignalsCollector(Collector):
    """Collects from `source()`, the list of current TargetSignals."""

    def __init__(self, source: Callable[[], Iterable[TargetSignals]]) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        targets = list(self.source())
        up = _gauge("batchscope_target_up", "1 when the last scrape of the target succeeded.")
        duration = _gauge("batchscope_scrape_duration_seconds", "Duration of the last scrape.")
        gauges = {name: _gauge(name, doc) for name, doc, _ in SERIES_GAUGES}
        latency = _gauge(
            "batchscope_latency_seconds",
            "Latency quantile over the window, from the configured histogram's deltas.",
        )
        saturated = _gauge(
            "batchscope_budget_saturated",
            "1 while budget utilisation has stayed at or above the threshold for the hold time.",
        )
        static = _gauge(
            "batchscope_static_utilization_ratio",
            "Expected share of useful slot-steps if this traffic were batched statically at the "
            "cap (estimate with lower/upper bounds from the output-length histogram).",
        )
        gain = _gauge(
            "batchscope_continuous_batching_gain_ratio",
            "What continuous batching gains over static batching on this traffic (1/estimate).",
        )
        diagnosis = _gauge(
            "batchscope_diagnosis", "1 for the current diagnosis state of the target or series."
        )
        advice = _gauge(
            "batchscope_advice_value",
            "One number of advice (kind label: what it is; /api/v1/advice has its inputs, "
            "confidence and the sentence).",
        )
        errors = Metric(
            "batchscope_target_errors",
            "Payloads of the target that could not be read or evaluated, by reason.",
            "counter",
        )
        resets = Metric(
            "batchscope_window_resets",
            "Times the target's window started again, by reason (engine_changed).",
            "counter",
        )
        for t in targets:
            target_labels = {"target": t.target, **t.extra_labels}
            up.add_sample(up.name, target_labels, 1.0 if t.up else 0.0)
            for counter, counts in ((errors, t.errors_total), (resets, t.window_resets_total)):
                for reason, count in sorted(counts.items()):
                    counter.add_sample(counter.name + "_total",
                                       {**target_labels, "reason": reason}, float(count))  # fmt: skip
            if t.scrape_seconds is not None:
                duration.add_sample(duration.name, target_labels, t.scrape_seconds)
            for s in (*t.series, t.total) if t.up else (t.total,):
                labels = _labels(t, s)
                for name, _, attribute in SERIES_GAUGES:
                    value = getattr(s, attribute)
                    if value is not None and math.isfinite(value):
                        gauges[name].add_sample(name, labels, float(value))
                if s.latency_seconds is not None and math.isfinite(s.latency_seconds):
                    latency.add_sample(
                        latency.name,
                        {**labels, "quantile": _statistic(s), "histogram": s.latency_histogram},
                        s.latency_seconds,
                    )  # fmt: skip
                if t.up:
                    saturated.add_sample(saturated.name, labels, float(s.budget_saturated))
                if s.static_utilization is not None:
                    u = s.static_utilization
                    for bound, value in (("estimate", u.estimate), ("lower", u.lower),
                                         ("upper", u.upper)):  # fmt: skip
                        static.add_sample(static.name, {**labels, "bound": bound}, value)
                    gain.add_sample(gain.name, labels, u.continuous_batching_gain)
                for item in s.advice.items:
                    if math.isfinite(item.value):
                        advice.add_sample(advice.name, {**labels, "kind": item.kind}, item.value)
                for state in DIAGNOSIS_STATES:
                    diagnosis.add_sample(
                        diagnosis.name,
                        {**labels, "state": state},
                        1.0 if s.diagnosis.state == state else 0.0,
                    )
        yield up
        yield duration
        yield from gauges.values()
        yield latency
        yield saturated
        yield static
        yield gain
        yield diagnosis
        yield advice
        yield errors
        yield resets
