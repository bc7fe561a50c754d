"""Grafana provisioning and the example Prometheus and Alertmanager configurations."""

from __future__ import annotations

import subprocess

import promql_parser
import pytest
import yaml

from batchscope.exporter.alerts.specs import ALERTS, EXPORTER_DOWN
from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.settings import DEFAULT_TIMEOUT_SECONDS
from batchscope.grafana.build import PROMETHEUS, ROOT
from tests.support.system_tools import tool

PROVISIONING = ROOT / "provisioning"


def _yaml(path):
    return yaml.safe_load(path.read_text())


def test_example_prometheus_config_passes_promtool_with_all_four_rule_files():
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(PROMETHEUS / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rule files found" in result.stdout


def test_example_prometheus_labels_each_vllm_with_its_fleet_name():
    jobs = {job["job_name"]: job for job in _yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]}
    assert jobs["batchscope-exporter"]["static_configs"][0]["targets"] == ["127.0.0.1:9500"]
    labelled = {group["labels"]["target"] for group in jobs["vllm"]["static_configs"]}
    fleet = load_config(PROMETHEUS / "fleet.example.yaml")
    assert labelled == {target.name for target in fleet.targets} == {"llm-a", "llm-b"}


def test_example_prometheus_reads_a_slow_vllm_as_long_as_the_exporter_does():
    # An overloaded vLLM's /metrics takes seconds: the vLLM job waits as long as the
    # exporter's default scrape timeout, at an interval no shorter (Prometheus's rule).
    [vllm] = [
        job
        for job in _yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]
        if job["job_name"] == "vllm"
    ]
    timeout = float(vllm["scrape_timeout"].removesuffix("s"))
    assert timeout == DEFAULT_TIMEOUT_SECONDS == 10.0
    assert float(vllm["scrape_interval"].removesuffix("s")) >= timeout


@pytest.mark.integration
def test_example_alertmanager_config_passes_amtool_and_groups_by_alert_and_target():
    path = PROMETHEUS / "alertmanager.yml"
    result = subprocess.run(
        [tool("amtool"), "check-config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    route = _yaml(path)["route"]
    assert route["group_by"] == ["alertname", "target"]
    assert _yaml(path)["receivers"][0]["webhook_configs"][0]["send_resolved"] is True


def test_datasource_and_dashboard_providers_are_provisioning_files():
    [datasource] = _yaml(PROVISIONING / "datasources" / "batchscope.yml")["datasources"]
    assert (datasource["type"], datasource["uid"]) == ("prometheus", "batchscope-prometheus")
    [provider] = _yaml(PROVISIONING / "dashboards" / "batchscope.yml")["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_grafana_managed_alerts_mirror_the_exporter_alerts():
    provisioned = _yaml(PROVISIONING / "alerting" / "batchscope.yml")
    [group] = provisioned["groups"]
    prometheus_rules = {
        r["alert"]: r for r in _yaml(PROMETHEUS / "exporter-alerts.yml")["groups"][0]["rules"]
    }
    assert [r["title"] for r in group["rules"]] == [spec.name for spec in ALERTS]
    uids = [r["uid"] for r in group["rules"]]
    assert len(set(uids)) == len(uids) and all(len(u) <= 40 for u in uids)
    for rule in group["rules"]:
        queries = {q["refId"]: q for q in rule["data"]}
        assert queries["A"]["model"]["expr"] == prometheus_rules[rule["title"]]["expr"]
        for ref in ("A", "B"):
            assert queries[ref]["datasourceUid"] == "batchscope-prometheus"
            promql_parser.parse(queries[ref]["model"]["expr"])
        assert queries["C"]["model"]["expression"] == "B" and rule["condition"] == "C"
        assert rule["for"] == prometheus_rules[rule["title"]]["for"]
        assert (
            "{{ $labels.target }}" in rule["annotations"]["summary"]
            or rule["title"] == EXPORTER_DOWN.name
        )
