"""Shared by the tests: moved out of tests/exporter/test_collector.py so no test imports another."""

from __future__ import annotations

import math

from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.core.advice import Advice, AdviceItem
from batchscope.exporter.core.catalog import GAUGES
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES, Diagnosis
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.limits import BINDING_CHOICES, LIMITS, LimitReading, Limits
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.slo import (
    WINDOW_PAIRS,
    WINDOWS,
    Attainment,
    Bounded,
    BudgetEdges,
    BurnRate,
    SloStatus,
)
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.core.static_util import UtilizationEstimate
from batchscope.exporter.engines import read_series
from batchscope.exporter.serve.exposition import render_metrics
from tests.support.evaluation import evaluate_target
from tests.support.paths import fixture_text

label_values = st.text(alphabet=st.sampled_from('ab"\\\n\u00e9\u4e2d '), max_size=6)

label_names = st.sampled_from(["a", "aa", "boundary", "engine", "kinds", "reasons", "team", "zz"])

numbers = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1e6, 1234567.0, 0.1]),
)

advice_items = st.builds(
    AdviceItem,
    kind=st.sampled_from(["raise_cap_helps", 'we"ird\\kind']),
    value=st.floats(allow_nan=True, allow_infinity=True),
    unit=st.just("tokens"),
    words=label_values.map(lambda text: lambda: text),
    inputs=st.dictionaries(st.sampled_from(["cap", "kv"]), numbers),
    confidence=st.sampled_from(["high", "low"]),
    caveats=st.lists(label_values).map(tuple),
)


def exposition(settings: SignalSettings, payloads: list[str], up: bool = True) -> dict:
    """Samples of /metrics by (name, frozenset(labels)) after evaluating the payloads 5 s
    apart."""
    snapshots, states, signals = [], {}, None
    for i, name in enumerate(payloads):
        t = 100.0 + 5 * i
        if up:
            snap = Snapshot("llm", t, True, read_series(fixture_text(name)))
        else:
            snap = Snapshot("llm", t, False, error="timed out after 4 s")
        snapshots.append(snap)
        signals, states = evaluate_target("llm", "http://x", snapshots, settings, states, t)
    text = render_metrics([signals]).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


PAYLOADS = ["vllm-0.32.0-cpu-idle.txt", "vllm-0.32.0-cpu-load.txt", "vllm-0.32.0-cpu-after.txt"]


bounded = st.builds(Bounded, numbers.filter(lambda v: v is not None), st.floats(), st.floats())

attainments = st.builds(
    Attainment,
    share=bounded,
    requests=st.just(10.0),
    edges=st.just(BudgetEdges(2.0, 1.5, 2.5, 0.5)),
    reason=label_values,
)

slo_statuses = st.builds(
    SloStatus,
    objective=st.sampled_from([0.99, 0.999]),
    burn_rates=st.lists(
        st.builds(BurnRate, st.sampled_from(list(WINDOWS)), st.just(300.0), numbers),
        max_size=5,
        unique_by=lambda b: b.window,
    ).map(tuple),
    burning_pairs=st.lists(st.sampled_from(WINDOW_PAIRS), max_size=3, unique=True).map(tuple),
    error_budget_remaining=numbers,
    history_seconds=st.floats(0.0, 1e7),
    period_seconds=st.just(2592000.0),
)


@st.composite
def series_signals(draw: st.DrawFn) -> SeriesSignals:
    gauges = {
        attribute: draw(numbers) for _, attribute in GAUGES if attribute != "budget_saturated"
    }
    static = draw(
        st.one_of(
            st.none(),
            st.builds(
                UtilizationEstimate,
                batch_size=st.just(8),
                requests=st.just(10.0),
                estimate=st.floats(0.01, 1.0),
                lower=st.one_of(st.floats(0.01, 1.0), st.just(math.nan)),
                upper=st.one_of(st.floats(0.01, 1e300), st.just(math.inf)),
            ),
        )
    )
    return SeriesSignals(
        labels=draw(st.dictionaries(st.sampled_from(["model_name", "engine"]), label_values)),
        latency_seconds=draw(numbers),
        latency_statistic=draw(st.sampled_from([None, "mean", "quantile"])),
        latency_quantile=draw(st.sampled_from([0.5, 0.99, 0.999])),
        budget_saturated=draw(st.booleans()),
        static_utilization=static,
        slo_attainment=draw(st.one_of(st.none(), attainments)),
        goodput_per_second=draw(st.one_of(st.none(), bounded)),
        slo=draw(st.one_of(st.none(), slo_statuses)),
        diagnosis=Diagnosis(draw(st.sampled_from(DIAGNOSIS_STATES)), draw(label_values)),
        advice=Advice(
            tuple(draw(st.lists(advice_items, max_size=3))), draw(label_values), draw(st.booleans())
        ),
        batch_size_distribution=draw(
            st.lists(
                st.tuples(st.sampled_from([1.0, 8.0, math.inf]), st.floats(0.0, 1.0)), max_size=3
            )
        ),
        not_exposed=tuple(draw(st.lists(st.sampled_from(["running", "waiting"]), max_size=2))),
        limits=Limits(
            tuple(
                LimitReading(limit, draw(numbers), draw(st.booleans()), draw(label_values))
                for limit in draw(st.lists(st.sampled_from(LIMITS), max_size=4, unique=True))
            ),
            draw(st.sampled_from([None, *BINDING_CHOICES])),
            tuple(draw(st.lists(st.sampled_from(LIMITS), max_size=2, unique=True))),
        ),
        **gauges,
    )


@st.composite
def target_signals(draw: st.DrawFn) -> TargetSignals:
    return TargetSignals(
        target=draw(label_values),
        url="http://x",
        t=0.0,
        up=draw(st.booleans()),
        error=None,
        series=tuple(draw(st.lists(series_signals(), max_size=2))),
        total=draw(series_signals()),
        scrape_seconds=draw(numbers),
        extra_labels=draw(st.dictionaries(label_names, label_values, max_size=3)),
        errors_total=draw(st.dictionaries(label_values, st.integers(0, 10**6), max_size=2)),
        window_resets_total=draw(st.dictionaries(st.just("engine_changed"), st.integers(0, 9))),
    )
