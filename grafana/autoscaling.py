"""Autoscalers that act on the replica count: a KEDA ScaledObject, or prometheus-adapter's
external metric and a HorizontalPodAutoscaler (two ways to the same end: pick one, since
KEDA makes an HPA of its own). Part of deploy/kubernetes/ (grafana/kubernetes.py).

Both read the count the recording rules hold (grafana/replica_rules.py), from the
Prometheus that scrapes every vLLM pod (monitoring/): in a cluster, pods come and go, and
a fleet file lists targets that stay. One object a model of the fleet file's `models:`,
scaling the Deployment named after it (the user's vLLM Deployment serving it, started
with `--served-model-name` equal to that name, so that vLLM's model_name label is it),
within the model's bounds. The count is already held against flapping (down after the
scale-down window), so the autoscaler adds no stabilisation window of its own. The
desired count over a target of 1 a replica (AverageValue) is the count itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from batchscope.exporter.config.settings import Settings
from batchscope.grafana.replica_rules import MODEL_DESIRED

# kube-prometheus-stack's Prometheus Service, released as `kube-prometheus-stack` in
# namespace `monitoring`.
PROMETHEUS_URL = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
# The external metric prometheus-adapter serves the count as, and the exporter's name.
EXTERNAL_METRIC = "batchscope_desired_replicas"
ADAPTER_CONFIG = "batchscope-prometheus-adapter-rules"
# Where a model's bounds leave no most: KEDA's own default.
KEDA_DEFAULT_MAX = 100
# The autoscaler follows the count at once: it is held already.
IMMEDIATE = {
    "scaleUp": {"stabilizationWindowSeconds": 0},
    "scaleDown": {"stabilizationWindowSeconds": 0},
}


@dataclass(frozen=True)
class ModelBounds:
    """A model of the fleet file and its replica bounds."""

    model: str
    min_replicas: int
    max_replicas: int | None


def model_bounds(settings: Settings) -> list[ModelBounds]:
    """Each model of `models:`, its bounds the fleet's where it gives none."""
    return [
        ModelBounds(
            model,
            settings.min_replicas if low is None else low,
            settings.max_replicas if high is None else high,
        )
        for model, low, high in settings.models
    ]


def count_query(model: str) -> str:
    """The held count of `model`, as the recording rules record it."""
    return f'max({MODEL_DESIRED}{{model_name="{model}"}})'


def _meta(name: str) -> dict:
    return {"name": name, "labels": {"app.kubernetes.io/part-of": "batchscope"}}


def scaled_object(bounds: ModelBounds) -> dict:
    """A KEDA ScaledObject scaling the model's Deployment to the count."""
    trigger = {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": PROMETHEUS_URL,
            "query": count_query(bounds.model),
            "threshold": "1",
            # An empty result (a stale count, nothing finished) is an error, so the HPA
            # keeps today's scale, not KEDA's default of 0 that scales to the minimum.
            "ignoreNullValues": "false",
        },
    }
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": bounds.model},
        "minReplicaCount": bounds.min_replicas,
        "maxReplicaCount": bounds.max_replicas or KEDA_DEFAULT_MAX,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": IMMEDIATE}},
        "triggers": [trigger],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(bounds.model),
        "spec": spec,
    }


def adapter_rules() -> dict:
    """prometheus-adapter's external rule serving the count as EXTERNAL_METRIC, by
    model_name (its Helm chart's `rules.external`)."""
    return {
        "externalRules": [
            {
                "seriesQuery": f'{MODEL_DESIRED}{{model_name!=""}}',
                "resources": {"namespaced": False},
                "name": {"matches": f"^{MODEL_DESIRED}$", "as": EXTERNAL_METRIC},
                "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (model_name)",
            }
        ]
    }


def adapter_config_map() -> dict:
    text = yaml.safe_dump(adapter_rules(), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(ADAPTER_CONFIG),
        "data": {"config.yaml": text},
    }


def horizontal_pod_autoscaler(bounds: ModelBounds) -> dict:
    """An HPA scaling the model's Deployment to the count prometheus-adapter serves."""
    metric = {
        "type": "External",
        "external": {
            "metric": {
                "name": EXTERNAL_METRIC,
                "selector": {"matchLabels": {"model_name": bounds.model}},
            },
            "target": {"type": "AverageValue", "averageValue": "1"},
        },
    }
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": bounds.model},
        "minReplicas": bounds.min_replicas,
        "maxReplicas": bounds.max_replicas or KEDA_DEFAULT_MAX,
        "metrics": [metric],
        "behavior": IMMEDIATE,
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(bounds.model),
        "spec": spec,
    }


def autoscaling_folders(models: Sequence[ModelBounds]) -> Mapping[str, list[dict]]:
    """The two ways, a folder each: KEDA, or prometheus-adapter and an HPA."""
    return {
        "autoscaling-keda": [scaled_object(b) for b in models],
        "autoscaling-hpa": [adapter_config_map(), *(horizontal_pod_autoscaler(b) for b in models)],
    }
