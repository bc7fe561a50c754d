"""End to end: the demo server under load, the exporter, a real Prometheus with the
generated rules, and Alertmanager with a local webhook receiver.

Every dashboard panel's expression must return data from that Prometheus (the demo
produces every signal the dashboards show, the in-house batcher's too), and a
tight latency budget must bring BatchingBudgetSaturated and, for the target held to an
SLO objective, BatchingSLOBurnFast to the webhook both ways: through Prometheus' rules
(exporter path and vLLM path) and through the exporter's own `--alertmanager-url`. The
batcher beside it sets no objective: no SLO alert reaches either webhook for it.
Windows and holds are shortened (10 s, 5 s; the SLO windows to a hundredth, 1h/5m to
36 s/3 s, and a 5 s compliance period) the way a user would set them:
`--window-seconds`, `--hold-seconds`, `slo_window_scale`, `slo_period_days`, and the
generator's config.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from batchscope.exporter.alerts.specs import BUDGET_SATURATED, SLO_BURN_FAST, SLO_BURN_SLOW
from batchscope.grafana.build import ROOT, rule_yaml
from batchscope.grafana.config import CONFIG
from batchscope.grafana.rules import exporter_alerts, vllm_alerts, vllm_recording_rules
from tests.support.demo_process import running_demo_server
from tests.support.monitoring_stack import (
    alertmanager,
    exporter,
    prometheus,
    python_env,
    query,
    webhook,
)
from tests.support.network import wait_until

pytestmark = pytest.mark.slow

WINDOW, HOLD = 10, 5
BUDGET_SECONDS = 0.05  # far under what a 32-token completion takes: saturation at once
# 99% promised within the budget, which no request meets: a burn of 100x or so. The SLO
# windows a hundredth of the standard ones, the period 5 s (the exporter shows the error
# budget once its history covers it).
OBJECTIVE, SLO_SCALE, SLO_PERIOD_DAYS = 0.99, 0.01, 5 / 86400
TOKEN_BUDGET = 2048  # the demo server's step budget, configured as a user configures vLLM's
# Grafana's variables as a user would pick them on this stack.
VARIABLES = {
    "$__rate_interval": f"{WINDOW}s",
    "$target": "demo",
    "$model": ".*",
    "$batcher": "embeddings",
}


def _fleet(path: Path, demo_url: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "interval_seconds": 1,
                "window_seconds": WINDOW,
                "hold_seconds": HOLD,
                "slo_window_scale": SLO_SCALE,
                "slo_period_days": SLO_PERIOD_DAYS,
                "targets": [
                    {
                        "name": "demo",
                        "url": demo_url,
                        "engine": "vllm",
                        "cap": 8,
                        "max_num_batched_tokens": TOKEN_BUDGET,
                        "budget_seconds": BUDGET_SECONDS,
                        "slo_objective": OBJECTIVE,
                    },
                    {"name": "demo-embeddings", "url": demo_url, "engine": "inhouse"},
                ],
            }
        )
    )


def _rule_files(fleet: Path) -> dict[str, str]:
    config = {
        **CONFIG,
        "window": f"{WINDOW}s",
        "saturation_hold_seconds": HOLD,
        "slo_window_scale": SLO_SCALE,
        "slo_period_days": SLO_PERIOD_DAYS,
    }
    holds = {BUDGET_SATURATED.name: HOLD}
    targets = subprocess.run(
        [sys.executable, "-m", "batchscope.exporter.rules_cli", "--config", str(fleet)],
        capture_output=True,
        text=True,
        env=python_env(),
        check=True,
    ).stdout
    return {
        "targets.yml": targets,
        "vllm-rules.yml": rule_yaml(vllm_recording_rules(config)),
        "vllm-alerts.yml": rule_yaml(vllm_alerts(config, holds)),
        "exporter-alerts.yml": rule_yaml(exporter_alerts(config, holds)),
    }


def _load(base_url: str, endpoint: str, rate: str, seconds: int) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "batchscope.demo_server.loadgen.run",
        "--url",
        base_url,
        "--endpoint",
        endpoint,
        "--rates",
        rate,
        "--duration",
        str(seconds),
        "--max-tokens",
        "32",
        "--concurrency-limit",
        "64",
    ]
    return subprocess.Popen(
        args, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# Panels of signals an engine shows only with a feature on (prefix caching, speculative
# decoding); every other panel must fill from the demo server.
NEEDS_ENGINE_FEATURE = {"Prefix cache hits", "Draft tokens accepted"}


def _panel_queries() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                found.append((path.stem, panel["title"], expr))
    return found


def _demo(alert: dict) -> bool:
    return alert["labels"]["target"] == "demo"


def _path(alert: dict) -> str:
    """Which Prometheus path an alert came from: the exporter's series (labels: target)
    or vLLM's (plus model_name, engine)."""
    return "vllm" if "model_name" in alert["labels"] else "exporter"


