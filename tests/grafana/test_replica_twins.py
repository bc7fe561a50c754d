"""The replica count's rules give the exporter's count for a model of two data-parallel
engines, with no server.

One vLLM target serves the model `tiny` from two engines (vLLM's `engine` label, one
scheduler each: two replicas). Each case scripts what both engines do, phase by phase; the
payloads, one a scrape with both engines' series, go two ways, as in test_rule_twins.py:
into the exporter's evaluation and its replica count (`ReplicaPlanner`, the count before it
is held), and as the input series of a `promtool test rules` file, into the recording rules
with the target's constants and the replica bounds `batchscope-rules` writes. The file
expects every line of `MODEL_TWINS`, and each engine's demand and capacity, at every scrape
from the first whole window on: the exporter's number, or no series where it has none.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest
import yaml

from batchscope.exporter.alerts.fleet_rules import fleet_rule_groups
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import TargetIdentity, TargetSignals, evaluate_window
from batchscope.exporter.core.replicas import ModelCount
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines import read_series
from batchscope.exporter.scrape.loop import signal_settings
from batchscope.exporter.serve.replica_plan import ReplicaPlanner
from batchscope.grafana import replica_rules
from batchscope.grafana.build import rule_yaml
from batchscope.grafana.config import CONFIG
from batchscope.grafana.rules import vllm_recording_rules
from batchscope.grafana.twins import MODEL_TWINS, TWINS
from tests.support.promtool_series import input_series, series_text
from tests.support.system_tools import tool
from tests.support.vllm_payload import VllmState, render_engines

SCRAPE = 16.0
WINDOW = 64.0
HOLD = 32.0
SCRAPES_A_PHASE = 8
# A request cap of 8; a budget, so that each replica keeps headroom for its queue.
TARGET = Target("llm", "http://vllm:8000/metrics", engine="vllm", cap=8, budget_seconds=2.0)
SCRAPED_AS = {"job": "vllm", "instance": "vllm:8000", "target": TARGET.name}
MODEL = "tiny"
ENGINES = ("0", "1")
# Each engine's demand and capacity, recorded per engine.
ENGINE_TWINS = tuple(t for t in TWINS if t.record in (replica_rules.DEMAND, replica_rules.CAPACITY))


@dataclass(frozen=True)
class Load:
    """What one engine does at each scrape of a phase: requests running, requests finished
    since the scrape before (each after 1 s), requests waiting (None: as the phase before
    left them) and their change since the scrape before."""

    running: float = 0.0
    finished: int = 0
    waiting: float | None = None
    queued: float = 0.0


IDLE = Load()


@dataclass(frozen=True)
class Case:
    """Phases of (engine 0's load, engine 1's), and the replica bounds of the fleet file:
    `models:` (model, min_replicas, max_replicas) and the fleet's max_replicas."""

    phases: tuple[tuple[Load, Load], ...]
    models: tuple[tuple[str, int | None, int | None], ...] = ()
    max_replicas: int | None = None

    @property
    def settings(self) -> Settings:
        return Settings(
            targets=(TARGET,),
            window_seconds=WINDOW,
            hold_seconds=HOLD,
            models=self.models,
            max_replicas=self.max_replicas,
        )


# Engine 0 runs its cap with 32 waiting, then its queue grows by 512 a scrape (32/s), then
# drains by 32 a scrape; 256 finish a scrape (16/s) throughout. Engine 1 runs nothing.
ROUTED = Case(
    (
        (Load(8, 256, waiting=32), IDLE),
        (Load(8, 256, queued=512), IDLE),
        (Load(8, 256, queued=-32), IDLE),
    ),
)
# Both engines run half their cap with nothing waiting, 64 finishing a scrape; then
# nothing runs, waits or finishes. The model's minimum is 3.
IDLED = Case(((Load(4, 64), Load(4, 64)), (IDLE, IDLE)), models=((MODEL, 3, None),))
# Both engines run their cap, their queues growing by 512 a scrape: demand needs more than
# the model's maximum (3), or the fleet's (4).
GROWING = (
    (Load(8, 256, waiting=32), Load(8, 256, waiting=32)),
    (Load(8, 256, queued=512), Load(8, 256, queued=512)),
)
CASES = {
    "routed": ROUTED,
    "idle": IDLED,
    "model max": Case(GROWING, models=((MODEL, None, 3),)),
    "fleet max": Case(GROWING, max_replicas=4),
}


