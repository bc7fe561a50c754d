"""Autoscalers that act on the replica count: a KEDA ScaledObject, or prometheus-adapter's
external metric and a HorizontalPodAutoscaler (two ways to the same end: pick one, since
KEDA makes an HPA of its own). Part of deploy/kubernetes/ (grafana/kubernetes.py).

Both read the count the recording rules hold (grafana/replica_rules.py), from the
Prometheus that scrapes every vLLM pod (monitoring/): in a cluster, pods come and go, and
a fleet file lists targets that stay. One object a model of the fleet file's `models:`,
scaling the Deployment named after it (the user's vLLM Deployment serving it, started
with `--served-model-name` equal to that name, so that vLLM's model_name label is it),
within the model's bounds. A model id such as `meta-llama/Llama-3-8B` is no Kubernetes
name: objects take its DNS-1123 form (`object_name`, here `meta-llama-llama-3-8b`). The count is already held against flapping (down after the
scale-down window), so the autoscaler adds no stabilisation window of its own. The
desired count over a target of 1 a replica (AverageValue) is the count itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from batchscope.exporter.config.settings import Settings
from batchscope.grafana.promql import string
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


# A Kubernetes label value (what a label selector may match): 63 at most.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
NAME_MOST = 63


def object_name(model: str) -> str:
    """The model's name as a Kubernetes object name (a DNS-1123 label): lowercase, each
    run of other characters one '-', at most 63 characters, alphanumeric at both ends."""
    name = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:NAME_MOST].rstrip("-")
    if not name:
        raise ValueError(f"model {model!r} has no letter or digit to name its objects by")
    return name


def count_query(model: str) -> str:
    """The held count of `model`, as the recording rules record it."""
    return f"max({MODEL_DESIRED}{{model_name={string(model)}}})"


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
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": object_name(bounds.model),
        },
        "minReplicaCount": bounds.min_replicas,
        "maxReplicaCount": bounds.max_replicas or KEDA_DEFAULT_MAX,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": IMMEDIATE}},
        "triggers": [trigger],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(object_name(bounds.model)),
        "spec": spec,
    }


def _selectable(model: str) -> bool:
    """Whether a label selector may match `model` as a label value."""
    return len(model) <= NAME_MOST and LABEL_VALUE.fullmatch(model) is not None


def external_metric(model: str) -> dict:
    """The HPA's metric of `model`: EXTERNAL_METRIC selected by model_name, or, where the
    id is no label value a selector may hold (`meta-llama/Llama-3-8B`), a metric of the
    model's own that its adapter rule (`adapter_rules`) selects in PromQL."""
    if _selectable(model):
        return {"name": EXTERNAL_METRIC, "selector": {"matchLabels": {"model_name": model}}}
    return {"name": f"{EXTERNAL_METRIC}_{object_name(model).replace('-', '_')}"}


def adapter_rules(models: Sequence[ModelBounds] = ()) -> dict:
    """prometheus-adapter's external rules serving the count (its Helm chart's
    `rules.external`): EXTERNAL_METRIC by model_name, and one metric a model whose id
    a label selector cannot hold."""
    rules = [
        {
            "seriesQuery": f'{MODEL_DESIRED}{{model_name!=""}}',
            "resources": {"namespaced": False},
            "name": {"matches": f"^{MODEL_DESIRED}$", "as": EXTERNAL_METRIC},
            "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (model_name)",
        }
    ]
    for bounds in models:
        if _selectable(bounds.model):
            continue
        matcher = f"{{model_name={string(bounds.model)}}}"
        rules.append(
            {
                "seriesQuery": MODEL_DESIRED + matcher,
                "resources": {"namespaced": False},
                "name": {
                    "matches": f"^{MODEL_DESIRED}$",
                    "as": external_metric(bounds.model)["name"],
                },
                "metricsQuery": f"max(<<.Series>>{matcher})",
            }
        )
    return {"externalRules": rules}


def adapter_config_map(models: Sequence[ModelBounds] = ()) -> dict:
    text = yaml.safe_dump(adapter_rules(models), sort_keys=False)
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
            "metric": external_metric(bounds.model),
            "target": {"type": "AverageValue", "averageValue": "1"},
        },
    }
    name = object_name(bounds.model)
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicas": bounds.min_replicas,
        "maxReplicas": bounds.max_replicas or KEDA_DEFAULT_MAX,
        "metrics": [metric],
        "behavior": IMMEDIATE,
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(name),
        "spec": spec,
    }


def autoscaling_folders(models: Sequence[ModelBounds]) -> Mapping[str, list[dict]]:
    """The two ways, a folder each: KEDA, or prometheus-adapter and an HPA. Two models
    whose names give one object name are refused: one would overwrite the other."""
    named: dict[str, str] = {}
    for bounds in models:
        other = named.setdefault(object_name(bounds.model), bounds.model)
        if other != bounds.model:
            raise ValueError(
                f"models {other!r} and {bounds.model!r} both name Kubernetes objects "
                f"{object_name(other)!r}"
            )
    return {
        "autoscaling-keda": [scaled_object(b) for b in models],
        "autoscaling-hpa": [
            adapter_config_map(models),
            *(horizontal_pod_autoscaler(b) for b in models),
        ],
    }
