"""The scripted vLLM run that holds a rule engine's signals to the exporter's.

A scripted vLLM 0.32 payload (tests/support/vllm_payload.py) is served from a local HTTP
target. The exporter scrapes it every second; the rule engine under test (Prometheus, or
VictoriaMetrics with vmalert) scrapes both the target, evaluating the recording rules of
grafana/prometheus/ (window and hold shortened for the test exactly as a user would set
them), and the exporter. Each signal is then read from the engine at the same instants,
as the rule computed it and as the exporter exported it, and compared.

The script, three PHASE (40 s) phases: calm (4 req/s, p99 0.99 s of a 2 s budget, 12 of 16
running, nothing waits, steps at 400 of a 512-token budget: arrivals bind); memory-bound
(9 of 16 running, 20 waiting, KV 95%, 0.5 preemptions/s, same latency, steps at 480
tokens: the KV cache binds, not the budget); saturated (the same, with p99 1.99 s:
saturated once held 5 s, and then the diagnosis says budget_saturated, not memory_bound).
Counters grow linearly within a phase, so any two samplers see the same slopes.

The same payload is scraped again as a second target, `llm-slo`, held to an SLO: 90% of
requests within 1.2 s, between the e2e histogram's edges at 1.0 and 1.5 s (the `llm`
target promises 99% within 2 s, an edge: exact). Its attainment, goodput and 5-minute
burn rate (the SLO windows scaled to a twentieth: 5 minutes is the 15 s window) are
compared too: attainment 1, goodput 4/s and a burn of 0 until the saturated phase, then
(its 4 requests a second at 1.2 and 1.9 s: none within 1.0 s, 2 within 1.5 s, the budget
40% of the way) 20%, bounded by 0 and 50%, 0.8/s, and a burn of 8.

Compared: instants where both windows lie inside one phase (gauges a few seconds after a
switch, states after the hold too) and the engine's window holds every scrape: on this
shared 2-core machine a scrape is now and then late by seconds, which is the scheduler,
not the rule. Each engine's test states its tolerance and why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from batchscope.exporter.alerts.fleet_rules import fleet_rule_groups
from batchscope.exporter.config.settings import Target
from batchscope.grafana import rules
from batchscope.grafana.build import rule_yaml
from batchscope.grafana.config import CONFIG
from tests.support.monitoring_stack import Process, exporter, payload_server, query, query_range
from tests.support.network import wait_until
from tests.support.vllm_payload import VllmState, render

WINDOW = 15.0
HOLD = 5.0
PHASE = 40.0  # long enough for 12+ comparable instants of a state on a loaded machine
RUN = 3 * PHASE
CAP, BUDGET = 16, 2.0
TOKEN_BUDGET = 512
SCRAPE = 1.0
# The longest gap between two scrapes a compared window may hold.
MAX_GAP = 1.5 * SCRAPE
SELECT = 'target="llm", model_name="tiny", engine="0"'
SLO_SELECT = 'target="llm-slo", model_name="tiny", engine="0"'
# The rules' series of `llm` (the engine scrapes the server as both targets).
LLM = '{target="llm"}'
SLO_BUDGET, SLO_OBJECTIVE = 1.2, 0.9
SLO_SCALE = WINDOW / 300  # the standard 5-minute window becomes the 15 s window
# llm-slo's SLO signals as the rules record them.
SLO_ATTAINED = f'{rules.SLO_ATTAINMENT}{{target="llm-slo", window=""}}'
SLO_GOODPUT = f'{rules.SLO_WITHIN}{{target="llm-slo", window=""}}'
SLO_BURN_5M = f'{rules.SLO_BURN_RATE}{{target="llm-slo", window="5m"}}'
# The rules' settings for the test, as a user shortening the window and hold would set them.
CONFIG_UNDER_TEST = {
    **CONFIG,
    "window": f"{WINDOW:g}s",
    "saturation_hold_seconds": HOLD,
    "slo_window_scale": SLO_SCALE,
}


def state_at(t: float) -> VllmState:
    """The scripted server's state t seconds after it started."""
    calm = min(t, 2 * PHASE)
    pressed, saturated = max(0.0, t - PHASE), max(0.0, t - 2 * PHASE)
    state = VllmState()
    state.finish(3 * calm, 0.4, 40)  # p99 = 0.8 + 0.2 * (0.99 * 4 - 3) = 0.992 s
    state.finish(1 * calm, 0.9, 150)
    state.finish(2 * saturated, 1.2, 40)  # p99 = 1.5 + 0.5 * (0.99 * 4 - 2) / 2 = 1.99 s
    state.finish(2 * saturated, 1.9, 300)
    state.preemptions = 0.5 * pressed
    # 50 engine steps a second, of 400 tokens while calm and 480 (94% of the token budget)
    # under pressure: the KV cache, not the budget, binds there (first match).
    state.steps = 50 * t
    state.step_tokens = 50 * (400 * min(t, PHASE) + 480 * max(0.0, t - PHASE))
    if pressed:
        state.running, state.waiting, state.kv_usage = 9, 20, 0.95
    else:
        state.running, state.waiting, state.kv_usage = 12, 0, 0.5
    return state


