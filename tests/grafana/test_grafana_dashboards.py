"""The generated Grafana dashboards: importable shape, layout, PromQL and metric names.

Grafana is not installable here, so the import path is checked against a schema of the
keys Grafana's import needs (grafana/dashboard-import.schema.json), and every query
against PromQL's grammar and the names that really exist.
"""

from __future__ import annotations

import json
import re

import jsonschema
import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry

from batchscope.exporter.engines.vllm import KV_USAGE_OLD, SWAPPED
from batchscope.exporter.ingest.promtext import parse
from batchscope.exporter.instrumentation import BatcherMetrics
from batchscope.grafana.build import PROMETHEUS, ROOT
from tests.support.paths import FIXTURES
from tests.support.reference_exposition import SignalsCollector

DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))
SCHEMA = json.loads((ROOT / "dashboard-import.schema.json").read_text())
FIXTURES = FIXTURES
METRICS_DOC = (ROOT.parent / "docs" / "metrics.md").read_text()
# Prometheus' own series for every scrape target.
PROMETHEUS_SERIES = {"up"}


def _dashboards() -> list[tuple[str, dict]]:
    return [(p.name, json.loads(p.read_text())) for p in DASHBOARD_FILES]


def _exprs(board: dict) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def _grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by what Grafana sends: a duration or a label value."""
    expr = expr.replace("$__rate_interval", "1m")
    label_values = re.fullmatch(r"label_values\((.*), *\w+\)", expr)
    if label_values:
        expr = label_values.group(1)
    return re.sub(r"\$\w+", "x", expr)


def _metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects, by name or by a __name__ regex of names."""
    names: set[str] = set()
    for selector in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}", expr):
        if selector.group(1) and selector.group(1) not in ("by", "on", "without", "ignoring"):
            names.add(selector.group(1))
        regex = re.search(r'__name__=~"([^"]+)"', selector.group(2))
        if regex:
            names.update(regex.group(1).split("|"))
    # Bare names (no braces) inside the parsed expression.
    ast = promql_parser.parse(_grafana_to_promql(expr))
    names.update(_bare_names(ast))
    return names


def _bare_names(node) -> set[str]:
    found = set()
    if isinstance(node, promql_parser.VectorSelector) and node.name:
        found.add(node.name)
    for attribute in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if isinstance(child, promql_parser.Expr):
            found |= _bare_names(child)
    for arg in getattr(node, "args", None) or []:
        found |= _bare_names(arg)
    return found


def _fixture_names() -> set[str]:
    names = set()
    for path in FIXTURES.glob("vllm-*.txt"):
        names |= {s.name for s in parse(path.read_text())}
    return names


def _exporter_names() -> set[str]:
    names = {family.name for family in SignalsCollector(list).collect()}
    registry = CollectorRegistry()
    BatcherMetrics(
        "b", max_batch_size=8, max_wait_seconds=0.01, latency_budget_seconds=0.1, registry=registry
    )
    suffixes = {
        "histogram": ("_bucket", "_sum", "_count"),
        "counter": ("_total",),
        "summary": ("_sum", "_count"),
        "gauge": ("",),
    }
    for family in registry.collect():
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def _recorded_names() -> set[str]:
    names = set()
    for path in PROMETHEUS.glob("*.yml"):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def _documented(name: str) -> bool:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return f"`{name}`" in METRICS_DOC or f"`{base}`" in METRICS_DOC


