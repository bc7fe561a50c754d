"""Grafana-managed alert rules (file provisioning) for a Grafana without Prometheus' ruler.

The same alerts as `exporter-alerts.yml`, from the same expressions: query A reads the
value the description shows, query B is 1 wherever the Prometheus rule's expression
holds, and C fires on B. Grafana's alert rules must name a datasource uid: the one
`provisioning/datasources/batchscope.yml` provisions.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchscope.exporter.alerts.specs import ALERTS, AlertWords

DATASOURCE_UID = "batchscope-prometheus"
FOLDER = "batchscope"
# Grafana's template functions take the value as an argument.
VALUE_TEMPLATES = {
    "percent": "{{ humanizePercentage $values.A.Value }}",
    "seconds": "{{ humanizeDuration $values.A.Value }}",
    "number": "{{ humanize $values.A.Value }}",
}


def _query(ref_id: str, expr: str) -> dict:
    return {
        "refId": ref_id,
        "relativeTimeRange": {"from": 600, "to": 0},
        "datasourceUid": DATASOURCE_UID,
        "model": {"refId": ref_id, "expr": expr, "instant": True, "range": False},
    }


def managed_alert_rules(prometheus_alerts: dict, config: Mapping) -> dict:
    """Grafana's alerting provisioning file for the rules in `prometheus_alerts`."""
    specs = {spec.name: spec for spec in ALERTS}
    rules = []
    for group in prometheus_alerts["groups"]:
        for rule in group["rules"]:
            spec = specs[rule["alert"]]
            value = VALUE_TEMPLATES[spec.value_format]
            summary, description = AlertWords.from_config(config).texts(
                spec, "{{ $labels.target }}", value
            )
            rules.append(
                {
                    "uid": f"batchscope-{spec.runbook_anchor}"[:40],
                    "title": spec.name,
                    "condition": "C",
                    "data": [
                        _query("A", rule["expr"]),
                        _query("B", f"({rule['expr']}) * 0 + 1"),
                        {
                            "refId": "C",
                            "datasourceUid": "__expr__",
                            "model": {
                                "refId": "C",
                                "type": "threshold",
                                "expression": "B",
                                "conditions": [{"evaluator": {"type": "gt", "params": [0]}}],
                            },
                        },
                    ],
                    "for": rule["for"],
                    "noDataState": "OK",
                    "execErrState": "Error",
                    "labels": dict(rule["labels"]),
                    "annotations": {
                        "summary": summary,
                        "description": description,
                        "runbook_url": rule["annotations"]["runbook_url"],
                    },
                }
            )
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "batchscope",
                "folder": FOLDER,
                "interval": config["grafana_alert_interval"],
                "rules": rules,
            }
        ],
    }