# Seconds after a phase switch before a signal is comparable: a gauge's next scrapes, a
# rate's window, a state's window and hold.
# Two chained scrapes (target -> exporter -> engine, 1 s each) can each run late on a
# loaded machine: 4 s, not 2 (a run under load read the old phase at +2 s).
SETTLE = {"gauge": 4.0, "rate": WINDOW + 4, "state": WINDOW + HOLD + 4}


# (signal, the exporter's series, the rule's series, when it is comparable: "rate" needs a
# window inside one phase, "gauge" one settling second)
PAIRS = [
    ("running", f"batchscope_running_requests{{{SELECT}}}", rules.RUNNING + LLM, "gauge"),
    ("waiting", f"batchscope_waiting_requests{{{SELECT}}}", rules.WAITING + LLM, "gauge"),
    (
        "running_vs_cap",
        f"batchscope_running_vs_cap_ratio{{{SELECT}}}",
        rules.RUNNING_VS_CAP + LLM,
        "gauge",
    ),
    (
        "kv_cache_usage",
        f"batchscope_kv_cache_usage_ratio{{{SELECT}}}",
        rules.KV_USAGE + LLM,
        "gauge",
    ),
    (
        "preemptions_per_second",
        f"batchscope_preemptions_per_second{{{SELECT}}}",
        rules.PREEMPTIONS + LLM,
        "rate",
    ),
    (
        "requests_per_second",
        f"batchscope_requests_per_second{{{SELECT}}}",
        rules.REQUESTS + LLM,
        "rate",
    ),
    (
        "generation_tokens_per_second",
        f"batchscope_generation_tokens_per_second{{{SELECT}}}",
        rules.GENERATION_TOKENS + LLM,
        "rate",
    ),
    (
        "latency_p99_e2e",
        f"batchscope_latency_seconds{{{SELECT}}}",
        f'{rules.LATENCY}{{target="llm", quantile="0.99", histogram="e2e"}}',
        "rate",
    ),
    (
        "budget_utilization",
        f"batchscope_budget_utilization_ratio{{{SELECT}}}",
        rules.BUDGET_UTILIZATION + LLM,
        "rate",
    ),
    (
        "memory_bound",
        f'batchscope_diagnosis{{{SELECT}, state="memory_bound"}}',
        rules.MEMORY_BOUND_RULE + LLM,
        "state",
    ),
    (
        "token_budget_ratio",
        f'batchscope_limit_ratio{{{SELECT}, limit="token_budget"}}',
        rules.TOKEN_BUDGET_RATIO + LLM,
        "rate",
    ),
    *(
        (
            f"binding_{limit}",
            f'batchscope_binding_limit{{{SELECT}, limit="{limit}"}}',
            f'{rules.BINDING_LIMIT}{{target="llm", limit="{limit}"}}',
            "state",
        )
        for limit in ("arrivals", "kv_cache", "token_budget", "requests", "deferred", "unexplained")
    ),
    (
        "slo_attainment_exact",
        f'batchscope_slo_attainment_ratio{{{SELECT}, bound="estimate"}}',
        f'{rules.SLO_ATTAINMENT}{{target="llm", window=""}}',
        "rate",
    ),
    (
        "slo_attainment_between_edges",
        f'batchscope_slo_attainment_ratio{{{SLO_SELECT}, bound="estimate"}}',
        SLO_ATTAINED,
        "rate",
    ),
    (
        "goodput",
        f'batchscope_goodput_requests_per_second{{{SLO_SELECT}, bound="estimate"}}',
        SLO_GOODPUT,
        "rate",
    ),
    (
        "slo_burn_rate_5m",
        f'batchscope_slo_burn_rate_ratio{{{SLO_SELECT}, window="5m"}}',
        SLO_BURN_5M,
        "rate",
    ),
]