def test_five_dashboards_are_generated():
    assert {p.stem for p in DASHBOARD_FILES} == {
        "fleet-overview",
        "fleet-overview-rules",
        "inhouse-batcher",
        "vllm-batching",
        "vllm-batching-rules",
    }


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_dashboard_has_the_shape_grafana_imports(name, board):
    jsonschema.validate(board, SCHEMA)
    assert board["__inputs"][0]["name"] == "DS_PROMETHEUS"
    datasource = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert datasource[0]["current"]["value"] == "${DS_PROMETHEUS}"
    panel_types = {p["type"] for p in board["panels"]}
    required = {r["id"] for r in board["__requires"] if r["type"] == "panel"}
    assert panel_types == required


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_panel_ids_are_unique_and_panels_do_not_overlap(name, board):
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], int] = {}
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = panel["id"]


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_no_datasource_uid_is_hard_coded(name, board):
    text = json.dumps(board)
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {board["uid"]}
    assert uids == {"${datasource}"}


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_every_expression_parses_as_promql(name, board):
    for expr in _exprs(board):
        promql_parser.parse(_grafana_to_promql(expr))


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_rates_use_rate_interval_and_never_flatten_the_fleet(name, board):
    for expr in _exprs(board):
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr
        assert "_sum / " not in expr and "_sum/" not in expr, f"lifetime average: {expr}"
        # sum by (le) alone is allowed only where the series are pinned to one target or
        # batcher (a single-value variable): it never merges a fleet.
        if re.search(r"sum by \(le\)", expr):
            assert re.search(r'(target|batcher)="\$\w+"', expr), expr


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_every_metric_is_documented_and_really_exists(name, board):
    fixtures, exporter, recorded = _fixture_names(), _exporter_names(), _recorded_names()
    # Older vLLM names the exporter reads that no fixture here holds (V0, before 0.9).
    older_vllm = {KV_USAGE_OLD, SWAPPED}
    for expr in _exprs(board):
        for metric in _metric_names(expr):
            assert metric in fixtures | exporter | recorded | older_vllm | PROMETHEUS_SERIES, (
                f"{name}: {metric} is emitted by nothing batchscope reads or writes"
            )
            assert _documented(metric), f"{name}: {metric} is not in docs/metrics.md"


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_units_thresholds_and_descriptions_are_set(name, board):
    for panel in board["panels"]:
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if "latency_seconds" in exprs or "wait_seconds" in exprs:
            assert defaults.get("unit") == "s", panel["title"]
        if panel["title"].startswith("Budget utilisation"):
            assert defaults["unit"] == "percentunit"
            steps = defaults["thresholds"]["steps"]
            assert [s["value"] for s in steps] == [None, 0.95]


def test_the_rules_dashboard_reads_recorded_names_and_the_exporter_one_reads_batchscope():
    exporter = json.loads((ROOT / "dashboards" / "vllm-batching.json").read_text())
    rules = json.loads((ROOT / "dashboards" / "vllm-batching-rules.json").read_text())
    titles = [p["title"] for p in exporter["panels"]]
    assert titles[:6] == [p["title"] for p in rules["panels"]][:6]
    assert "batchscope_budget_utilization_ratio" in json.dumps(exporter)
    assert "batchscope_" not in json.dumps(rules)
    assert "target_model_engine:vllm_budget_utilization:ratio" in json.dumps(rules)


def test_the_name_check_catches_the_public_anchors_mistakes():
    allowed = _fixture_names() | _exporter_names() | _recorded_names()
    # llm-d's alert: the counter is vllm:num_preemptions_total.
    assert _metric_names("rate(vllm:num_preemptions[5m]) > 0") == {"vllm:num_preemptions"}
    assert "vllm:num_preemptions" not in allowed
    assert "vllm:num_preemptions_total" in allowed
    # vLLM's own dashboard after the 0.9 rename: the old name must be read beside the new.
    assert _metric_names('{__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"}') == {
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    }


@pytest.mark.parametrize(("name", "board"), _dashboards())
def test_an_empty_panel_says_the_engine_may_not_expose_the_signal(name, board):
    for panel in board["panels"]:
        no_value = panel["fieldConfig"]["defaults"].get("noValue")
        assert no_value == "not exposed by this engine, or no data yet", (name, panel["title"])


def test_a_ray_serve_or_tensorrt_llm_series_is_never_taken_for_a_target_total():
    from batchscope.exporter.engines import ADAPTERS
    from batchscope.grafana.config import CONFIG
    from batchscope.grafana.exporter_series import total_selector

    selector = total_selector(CONFIG)
    for adapter in ADAPTERS.values():
        for label in adapter.KEY_LABELS:
            assert f'{label}=""' in selector, (adapter.NAME, label)
    assert 'function_name=""' in selector and 'model=""' in selector
