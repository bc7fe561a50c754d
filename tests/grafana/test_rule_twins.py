"""The recording rules give the exporter's numbers on the same series, with no server.

A scripted vLLM 0.32 target (tests/support/vllm_payload.py) goes through seven phases, each
a state the diagnosis names. Its payloads, one a scrape, go two ways: into the exporter's
pure evaluation (`Window`, `evaluate_window`), and, as the input series of a generated
`promtool test rules` file, into the recording rules of grafana/prometheus/vllm-rules.yml
(with the target's constants of `batchscope-rules`). The file expects, for every line of
`batchscope.grafana.twins.TWINS`, at every scrape from the first whole window on, the
exporter's number; for a twin the exporter judges on the recent peak of the batch, where
the batch held still.

To the last bit, but for the interpolation inside a quantile's bucket (`rel_tol`): the
window (64 s) is a power of two, so a rate is the exporter's increase scaled by a power of
two on both sides. A difference is a difference in the computation, phase changes, the
hold and the SLO windows included.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from batchscope.exporter.alerts.fleet_rules import fleet_rule_groups
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import SeriesSignals, TargetIdentity, evaluate_window
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines import read_series
from batchscope.exporter.scrape.loop import signal_settings
from batchscope.grafana.build import rule_yaml
from batchscope.grafana.config import CONFIG
from batchscope.grafana.rules import BINDING_LIMITS, vllm_recording_rules
from batchscope.grafana.twins import TWINS, Twin
from tests.support.promtool_series import input_series, series_text
from tests.support.system_tools import tool
from tests.support.vllm_payload import VllmState, render

SCRAPE = 16.0
WINDOW = 64.0
HOLD = 32.0
SCRAPES_A_PHASE = 12
# Offsets into a phase where the exporter's window, its last three scrapes and the hold
# all lie inside it: where each phase reads as its name.
SETTLED = (112.0, 128.0, 144.0, 160.0, 176.0)
TARGET = Target(
    "llm",
    "http://vllm:8000/metrics",
    engine="vllm",
    cap=16,
    budget_seconds=2.0,  # a bucket edge of vLLM's e2e histogram: attainment is exact
    max_num_batched_tokens=512,
    slo_objective=0.99,
)
# The standard 5-minute SLO window becomes the 64 s window.
SLO_SCALE = WINDOW / 300
SCRAPED_AS = {"job": "vllm", "instance": "vllm:8000", "target": TARGET.name}


@dataclass(frozen=True)
class Phase:
    """What the target does at each scrape of a phase: its gauges, and requests finished,
    preemptions and engine steps since the scrape before."""

    name: str
    running: float
    waiting: float
    kv: float
    # (requests, e2e latency, output tokens) finished per scrape
    finished: tuple[tuple[int, float, int], ...] = ()
    preemptions: float = 0.0
    steps: float = 0.0
    tokens_per_step: float = 0.0
    deferred: float | None = None
    # Shares of the prompt tokens the prefix cache held and of the draft tokens accepted.
    cached: float = 0.0
    accepted: float = 0.0


# Prompt tokens looked up in the prefix cache and draft tokens proposed, per scrape.
PROMPT_TOKENS, DRAFT_TOKENS = 1024.0, 256.0
# 4 requests a second, 64 a scrape: 48 at 0.4 s and 16 at 0.9 s, so the window's p99
# bucket, (0.8, 1.0], holds 64; p99 0.992 s, half the budget.
CALM = ((48, 0.4, 40), (16, 0.9, 150))
# Over the budget: the window's p99 bucket, (2.0, 2.5], holds 64 of 256; p99 2.48 s
# (1.24 of the budget), 75% of requests within 2 s.
SLOW = ((32, 1.2, 40), (16, 1.9, 150), (16, 2.3, 150))
PHASES = (
    Phase(
        "underloaded", 12, 0, 0.5, CALM, steps=800, tokens_per_step=400, cached=0.25, accepted=0.5
    ),
    Phase("stalled", 2, 10, 0.3),
    Phase("memory_bound", 9, 20, 0.95, CALM, 8, 800, 480, cached=0.5, accepted=0.75),
    Phase("token_budget_bound", 9, 20, 0.5, CALM, steps=800, tokens_per_step=496, cached=0.125),
    Phase("deferred", 9, 20, 0.5, CALM, steps=800, tokens_per_step=400, deferred=12, accepted=0.25),
    Phase("budget_saturated", 16, 20, 0.5, SLOW, steps=800, tokens_per_step=400, cached=0.0625),
    Phase("underloaded again", 12, 0, 0.5, CALM, steps=800, tokens_per_step=400, accepted=0.875),
)


def payloads() -> Iterator[tuple[float, str]]:
    """(time, payload) of every scrape, phase after phase; counters carry over."""
    state = VllmState(prefix_queries=0.0, draft_tokens=0.0, inference_share=0.8)
    for index, phase in enumerate(PHASES):
        for step in range(SCRAPES_A_PHASE):
            t = (index * SCRAPES_A_PHASE + step) * SCRAPE
            if t > 0:
                for n, latency, tokens in phase.finished:
                    state.finish(n, latency, tokens)
                state.preemptions += phase.preemptions
                state.steps += phase.steps
                state.step_tokens += phase.steps * phase.tokens_per_step
                if phase.finished:  # a phase that finishes nothing looks nothing up
                    state.prefix_queries += PROMPT_TOKENS
                    state.prefix_hits += PROMPT_TOKENS * phase.cached
                    state.draft_tokens += DRAFT_TOKENS
                    state.accepted_tokens += DRAFT_TOKENS * phase.accepted
            state.running, state.waiting, state.kv_usage = phase.running, phase.waiting, phase.kv
            state.deferred = phase.deferred
            yield t, render(state)


def settled_instants() -> list[float]:
    start = SCRAPE * SCRAPES_A_PHASE
    return [index * start + offset for index in range(len(PHASES)) for offset in SETTLED]


def compared_instants() -> list[float]:
    """Every scrape from the first whole window on."""
    return [i * SCRAPE for i in range(int(WINDOW / SCRAPE), len(PHASES) * SCRAPES_A_PHASE)]


def exporter_signals(scrapes: list[tuple[float, str]]) -> dict[float, SeriesSignals]:
    """The exporter's signals of the target's one engine series after each scrape."""
    settings = Settings(
        targets=(TARGET,), window_seconds=WINDOW, hold_seconds=HOLD, slo_window_scale=SLO_SCALE
    )
    window = Window(settings.window_seconds, signal_settings(TARGET, settings))
    identity = TargetIdentity(TARGET.name, TARGET.url)
    saturation: dict = {}
    signals = {}
    for t, text in scrapes:
        window.add(Snapshot(TARGET.name, t, True, read_series(text)))
        evaluated, saturation = evaluate_window(identity, window, saturation, t)
        (signals[t],) = evaluated.series
    return signals


def expectation(twin: Twin, at: float, value: float) -> dict:
    """The promtool check that `twin`'s recorded series reads `value` at `at`: exactly, or
    (`rel_tol`) as a 1 where it is that close."""
    where = {} if twin.model_level else {"target": TARGET.name}
    selector = series_text(twin.record, {**where, **twin.labels})
    labels = {"model_name": "tiny", **({} if twin.model_level else {"engine": "0", **where})}
    labels |= {k: v for k, v in twin.labels.items() if v}
    if twin.rel_tol:
        expr = f"abs({selector} - {value!r}) <= bool {twin.rel_tol * abs(value)!r}"
        expected = {"labels": series_text("", labels), "value": 1.0}
    else:
        expr, expected = selector, {"labels": series_text(twin.record, labels), "value": value}
    return {"expr": expr, "eval_time": f"{at:g}s", "exp_samples": [expected]}


def rule_test(scrapes, signals, rule_files: list[str]) -> tuple[dict, dict[str, list[float]]]:
    """The promtool test file, and the exporter's numbers it expects, by twin."""
    checks, expected = [], {}
    for twin in TWINS:
        seen = expected.setdefault(twin.exported, [])
        for at in compared_instants():
            if twin.peak and signals[at].running_peak != signals[at].running:
                continue
            value = twin.read(signals[at])
            if value is not None:
                checks.append(expectation(twin, at, value))
                seen.append(value)
    test = {
        "rule_files": rule_files,
        "evaluation_interval": f"{SCRAPE:g}s",
        "tests": [
            {
                "interval": f"{SCRAPE:g}s",
                "input_series": input_series(scrapes, SCRAPED_AS),
                "promql_expr_test": checks,
            }
        ],
    }
    return test, expected