def payloads(case: Case) -> list[tuple[float, str]]:
    """(time, payload) of every scrape, phase after phase; counters carry over."""
    states = [VllmState(engine=engine) for engine in ENGINES]
    scrapes = []
    for index, phase in enumerate(case.phases):
        for step in range(SCRAPES_A_PHASE):
            t = (index * SCRAPES_A_PHASE + step) * SCRAPE
            for state, load in zip(states, phase, strict=True):
                state.running = load.running
                state.kv_usage = load.running / 16
                if step == 0 and load.waiting is not None:
                    state.waiting = load.waiting
                if t > 0:
                    state.waiting += load.queued
                    state.finish(load.finished, 1.0, 40)
            scrapes.append((t, render_engines(states)))
    return scrapes


def exporter_counts(case: Case, scrapes) -> dict[float, tuple[TargetSignals, ModelCount]]:
    """The target's signals and the model's count (before it is held) after each scrape."""
    settings = case.settings
    window = Window(settings.window_seconds, signal_settings(TARGET, settings))
    identity = TargetIdentity(TARGET.name, TARGET.url)
    planner = ReplicaPlanner(settings)
    saturation: dict = {}
    out = {}
    for t, text in scrapes:
        window.add(Snapshot(TARGET.name, t, True, read_series(text)))
        evaluated, saturation = evaluate_window(identity, window, saturation, t)
        (model,) = planner.step([evaluated], settings.targets, t)
        out[t] = evaluated, model.count
    return out


def compared_instants(case: Case) -> list[float]:
    """Every scrape from the first whole window on."""
    scrapes = len(case.phases) * SCRAPES_A_PHASE
    return [i * SCRAPE for i in range(int(WINDOW / SCRAPE), scrapes)]


def expectation(record: str, labels: dict, at: float, value, rel_tol: float) -> dict:
    """The promtool check that `record` (of `labels`) reads `value` at `at`: exactly, or
    within `rel_tol` (as a 1), or (None) that it has no series."""
    selector = series_text(record, {k: v for k, v in labels.items() if k != "model_name"})
    if value is None:
        expr, samples = selector, []
    elif rel_tol:
        expr = f"abs({selector} - {value!r}) <= bool {rel_tol * abs(value)!r}"
        samples = [{"labels": series_text("", labels), "value": 1.0}]
    else:
        expr, samples = selector, [{"labels": series_text(record, labels), "value": value}]
    return {"expr": expr, "eval_time": f"{at:g}s", "exp_samples": samples}


def checks(case: Case, counts) -> list[dict]:
    """Every model twin and engine twin at every compared instant; a twin the exporter
    reads at the batch's peak only where the batch held still."""
    out = []
    for at in compared_instants(case):
        signals, count = counts[at]
        still = {s.labels["engine"]: s.running_peak == s.running for s in signals.series}
        for twin in MODEL_TWINS:
            if not twin.peak or all(still.values()):
                value = twin.read(count)
                out.append(expectation(twin.record, {"model_name": MODEL}, at, value, twin.rel_tol))
        for s in signals.series:
            labels = {"model_name": MODEL, "engine": s.labels["engine"], "target": TARGET.name}
            for twin in ENGINE_TWINS:
                if not twin.peak or still[labels["engine"]]:
                    out.append(expectation(twin.record, labels, at, twin.read(s), twin.rel_tol))
    return out