def test_every_panel_fills_and_saturation_and_slo_burn_reach_the_webhook_both_ways(tmp_path):
    for name in ("am-rules", "am-exporter"):
        (tmp_path / name).mkdir()
    demo_flags = [
        "--device",
        "sim:h200",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        str(TOKEN_BUDGET),
        "--embed-batching",
        "adaptive",
        "--latency-budget-ms",
        "20",
    ]
    with running_demo_server(*demo_flags, log=tmp_path / "demo.log") as (demo_url, _):
        fleet = tmp_path / "fleet.yaml"
        _fleet(fleet, f"{demo_url}/metrics")
        with (
            webhook() as from_rules,
            webhook() as from_exporter,
            alertmanager(tmp_path / "am-rules", from_rules.url) as am_rules,
            alertmanager(tmp_path / "am-exporter", from_exporter.url) as am_exporter,
            exporter(
                tmp_path, "--config", str(fleet), "--alertmanager-url", am_exporter.url
            ) as exp,
            prometheus(
                tmp_path,
                [
                    {
                        "job_name": "vllm",
                        "static_configs": [
                            {"targets": [urlsplit(demo_url).netloc], "labels": {"target": "demo"}}
                        ],
                    },
                    {
                        "job_name": "batchscope-exporter",
                        "static_configs": [{"targets": [f"127.0.0.1:{exp.port}"]}],
                    },
                ],
                _rule_files(fleet),
                alertmanager_url=am_rules.url,
            ) as prom,
        ):
            started = time.monotonic()
            loads = [
                _load(demo_url, "completions", "12", 90),
                _load(demo_url, "embeddings", "40", 90),
            ]
            try:

                def everywhere(name: str) -> bool:
                    """The demo's `name` at both webhooks, from both rule paths."""
                    rules_paths = {_path(a) for a in from_rules.alerts(name) if _demo(a)}
                    own = [a for a in from_exporter.alerts(name) if _demo(a)]
                    return rules_paths == {"exporter", "vllm"} and bool(own)

                wait_until(
                    lambda: everywhere(SLO_BURN_FAST.name),
                    120,
                    "BatchingSLOBurnFast at both webhooks, from both rule paths",
                    exp.log,
                )
                burning_after = time.monotonic() - started
                wait_until(
                    lambda: everywhere(BUDGET_SATURATED.name),
                    120,
                    "BatchingBudgetSaturated at both webhooks, from both rule paths",
                    exp.log,
                )
                saturated_after = time.monotonic() - started
                # The embeddings batcher may saturate its own 20 ms budget too: the demo's alerts.
                by_path = {
                    _path(a): a["labels"]
                    for a in from_rules.alerts(BUDGET_SATURATED.name)
                    if _demo(a)
                }
                assert by_path["exporter"] == {
                    "alertname": "BatchingBudgetSaturated",
                    "severity": "warning",
                    "target": "demo",
                }
                assert by_path["vllm"]["model_name"] == "batchscope-demo"
                assert (
                    by_path["vllm"]["quantile"] == "0.99" and by_path["vllm"]["histogram"] == "e2e"
                )
                # The exporter's own post carries the rule's labels exactly (Alertmanager would
                # merge the two).
                posted = [a for a in from_exporter.alerts(BUDGET_SATURATED.name) if _demo(a)]
                assert posted and all(a["labels"] == by_path["exporter"] for a in posted)
                assert posted[0]["annotations"]["runbook_url"].endswith("#batchingbudgetsaturated")
                burn = {_path(a): a for a in from_rules.alerts(SLO_BURN_FAST.name)}
                assert burn["exporter"]["labels"] == {
                    "alertname": "BatchingSLOBurnFast",
                    "severity": "critical",
                    "target": "demo",
                }
                assert burn["vllm"]["labels"]["histogram"] == "e2e"
                own = from_exporter.alerts(SLO_BURN_FAST.name)
                assert all(a["labels"] == burn["exporter"]["labels"] for a in own)
                # The words state the shortened windows the configuration set.
                assert "over 36 s and 3 s at 14.4x" in own[0]["annotations"]["description"]
                # No objective, no SLO alert: the embeddings batcher posts none either way.
                for hook in (from_rules, from_exporter):
                    for name in (SLO_BURN_FAST.name, SLO_BURN_SLOW.name):
                        assert all(
                            _demo(a)
                            for status in ("firing", "resolved")
                            for a in hook.alerts(name, status)
                        )

                empty = {}
                for dashboard, title, expr in _panel_queries():
                    if not query(prom, expr):
                        empty.setdefault((dashboard, title), []).append(expr)
            finally:
                for load in loads:
                    load.terminate()
                    load.wait()
    # The demo server has no prefix cache and no draft model, so those two panels stay
    # empty here; test_cache_signals_e2e reads both signals from a real vLLM that has them.
    unfilled = {key: exprs for key, exprs in empty.items() if key[1] not in NEEDS_ENGINE_FEATURE}
    assert unfilled == {}, f"panels with no data: {json.dumps(list(unfilled.items()), indent=1)}"
    print(
        f"\nSLO burn at both webhooks {burning_after:.0f} s and saturation "
        f"{saturated_after:.0f} s after load began; "
        f"{len(_panel_queries())} panel queries, all with data but {sorted(empty)}"
    )