@pytest.fixture(scope="module")
def scripted() -> tuple[list[tuple[float, str]], dict[float, SeriesSignals]]:
    scrapes = list(payloads())
    return scrapes, exporter_signals(scrapes)


def test_the_script_shows_each_phase_to_the_exporter(scripted) -> None:
    _, signals = scripted
    states = [signals[at].diagnosis.state for at in settled_instants()]
    per_phase = [states[i : i + len(SETTLED)] for i in range(0, len(states), len(SETTLED))]
    assert [set(s) for s in per_phase] == [
        {"underloaded"},
        {"stalled"},
        {"memory_bound"},
        {"token_budget_bound"},
        {"batch_limited"},  # below the cap, deferred requests holding it
        {"budget_saturated"},
        {"underloaded"},
    ]
    bindings = [signals[at].limits.binding for at in settled_instants()[:: len(SETTLED)]]
    assert bindings == [
        "arrivals",
        "unexplained",
        "kv_cache",
        "token_budget",
        "deferred",
        "requests",
        "arrivals",
    ]
    calm, saturated = (signals[settled_instants()[len(SETTLED) * i]] for i in (0, 5))
    assert calm.budget_utilization == pytest.approx(0.992 / 2.0)
    assert saturated.budget_utilization == pytest.approx(2.48 / 2.0)
    # 3 of 4 requests a second within the 2 s budget: goodput 3/s, 25% missed of 1% allowed
    assert saturated.slo_attainment.share.estimate == 0.75
    assert saturated.goodput_per_second.estimate == 3.0
    assert saturated.slo.rate("5m") == pytest.approx(25.0)


