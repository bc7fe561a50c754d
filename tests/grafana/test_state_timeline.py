"""The vLLM board's first-row state timelines mirror the exporter: the Diagnosis shows every
state in first-match order, mapped to the Live page's words and colours, and the binding
limit names the limit that binds; both queries (the exporter's series, the recording
rules') evaluated by promtool to what the exporter gives for the same numbers."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from batchscope.dashboard.states import look
from batchscope.exporter.core.diagnosis import DIAGNOSIS_STATES, DiagnosisInputs, diagnose
from batchscope.exporter.core.limits import BINDING_CHOICES
from batchscope.grafana.boards.vllm_queries import NO_LIMIT
from batchscope.grafana.build import ROOT
from batchscope.grafana.config import CONFIG
from batchscope.grafana.rules import (
    BINDING_LIMIT,
    BINDING_LIMITS,
    BUDGET_SATURATED_RULE,
    BUDGET_UTILIZATION,
    MEMORY_BOUND_RULE,
    PREEMPTIONS,
    RUNNING_VS_CAP,
    STALLED_RULE,
    TOKEN_BUDGET_BOUND_RULE,
    WAITING,
    vllm_recording_rules,
)
from tests.support.system_tools import tool

BOARDS = ("vllm-batching.json", "vllm-batching-rules.json")


def timeline_panel(board: str, title: str = "Diagnosis") -> dict:
    panels = json.loads((ROOT / "dashboards" / board).read_text())["panels"]
    return next(p for p in panels if p["title"] == title)


def timeline_expr(board: str, title: str = "Diagnosis") -> str:
    """The panel's query as Grafana sends it for target t and every model."""
    (query,) = timeline_panel(board, title)["targets"]
    return query["expr"].replace("$target", "t").replace('=~"$model"', '=~".*"')


@pytest.mark.parametrize("board", BOARDS)
def test_every_state_is_mapped_to_its_words_and_colour_in_first_match_order(board) -> None:
    (mapping,) = timeline_panel(board)["fieldConfig"]["defaults"]["mappings"]
    assert mapping["type"] == "value"
    assert mapping["options"] == {
        str(i): {"text": look(state).words, "color": look(state).hex, "index": i}
        for i, state in enumerate(DIAGNOSIS_STATES)
    }
    assert "over budget" in {o["text"] for o in mapping["options"].values()}


def promtool_eval(expr: str, series: dict[str, float], tmp_path) -> dict[str, float]:
    """`expr` at 1 m over constant input series, as promtool evaluates it: the value of
    each result by its model_name."""
    return {
        model: float(value)
        for model, value in re.findall(
            r'model_name="([^"]+)"[^}]*\} ([0-9.E+-]+)', promtool_got(expr, series, tmp_path)
        )
    }


def promtool_got(expr: str, series: dict[str, float], tmp_path) -> str:
    """`expr` at 1 m over constant input series, as promtool evaluates it: its results
    as promtool lists them (`{engine="0", model_name="a", target="t"} 1.1E+01, ...`)."""
    rules = tmp_path / "none.yml"
    rules.write_text("groups: []\n")
    # The expected result is read back from promtool's failure message: one eval that
    # expects nothing, whose "got" lists what the expression gave.
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": f"{v}x5"} for s, v in series.items()],
                "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": []}],
            }
        ],
    }
    path = tmp_path / "timeline.test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True
    )
    # got: {engine="0", model_name="a", target="t"} 1.1E+01, {...} 4E+00
    return (done.stdout + done.stderr).split("got:")[-1].splitlines()[0]


# Each model's numbers, as the rules record them and as `diagnose` reads them.
MODELS = {
    # over budget, nothing waits, a small batch: each request's own time is too long
    "slow": dict(utilization=2.33, waiting=0.0, running=2.0),
    # over budget while requests queue behind a full batch, before the hold
    "queued": dict(utilization=1.4, waiting=12.0, running=8.0),
    # saturated for the hold and memory-bound at once: the saturation comes first
    "saturated": dict(utilization=1.4, waiting=5.0, running=3.0, saturated=1.0, memory=1.0),
    # memory-bound, within the budget
    "memory": dict(utilization=0.5, waiting=5.0, running=3.0, memory=1.0),
    # over budget with a small batch and nothing waiting, but preempting: that first
    "preempting": dict(utilization=2.33, waiting=0.0, running=2.0, preemptions=1.5),
    # saturated while the gauges read no request (requests between scrapes): not idle
    "blind": dict(utilization=2.33, waiting=0.0, running=0.0, saturated=1.0),
}
CAP = 8.0


def _expected(numbers: dict) -> str:
    return diagnose(
        DiagnosisInputs(
            running=numbers["running"],
            waiting=numbers["waiting"],
            cap=CAP,
            kv_usage=0.95 if numbers.get("memory") else 0.2,
            preemptions_per_second=numbers.get("preemptions", 0.0),
            budget_saturated=bool(numbers.get("saturated")),
            budget_utilization=numbers["utilization"],
        )
    ).state