def comparable(t: float, kind: str, start: float, scrapes: list[float], lag: float = 0.0) -> bool:
    """Far enough into its phase (and `lag` more, the engine's delay in reading a recorded
    series back), and past the engine's first scrape, that both windows hold only that
    phase, with no scrape missing from the engine's window. (Over a series younger than
    its range, rate() divides by the whole range, the exporter by the span it has; a scrape
    the loaded machine delayed past the window's edge changes a rate by up to an interval.)"""
    since = t - start
    phase_start = max(start + since // PHASE * PHASE, scrapes[0])
    if since >= RUN or t - phase_start < SETTLE[kind] + lag:
        return False
    # The rule ran up to one evaluation before t, over the WINDOW before that.
    seen = [s for s in scrapes if t - WINDOW - 2 * SCRAPE - lag <= s <= t]
    return all(b - a <= MAX_GAP for a, b in zip(seen, seen[1:], strict=False))


def scripted_targets(url: str) -> list[Target]:
    """The scripted server twice: `llm`, and `llm-slo` judged against a budget between
    two bucket edges."""
    common = {"engine": "vllm", "cap": CAP, "max_num_batched_tokens": TOKEN_BUDGET}
    return [
        Target("llm", url, budget_seconds=BUDGET, slo_objective=0.99, **common),
        Target("llm-slo", url, budget_seconds=SLO_BUDGET, slo_objective=SLO_OBJECTIVE, **common),
    ]


def fleet_file(path: Path, targets: list[Target]) -> Path:
    """The exporter's config for these targets, 1 s scrapes, the test's window, hold and
    SLO window scale."""
    keys = ("name", "url", "engine", "cap", "max_num_batched_tokens", "budget_seconds")
    fleet = {
        "interval_seconds": 1,
        "window_seconds": WINDOW,
        "hold_seconds": HOLD,
        "slo_window_scale": SLO_SCALE,
        "targets": [
            {**{key: getattr(t, key) for key in keys}, "slo_objective": t.slo_objective}
            for t in targets
        ],
    }
    path.write_text(yaml.safe_dump(fleet))
    return path


@contextmanager
def scripted_run(workdir: Path) -> Iterator[tuple[float, list[Target], Process]]:
    """The scripted server, started now, and the exporter reading it as both targets:
    yields the start time, the targets and the exporter."""
    started = time.time()
    with payload_server(lambda: render(state_at(time.time() - started))) as url:
        targets = scripted_targets(url)
        fleet = fleet_file(workdir / "fleet.yaml", targets)
        with exporter(workdir, "--config", str(fleet)) as exp:
            yield started, targets, exp


def wait_for_the_run(started: float) -> None:
    end = started + RUN
    wait_until(lambda: time.time() > end, end - time.time() + 30, "the scripted run")


def scrape_jobs(targets: list[Target], exporter: Process) -> list[dict]:
    """The engine's jobs: the scripted server once per target, labelled with its name
    (the label the rules' constants join on), and the exporter."""
    address = targets[0].url.split("/")[2]
    return [
        *(
            {
                "job_name": f"vllm-{t.name}",
                "static_configs": [{"targets": [address], "labels": {"target": t.name}}],
            }
            for t in targets
        ),
        {
            "job_name": "batchscope-exporter",
            "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
        },
    ]


def rule_files(targets: list[Target]) -> dict[str, str]:
    """The targets' constants and the recording rules, as files (name -> text)."""
    return {
        "targets.yml": rule_yaml(fleet_rule_groups(targets)),
        "vllm-rules.yml": rule_yaml(rules.vllm_recording_rules(CONFIG_UNDER_TEST)),
    }


def scrape_times(engine: Process, end: float) -> list[float]:
    """When the engine scraped the server as `llm`, through the run."""
    [raw] = query(engine, f'vllm:num_requests_running{{target="llm"}}[{RUN + 30:.0f}s]', end)
    return [float(t) for t, _ in raw["values"]]


def compare_signals(
    engine: Process,
    started: float,
    tolerance: Mapping[str, float],
    lag: Mapping[str, float] | None = None,
    near_zero: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """Each PAIRS signal, as the exporter exported it and as the rule recorded it, at every
    comparable instant: equal within `tolerance[kind]` (relative), plus 0.001 near zero
    (`near_zero` by signal where another), `lag` seconds by signal (none where not given)
    past a phase's settling time. Returns the worst relative difference of each, for the
    log."""
    lag, near_zero = lag or {}, near_zero or {}
    end = started + RUN
    scrapes = scrape_times(engine, end)
    differences = {}
    for signal, exported, recorded, kind in PAIRS:
        ours = query_range(engine, exported, started, end)
        theirs = query_range(engine, recorded, started, end)
        times = [
            t
            for t in sorted(set(ours) & set(theirs))
            if comparable(t, kind, started, scrapes, lag.get(signal, 0.0))
        ]
        assert len(times) >= 12, f"{signal}: only {len(times)} comparable instants"
        worst = 0.0
        for t in times:
            a, b = ours[t], theirs[t]
            floor = near_zero.get(signal, 1e-3)
            assert abs(a - b) <= tolerance[kind] * max(abs(a), abs(b)) + floor, (
                f"{signal} at +{t - started:.0f} s: exporter {a}, rules {b}"
            )
            worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-9))
        absolute = max(abs(ours[t] - theirs[t]) for t in times)
        differences[signal] = f"{worst:.2g} ({absolute:.2g} absolute) over {len(times)} instants"
    return differences


