"""The Prometheus rule files: generated from the code, valid, and unit-tested by promtool."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from batchscope.exporter.alerts.fleet_rules import (
    BUDGET_RULE,
    CAP_RULE,
    MIN_REPLICAS_RULE,
    SLO_BUCKET_RULE,
    SLO_EDGES_RULE,
    SLO_OBJECTIVE_RULE,
    UnsupportedTarget,
    fleet_rule_groups,
    target_rules,
)
from batchscope.exporter.alerts.specs import ALERTS, SLO_BURN_FAST, SLO_BURN_SLOW
from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.settings import Target
from batchscope.exporter.engines.vllm import TOKEN_LATENCY_KINDS
from batchscope.grafana import rules as rule_names
from batchscope.grafana.build import PROMETHEUS, generated_files
from batchscope.grafana.config import CONFIG
from batchscope.grafana.managed_alerts import managed_alert_rules
from batchscope.grafana.rules import exporter_alerts, vllm_alerts, vllm_recording_rules
from tests.support.paths import REPO
from tests.support.system_tools import tool

ROOT = REPO
# Rule files only: prometheus.yml and alertmanager.yml sit beside them as examples.
RULE_FILES = sorted(
    p for p in PROMETHEUS.glob("*.yml") if "groups" in yaml.safe_load(p.read_text())
)
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))


def test_committed_files_are_what_the_code_generates():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in generated_files().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"run `python -m batchscope.grafana.build`: {stale} differ from the code"


def test_rule_files_pass_promtool_check():
    assert len(RULE_FILES) == 4
    result = subprocess.run(
        [tool("promtool"), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 4


@pytest.mark.parametrize("unit_test", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass(unit_test: Path):
    result = subprocess.run(
        [tool("promtool"), "test", "rules", str(unit_test)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _rules(path: Path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_summary_description_and_a_runbook_anchor_that_exists():
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    alerts = [r for p in RULE_FILES if "alerts" in p.name for r in _rules(p) if "alert" in r]
    assert {a["alert"] for a in alerts} == {spec.name for spec in ALERTS}
    for alert in alerts:
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"]
        page, anchor = annotations["runbook_url"].split("#")
        assert page == "docs/runbook.md"
        assert anchor in anchors, f"{alert['alert']}: no '## {anchor}' heading in the runbook"


def test_rule_texts_and_holds_follow_the_configured_threshold_and_hold():
    # The rule files are generated from the config: a threshold of 0.9 held 2 minutes is
    # what every saturation rule states and (on the vLLM path) holds, on both paths and in
    # Grafana's managed rules ("95%" and "a minute" were written into the texts before).
    config = {
        **CONFIG,
        "saturation_threshold": 0.9,
        "saturation_hold_seconds": 120.0,
        "near_cap": 0.8,
    }
    rules = {}
    for name, alerts in (("exporter", exporter_alerts(config)), ("vllm", vllm_alerts(config))):
        rules[name] = {r["alert"]: r for r in alerts["groups"][0]["rules"]}
        saturated = rules[name]["BatchingBudgetSaturated"]
        assert saturated["annotations"]["summary"] == (
            "{{ $labels.target }}: latency budget saturated for 2 minutes"
        )
        assert (
            "at or above 90% of the budget for 2 minutes" in saturated["annotations"]["description"]
        )
        assert (
            "under 80% of its cap"
            in rules[name]["BatchingMemoryBound"]["annotations"]["description"]
        )
    assert rules["vllm"]["BatchingBudgetSaturated"]["for"] == "120s"
    assert ">= 0.9" in rules["vllm"]["BatchingBudgetSaturated"]["expr"]
    assert rules["exporter"]["BatchingBudgetSaturated"]["for"] == "0s"  # the exporter held it
    managed = managed_alert_rules(exporter_alerts(config), config)["groups"][0]["rules"]
    [grafana] = [r for r in managed if r["title"] == "BatchingBudgetSaturated"]
    assert "at or above 90% of the budget for 2 minutes" in grafana["annotations"]["description"]


def test_recording_rules_are_named_level_metric_operations():
    for path in RULE_FILES:
        for rule in _rules(path):
            if "record" in rule:
                level, metric, operation = rule["record"].split(":")
                assert level and metric and operation, rule["record"]


def test_every_histogram_rule_keeps_the_instance_labels_beside_le():
    for rule in _rules(PROMETHEUS / "vllm-rules.yml"):
        if "histogram_quantile" in rule["expr"]:
            assert "sum by (le, target, model_name, engine)" in rule["expr"], rule["expr"]
            assert "rate(" in rule["expr"]


def test_tokens_count_as_requests_in_flight_only_for_latencies_observed_at_the_finish():
    # vLLM observes e2e, queue, inference and TPOT as a request finishes: a token generated
    # belongs to a request that owes them. ITL is observed at every token after a
    # request's first, TTFT at its first: tokens generated say nothing owed of those.
    unfinished = {
        rule["labels"]["histogram"]: rule["expr"]
        for rule in _rules(PROMETHEUS / "vllm-rules.yml")
        if rule.get("record") == rule_names.UNFINISHED
    }
    assert sorted(unfinished) == ["e2e", "inference", "itl", "queue", "tpot", "ttft"]
    tokens = f"({rule_names.GENERATION_TOKENS} > 0)"
    assert {kind for kind, expr in unfinished.items() if tokens in expr} == {
        "e2e",
        "inference",
        "queue",
        "tpot",
    }


def test_target_rules_carry_cap_and_budget_with_the_quantile_and_histogram():
    target = Target(
        "llm",
        "http://127.0.0.1:8000/metrics",
        cap=128,
        budget_seconds=0.25,
        quantile=0.9,
        histogram="ttft",
    )
    assert target_rules(target) == [
        {"record": CAP_RULE, "expr": "vector(128)", "labels": {"target": "llm"}},
        {
            "record": BUDGET_RULE,
            "expr": "vector(0.25)",
            "labels": {"target": "llm", "quantile": "0.9", "histogram": "ttft"},
        },
    ]


def test_a_target_without_cap_or_budget_gets_no_rules():
    assert target_rules(Target("llm", "http://127.0.0.1:8000/metrics")) == []


def test_a_quantile_the_rules_do_not_record_is_refused_by_name():
    with pytest.raises(UnsupportedTarget, match="target llm: quantile 0.75 is not recorded"):
        target_rules(Target("llm", "http://h/metrics", budget_seconds=1, quantile=0.75))


def _rules_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "batchscope.exporter.rules_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
    )


@pytest.mark.integration
def test_rules_cli_writes_the_example_fleet_rules_that_promtool_accepts(tmp_path):
    out = tmp_path / "targets.yml"
    result = _rules_cli("--config", str(PROMETHEUS / "fleet.example.yaml"), "--output", str(out))
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load(out.read_text())["groups"]
    assert [g["name"] for g in groups] == [
        "batchscope-target-llm-a",
        "batchscope-target-llm-b",
        "batchscope-replica-bounds",
    ]
    # The fleet's bounds (min 1 by default, no max), then each of models:.
    assert groups[2]["rules"][0] == {"record": MIN_REPLICAS_RULE, "expr": "vector(1)"}
    assert groups[1]["rules"][0] == {
        "record": CAP_RULE,
        "expr": "vector(64)",
        "labels": {"target": "llm-b"},
    }
    check = subprocess.run(
        [tool("promtool"), "check", "rules", str(out)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.integration
def test_rules_cli_reads_file_sd_targets_and_names_a_bad_key(tmp_path):
    (tmp_path / "sd.json").write_text(
        '[{"targets": ["127.0.0.1:8000"], "labels": {"name": "sd-llm", '
        '"cap": "32", "budget_seconds": "1"}}]'
    )
    (tmp_path / "fleet.yaml").write_text("file_sd:\n  - sd.json\n")
    result = _rules_cli("--config", str(tmp_path / "fleet.yaml"))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["groups"][0]["name"] == "batchscope-target-sd-llm"
    (tmp_path / "bad.yaml").write_text("targets:\n  - url: http://h/metrics\n    capp: 8\n")
    bad = _rules_cli("--config", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2
    assert "bad.yaml:3" in bad.stderr and "capp" in bad.stderr


def test_a_fleet_without_objectives_records_and_alerts_on_what_it_did_before():
    # No objective, no SLO constant; every rule added for the SLO (and the per-token
    # quantiles) reads a constant only a target with an objective (or a per-token budget)
    # has, so for such a fleet it records nothing and no SLO alert can fire.
    example = load_config(PROMETHEUS / "fleet.example.yaml").targets
    without = [dataclasses.replace(t, slo_objective=None) for t in example]
    records = {r["record"] for g in fleet_rule_groups(without)["groups"] for r in g["rules"]}
    assert records == {CAP_RULE, BUDGET_RULE, "target:vllm_max_num_batched_tokens:config"}
    signals, slo = vllm_recording_rules(CONFIG)["groups"]
    for rule in slo["rules"]:
        reads_raw = "vllm:" in rule["expr"]
        assert not reads_raw or SLO_BUCKET_RULE in rule["expr"] or SLO_EDGES_RULE in rule["expr"]
        assert reads_raw or "vllm_slo_" in rule["expr"], rule["record"]
    assert SLO_OBJECTIVE_RULE in next(r["expr"] for r in slo["rules"] if "burn" in r["record"])
    for rule in signals["rules"]:
        if rule.get("labels", {}).get("histogram") in TOKEN_LATENCY_KINDS:
            histogram = rule["labels"]["histogram"]
            assert f'{BUDGET_RULE}{{histogram="{histogram}"}}' in rule["expr"]
    for alerts, reads in (
        (vllm_alerts(CONFIG), rule_names.SLO_BURN_RATE),
        (exporter_alerts(CONFIG), "batchscope_slo_burning"),
    ):
        by_name = {r["alert"]: r for r in alerts["groups"][0]["rules"]}
        for spec in (SLO_BURN_FAST, SLO_BURN_SLOW):
            assert reads in by_name[spec.name]["expr"]


def test_the_slo_constants_name_each_edge_in_both_spellings_with_its_weight():
    between = target_rules(
        Target("llm", "http://h/metrics", budget_seconds=1.2, slo_objective=0.99)
    )
    buckets = [(r["labels"]["le"], r["expr"]) for r in between if r["record"] == SLO_BUCKET_RULE]
    # 1.2 s is 40% of the way from 1.0 to 1.5 in vLLM's e2e buckets.
    assert [le for le, _ in buckets] == ["1.0", "1", "1.5"]
    assert [float(expr[7:-1]) for _, expr in buckets] == pytest.approx([0.6, 0.6, 0.4])
    edges = next(r for r in between if r["record"] == SLO_EDGES_RULE)
    assert edges["expr"] == "vector(2)"
    on_edge = target_rules(Target("llm", "http://h/metrics", budget_seconds=2, slo_objective=0.9))
    assert [(r["labels"]["le"], r["expr"]) for r in on_edge if r["record"] == SLO_BUCKET_RULE] == [
        ("2.0", "vector(1.0)"),
        ("2", "vector(1.0)"),
    ]
    with pytest.raises(UnsupportedTarget, match="slo_objective needs budget_seconds"):
        target_rules(Target("llm", "http://h/metrics", slo_objective=0.99))