def test_the_rules_timeline_gives_the_state_the_diagnosis_gives(tmp_path) -> None:
    series = {}
    for model, n in MODELS.items():
        labels = f'{{target="t", model_name="{model}", engine="0"}}'
        series[f'{BUDGET_UTILIZATION}{labels[:-1]}, quantile="0.99"}}'] = n["utilization"]
        series[f"{WAITING}{labels}"] = n["waiting"]
        series[f"{RUNNING_VS_CAP}{labels}"] = n["running"] / CAP
        series[f"{BUDGET_SATURATED_RULE}{labels}"] = n.get("saturated", 0.0)
        series[f"{MEMORY_BOUND_RULE}{labels}"] = n.get("memory", 0.0)
        series[f"{STALLED_RULE}{labels}"] = 0.0
        series[f"{TOKEN_BUDGET_BOUND_RULE}{labels}"] = 0.0
        series[f"{PREEMPTIONS}{labels}"] = n.get("preemptions", 0.0)
    got = promtool_eval(timeline_expr("vllm-batching-rules.json"), series, tmp_path)
    expected = {model: _expected(n) for model, n in MODELS.items()}
    assert expected == {
        "slow": "work_too_slow",
        "queued": "over_budget",
        "saturated": "budget_saturated",
        "memory": "memory_bound",
        "preempting": "preempting",
        "blind": "budget_saturated",
    }
    assert {model: DIAGNOSIS_STATES[int(v)] for model, v in got.items()} == expected


def test_the_exporter_timeline_reads_each_models_one_state(tmp_path) -> None:
    current = {"a": "over_budget", "b": "work_too_slow", "c": "healthy", "d": "down"}
    series = {}
    for model, now in current.items():
        # the exporter exports every state of a series it read, 1 for the current one
        states = (now,) if now == "down" else DIAGNOSIS_STATES
        for state in states:
            labels = f'target="t", model_name="{model}", engine="0", state="{state}"'
            series[f"batchscope_diagnosis{{{labels}}}"] = 1.0 if state == now else 0.0
    got = promtool_eval(timeline_expr("vllm-batching.json"), series, tmp_path)
    assert {model: DIAGNOSIS_STATES[int(v)] for model, v in got.items()} == current


def _binding_rows(board: str, series: dict[str, float], tmp_path) -> dict[str, str]:
    """The binding-limit timeline over `series`, each model's row as the limit it names."""
    (mapping,) = timeline_panel(board, "The binding limit")["fieldConfig"]["defaults"]["mappings"]
    got = promtool_eval(timeline_expr(board, "The binding limit"), series, tmp_path)
    return {model: mapping["options"][str(int(value))]["text"] for model, value in got.items()}


@pytest.mark.parametrize("board", BOARDS)
def test_every_binding_limit_is_mapped_to_its_name_with_none_first(board) -> None:
    (mapping,) = timeline_panel(board, "The binding limit")["fieldConfig"]["defaults"]["mappings"]
    names = [mapping["options"][str(i)]["text"] for i in range(len(mapping["options"]))]
    assert names == [NO_LIMIT, *BINDING_CHOICES]
    assert mapping["options"]["1"]["color"] == look("healthy").hex  # requests: at the cap
    assert mapping["options"]["2"]["color"] == look("memory_bound").hex  # kv_cache


def test_the_exporter_binding_timeline_has_a_row_for_every_series_it_read(tmp_path) -> None:
    """One row a series: the limit at 1, or none where every limit reads 0, whatever the
    diagnosis: idle, or saturated while the gauges read no request (requests that ran
    between scrapes; vLLM's gauges under overload)."""
    binding = {"kv": "kv_cache", "cap": "requests", "idle": None, "saturated": None}
    series = {}
    for model, limit in binding.items():
        labels = f'target="t", model_name="{model}", engine="0"'
        for name in BINDING_CHOICES:  # as the exporter writes them: one line a limit
            line = f'batchscope_binding_limit{{{labels}, limit="{name}"}}'
            series[line] = 1.0 if name == limit else 0.0
    assert _binding_rows("vllm-batching.json", series, tmp_path) == {
        "kv": "kv_cache",
        "cap": "requests",
        "idle": NO_LIMIT,
        "saturated": NO_LIMIT,
    }


def test_the_rules_binding_timeline_names_the_limit_the_rules_record(tmp_path) -> None:
    binding = {"kv": "kv_cache", "budget": "token_budget", "quiet": "arrivals", "idle": None}
    series = {}
    for model, limit in binding.items():
        labels = f'target="t", model_name="{model}", engine="0"'
        for name in BINDING_LIMITS:  # as the rules record them: 1 or 0 a limit
            series[f'{BINDING_LIMIT}{{{labels}, limit="{name}"}}'] = float(name == limit)
    assert _binding_rows("vllm-batching-rules.json", series, tmp_path) == {
        "kv": "kv_cache",
        "budget": "token_budget",
        "quiet": "arrivals",
        "idle": NO_LIMIT,
    }


def test_the_rules_record_a_binding_line_for_each_limit_the_board_reads() -> None:
    recorded = [
        rule["labels"]["limit"]
        for group in vllm_recording_rules(CONFIG)["groups"]
        for rule in group["rules"]
        if rule.get("record") == BINDING_LIMIT
    ]
    assert recorded == list(BINDING_LIMITS)
    assert set(BINDING_LIMITS) <= set(BINDING_CHOICES)