def _at(engine: Process, expr: str, t: float) -> float:
    """The one series of `expr` at `t`, as an instant query reads it."""
    [series] = query(engine, expr, t)
    return float(series["value"][1])


def check_phases(
    engine: Process, started: float, rate_tolerance: float, attainment_abs: float | None = None
) -> None:
    """Saturation and each phase's values, as the script defines them; the SLO attainment
    exact, or within `attainment_abs` where given (and the burn rate within that over the
    error budget, 1 - the objective)."""
    end = started + RUN
    # Saturation: both flag it once held, neither before the saturated phase.
    for series in (f"batchscope_budget_saturated{{{SELECT}}}", rules.BUDGET_SATURATED_RULE + LLM):
        values = query_range(engine, series, started, end)
        assert max(v for t, v in values.items() if t < started + 2 * PHASE) == 0, series
        assert values[max(values)] == 1, series
    for at, utilization, memory_bound, tokens, binding in (
        (PHASE - 1, 0.992, 0, 400, "arrivals"),
        (2 * PHASE - 1, 0.992, 1, 480, "kv_cache"),
        (RUN - 1, 1.99, 0, 480, "kv_cache"),
    ):
        t = round(started + at)
        util = _at(engine, rules.BUDGET_UTILIZATION + LLM, t)
        assert util == pytest.approx(utilization / BUDGET, rel=rate_tolerance)
        assert _at(engine, rules.MEMORY_BOUND_RULE + LLM, t) == memory_bound
        ratio = _at(engine, rules.TOKEN_BUDGET_RATIO + LLM, t)
        assert ratio == pytest.approx(tokens / TOKEN_BUDGET, rel=rate_tolerance)
        bound = _at(engine, f'{rules.BINDING_LIMIT}{{target="llm", limit="{binding}"}}', t)
        assert bound == 1, (at, binding)
    # llm-slo: all 4 requests a second within 1.2 s, then none of 4 within 1.0 s and 2
    # within 1.5 s: 20% interpolated, bounded by 0 and 50%. The ratios as the rules
    # recorded them; goodput, a rate, as the exporter measured it over its scrapes (a
    # late scrape changes rate()'s extrapolation: the comparison above skips those).
    # Before saturation read at the memory-bound phase's end (the latency is the calm
    # phase's): a new engine takes seconds to fill each hop of a chain of recorded series.
    for at, attained, goodput, burn in ((2 * PHASE - 1, 1.0, 4.0, 0.0), (RUN - 1, 0.2, 0.8, 8.0)):
        t = round(started + at)
        if attainment_abs is None:
            attainment, burn_rate = pytest.approx(attained), pytest.approx(burn, abs=1e-9)
        else:
            attainment = pytest.approx(attained, abs=attainment_abs)
            burn_rate = pytest.approx(burn, abs=attainment_abs / (1 - SLO_OBJECTIVE))
        assert _at(engine, SLO_ATTAINED, t) == attainment
        assert _at(engine, SLO_BURN_5M, t) == burn_rate
        measured = f'batchscope_goodput_requests_per_second{{{SLO_SELECT}, bound="estimate"}}'
        assert _at(engine, measured, t) == pytest.approx(goodput, rel=0.01)
    t = round(started + RUN - 1)
    for bound, share in (("lower", 0.0), ("upper", 0.5)):
        exported = f'batchscope_slo_attainment_ratio{{{SLO_SELECT}, bound="{bound}"}}'
        assert _at(engine, exported, t) == pytest.approx(share, rel=1e-9)