def test_every_recorded_twin_equals_the_exporter_on_the_scripted_series(scripted, tmp_path) -> None:
    scrapes, signals = scripted
    config = {
        **CONFIG,
        "window": f"{WINDOW:g}s",
        "saturation_hold_seconds": HOLD,
        "slo_window_scale": SLO_SCALE,
    }
    files = {
        "targets.yml": rule_yaml(fleet_rule_groups([TARGET])),
        "vllm-rules.yml": rule_yaml(vllm_recording_rules(config)),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    test, expected = rule_test(scrapes, signals, [str(tmp_path / name) for name in files])
    # Every twin is compared, each state, binding limit and the saturation both held and not.
    for exported, values in expected.items():
        assert len(values) >= len(SETTLED), f"{exported}: compared {len(values)} times"
    states = [twin.exported for twin in TWINS if twin.exported.startswith("batchscope_diagnosis")]
    for exported in (*states, "batchscope_budget_saturated"):
        assert set(expected[exported]) == {0.0, 1.0}, exported
    for limit in BINDING_LIMITS:
        assert set(expected[f'batchscope_binding_limit{{limit="{limit}"}}']) == {0.0, 1.0}
    path = tmp_path / "twins.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    done = subprocess.run(
        [tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"{path}:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    assert "SUCCESS" in done.stdout