def promtool_test(case: Case, expected: list[dict], tmp_path) -> subprocess.CompletedProcess:
    """`promtool test rules` of the rules and the case's bounds on its series, expecting
    `expected` (`checks`)."""
    scrapes = payloads(case)
    config = {**CONFIG, "window": f"{WINDOW:g}s", "saturation_hold_seconds": HOLD}
    files = {
        "targets.yml": rule_yaml(fleet_rule_groups([TARGET], case.settings)),
        "vllm-rules.yml": rule_yaml(vllm_recording_rules(config)),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    test = {
        "rule_files": [str(tmp_path / name) for name in files],
        "evaluation_interval": f"{SCRAPE:g}s",
        "tests": [
            {
                "interval": f"{SCRAPE:g}s",
                "input_series": input_series(scrapes, SCRAPED_AS),
                "promql_expr_test": expected,
            }
        ],
    }
    path = tmp_path / "replica-twins.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    return subprocess.run(
        [tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True
    )


def settled(case: Case, counts) -> list[list[ModelCount]]:
    """The exporter's counts at the last four scrapes of each phase (its window inside it)."""
    ends = [(index + 1) * SCRAPES_A_PHASE * SCRAPE for index in range(len(case.phases))]
    return [[counts[end - k * SCRAPE][1] for k in (4, 3, 2, 1)] for end in ends]


def test_a_queue_beside_an_idle_engine_is_routing_and_never_more_than_now() -> None:
    counts = exporter_counts(ROUTED, payloads(ROUTED))
    steady, growing, draining = settled(ROUTED, counts)
    # 16/s asked over 14.47/s a replica serves within the budget (16/s at the cap, 90.4%
    # headroom): 2 needed; the queue growing, 48/s: 4 needed, never more than the 2 there
    # are; draining, 14/s: 1.
    assert [(c.demand, c.needed, c.count) for c in steady] == [(16.0, 2, 2)] * 4
    assert [(c.demand, c.needed, c.count) for c in growing] == [(48.0, 4, 2)] * 4
    assert [(c.demand, c.needed, c.count) for c in draining] == [(14.0, 1, 1)] * 4
    assert steady[0].capacity == pytest.approx(14.465, abs=1e-3)
    models = [counts[at][1] for at in compared_instants(ROUTED)]
    assert {c.state for c in models} == {"routing"}
    assert max(c.count for c in models) == 2
    assert counts[compared_instants(ROUTED)[-1]][0].total.diagnosis.state == "routing"


def test_an_idle_model_is_counted_at_its_own_minimum() -> None:
    counts = exporter_counts(IDLED, payloads(IDLED))
    busy, idle = settled(IDLED, counts)
    # 8/s asked over 5.70/s a replica serves: 2, at most the 2 there are, raised to 3.
    assert [(c.state, c.needed, c.count) for c in busy] == [("scale_up", 2, 3)] * 4
    assert [(c.state, c.needed, c.count) for c in idle] == [("idle", None, 3)] * 4


@pytest.mark.parametrize(("name", "most"), [("model max", 3), ("fleet max", 4)])
def test_a_count_past_the_maximum_is_the_maximum(name: str, most: int) -> None:
    case = CASES[name]
    growing = settled(case, exporter_counts(case, payloads(case)))[-1]
    # 96/s asked over 14.47/s a replica serves: 7 needed.
    assert [(c.state, c.demand, c.needed, c.count) for c in growing] == [
        ("scale_up", 96.0, 7, most)
    ] * 4


# Each case's count: at how many scrapes it is compared, and the values it takes there. Every
# scrape from the first whole window on, but the idle case's two after its engines stop,
# where the exporter reads the batch at its peak (4) and the rules at the instant (0).
COMPARED = [
    ("routed", 20, {1, 2}),
    ("idle", 10, {3}),
    ("model max", 12, {3}),
    ("fleet max", 12, {3, 4}),
]


@pytest.mark.parametrize(("name", "compared", "seen"), COMPARED)
def test_the_rules_count_what_the_exporter_counts(
    name: str, compared: int, seen: set, tmp_path
) -> None:
    case = CASES[name]
    expected = checks(case, exporter_counts(case, payloads(case)))
    counted = [c for c in expected if c["expr"].startswith(replica_rules.MODEL_COUNT)]
    assert len(counted) == compared
    assert {c["exp_samples"][0]["value"] for c in counted} == seen
    done = promtool_test(case, expected, tmp_path)
    assert done.returncode == 0, f"{tmp_path}:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    assert "SUCCESS" in done.stdout
