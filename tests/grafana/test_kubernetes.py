"""deploy/kubernetes/: generated from the rules and dashboards, valid against the real
schemas, and wired so that what one object names another provides."""

from __future__ import annotations

import copy
import ipaddress
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from batchscope.exporter.cli import build_parser
from batchscope.exporter.config.flags import settings_from_args
from batchscope.exporter.config.fleet_file import load_config
from batchscope.grafana import build
from batchscope.grafana import kubernetes as k8s
from batchscope.grafana.autoscaling import ModelBounds, autoscaling_folders
from batchscope.grafana.build import PROMETHEUS, generated_files
from batchscope.grafana.config import CONFIG
from batchscope.grafana.replica_rules import MODEL_DESIRED
from batchscope.grafana.rules import RUNNING_VS_CAP
from tests.support.kubernetes_schemas import KUBERNETES_VERSIONS, Invalid, objects, validate
from tests.support.system_tools import tool

FLEET = load_config(k8s.FLEET_EXAMPLE)
MONITORING_KINDS = {"PrometheusRule", "PodMonitor", "ServiceMonitor"}


def _committed() -> dict[str, dict]:
    """Every committed object, by folder/kind/name."""
    return {
        f"{path.parent.name}/{obj['kind']}/{obj['metadata']['name']}": obj
        for path, obj in objects(k8s.DEPLOY)
    }


COMMITTED = _committed()


def _containers(obj: dict) -> dict[str, dict]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args)


def test_committed_manifests_are_what_the_code_generates():
    fresh = k8s.manifest_files(generated_files())
    on_disk = {p for p in k8s.DEPLOY.rglob("*") if p.is_file()}
    assert on_disk == set(fresh), (
        "run `make grafana`: deploy/kubernetes/ has stray or missing files"
    )
    stale = [str(p) for p, text in fresh.items() if p.read_text(encoding="utf-8") != text]
    assert stale == [], f"run `make grafana`: {stale} differ from the code"
    # One file, one whole object, for `kubectl apply -f FOLDER`.
    assert all(len(list(yaml.safe_load_all(text))) == 1 for text in fresh.values())
    assert sorted({p.parent.name for p in fresh}) == [
        "autoscaling-hpa",
        "autoscaling-keda",
        "fleet",
        "monitoring",
        "sidecar",
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_its_kinds_schema(version):
    kinds: dict[str, int] = {}
    for obj in COMMITTED.values():
        validate(obj, version)
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    # 5 dashboards, 2 engine ConfigMaps, the fleet file and prometheus-adapter's rules;
    # 2 vLLMs and the exporter; one model's ScaledObject and HPA; ...
    assert kinds == {
        "ConfigMap": 9,
        "Deployment": 3,
        "Service": 1,
        "PodMonitor": 2,
        "ServiceMonitor": 1,
        "PrometheusRule": 4,
        "ScaledObject": 1,
        "HorizontalPodAutoscaler": 1,
    }


def _set(path: str, value: object) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        *parents, last = path.split(".")
        for part in parents:
            obj = obj[int(part)] if part.isdigit() else obj[part]
        obj[int(last) if last.isdigit() else last] = value

    return change


def _drop(path: str) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        *parents, last = path.split(".")
        for part in parents:
            obj = obj[int(part)] if part.isdigit() else obj[part]
        del obj[last]

    return change


BROKEN = [
    # (object, change, what the refusal says)
    ("fleet/Deployment/batchscope-exporter", _set("spec.template.spec.containers.0.imagePullPolicyy", "Always"), "'imagePullPolicyy' was unexpected"),
    ("fleet/Deployment/batchscope-exporter", _set("spec.replicas", "one"), "spec.replicas: 'one' is not of type 'integer'"),
    ("fleet/Deployment/batchscope-exporter", _drop("spec.selector"), "'selector' is a required property"),
    ("fleet/Service/batchscope-exporter", _set("spec.ports.0.port", "9500/tcp"), "spec.ports.0.port: '9500/tcp' is not of type 'integer'"),
    ("fleet/ConfigMap/batchscope-fleet", _set("datas", {}), "'datas' was unexpected"),
    ("monitoring/PodMonitor/batchscope-vllm", _set("spec.podMetricsEndpoints.0.intervall", "10s"), "'intervall' was unexpected"),
    ("monitoring/PodMonitor/batchscope-vllm", _set("spec.podMetricsEndpoints.0.interval", 10), "interval: 10 is not of type 'string'"),
    ("monitoring/PodMonitor/batchscope-vllm", _drop("spec.selector"), "spec: 'selector' is a required property"),
    ("fleet/ServiceMonitor/batchscope-exporter", _drop("spec.endpoints.0.authorization.credentials.key"), "'key' is a required property"),
    ("fleet/ServiceMonitor/batchscope-exporter", _set("spec.endpointz", []), "'endpointz' was unexpected"),
    ("monitoring/PrometheusRule/batchscope-vllm", _drop("spec.groups.0.rules.0.expr"), "'expr' is a required property"),
    ("monitoring/PrometheusRule/batchscope-vllm", _set("spec.groups.0.rules.0.recrod", "x"), "'recrod' was unexpected"),
    ("monitoring/PrometheusRule/batchscope-vllm", _set("spec.groups.0.rules", "none"), "rules: 'none' is not of type 'array'"),
    ("monitoring/PrometheusRule/batchscope-vllm", _set("metadata.labels.release", 1), "metadata.labels.release: 1 is not of type 'string'"),
    ("monitoring/PrometheusRule/batchscope-vllm", _set("metadata.label", {}), "'label' was unexpected"),
    ("autoscaling-keda/ScaledObject/llama-3-8b", _set("spec.triggers.0.metadata.threshold", 1), "threshold: 1 is not of type 'string'"),
    ("autoscaling-keda/ScaledObject/llama-3-8b", _set("spec.maxReplicaCountt", 8), "'maxReplicaCountt' was unexpected"),
    ("autoscaling-hpa/HorizontalPodAutoscaler/llama-3-8b", _drop("spec.maxReplicas"), "'maxReplicas' is a required property"),
    ("autoscaling-hpa/HorizontalPodAutoscaler/llama-3-8b", _set("spec.metrics.0.external.target.averageValue", [1]), "averageValue"),
    ("autoscaling-hpa/HorizontalPodAutoscaler/llama-3-8b", _set("spec.metrics.0.externall", {}), "'externall' was unexpected"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "change", "said"), BROKEN, ids=[f"{name}: {said}"[:80] for name, _, said in BROKEN]
)
def test_a_broken_manifest_is_refused_naming_the_field(name, change, said):
    obj = copy.deepcopy(COMMITTED[name])
    validate(obj)
    change(obj)
    with pytest.raises(Invalid) as refused:
        validate(obj)
    assert said in str(refused.value)


def test_a_kind_with_no_schema_is_refused_not_passed():
    with pytest.raises(Invalid, match="Couldn't find schema"):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


def test_keda_scaled_object_schema_takes_a_scaled_object_and_refuses_a_broken_one():
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "llm-a"},
        "spec": {
            "scaleTargetRef": {"name": "llm-a"},
            "minReplicaCount": 1,
            "maxReplicaCount": 4,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {"serverAddress": "http://prometheus:9090", "query": "vector(2)"},
                }
            ],
        },
    }
    validate(scaled)
    for change, said in (
        (_set("spec.minReplicaCount", "1"), "'1' is not of type 'integer'"),
        (_drop("spec.triggers"), "'triggers' is a required property"),
        (_set("spec.scaleTargetRef.nmae", "x"), "'nmae' was unexpected"),
    ):
        broken = copy.deepcopy(scaled)
        change(broken)
        with pytest.raises(Invalid, match=re.escape(said)):
            validate(broken)


def test_prometheus_rule_groups_are_the_rule_files_groups():
    def groups(*files: str) -> list[dict]:
        return [g for f in files for g in yaml.safe_load((PROMETHEUS / f).read_text())["groups"]]

    vllm = COMMITTED["monitoring/PrometheusRule/batchscope-vllm"]["spec"]["groups"]
    assert vllm == groups("vllm-rules.yml", "vllm-alerts.yml")
    assert [g["name"] for g in vllm] == [
        "batchscope-vllm-signals",
        "batchscope-vllm-slo",
        "batchscope-vllm-alerts",
    ]
    for mode in ("sidecar", "fleet"):
        exporter = COMMITTED[f"{mode}/PrometheusRule/batchscope-exporter-alerts"]["spec"]["groups"]
        assert exporter == groups("exporter-alerts.yml")


def test_rules_and_monitors_carry_the_release_label_kube_prometheus_stack_selects_by(tmp_path):
    selected = [o for o in COMMITTED.values() if o["kind"] in MONITORING_KINDS]
    assert len(selected) == 7
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in selected)
    # Another release: the same objects, labelled for it alone.
    assert (
        build.main(["--out", str(tmp_path), "--label", "release=prom", "--label", "team=ml"]) == 0
    )
    relabelled = [o for _, o in objects(tmp_path) if o["kind"] in MONITORING_KINDS]
    assert len(relabelled) == 7
    for obj in relabelled:
        labels = obj["metadata"]["labels"]
        assert (labels["release"], labels["team"]) == ("prom", "ml")
    others = [o for _, o in objects(tmp_path) if o["kind"] not in MONITORING_KINDS]
    assert all("release" not in o["metadata"]["labels"] for o in others)


def test_one_config_map_per_dashboard_labelled_for_grafanas_sidecar():
    dashboards = sorted((PROMETHEUS.parent / "dashboards").glob("*.json"))
    maps = {n: o for n, o in COMMITTED.items() if n.startswith("monitoring/ConfigMap/")}
    assert len(dashboards) == len(maps) == 5
    for path in dashboards:
        obj = maps[f"monitoring/ConfigMap/batchscope-dashboard-{path.stem}"]
        assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert obj["data"] == {path.name: path.read_text(encoding="utf-8")}


def _expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of a container's args (an unknown name stays)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def _container_env(container: dict, config_maps: dict[str, dict], pod_name: str) -> dict:
    env = {}
    for source in container.get("envFrom", []):
        env |= config_maps[source["configMapRef"]["name"]]["data"]
    for var in container.get("env", []):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = pod_name if field == "metadata.name" else var["value"]
    return env


@pytest.mark.parametrize("target", FLEET.targets, ids=lambda t: t.name)
def test_sidecar_exporter_takes_its_caps_from_the_values_that_start_vllm(target):
    pod_name = f"{target.name}-7d9f8b6c5-x2x9q"
    config_maps = {
        o["metadata"]["name"]: o for n, o in COMMITTED.items() if n.startswith("sidecar/ConfigMap/")
    }
    deployment = COMMITTED[f"sidecar/Deployment/{target.name}"]
    assert deployment["spec"]["template"]["metadata"]["labels"][k8s.CONFIG_LABEL] == target.name
    containers = _containers(deployment)
    vllm, exporter = containers["vllm"], containers[k8s.EXPORTER_NAME]
    vllm_args = [_expand(a, _container_env(vllm, config_maps, pod_name)) for a in vllm["args"]]
    exporter_env = _container_env(exporter, config_maps, pod_name)
    args = [_expand(a, exporter_env) for a in exporter["args"]]
    settings = settings_from_args(build_parser().parse_args(args))
    [judged] = settings.targets
    # The cap each container reads is the one value in the pod's ConfigMap, the fleet's.
    started = _flags(vllm_args[1:])
    assert float(started["--max-num-seqs"]) == judged.cap == target.cap
    if target.max_num_batched_tokens is None:
        assert "--max-num-batched-tokens" not in started
        assert judged.max_num_batched_tokens is None
    else:
        assert float(started["--max-num-batched-tokens"]) == judged.max_num_batched_tokens
        assert judged.max_num_batched_tokens == target.max_num_batched_tokens
    assert "$(" not in " ".join(args + vllm_args)
    # vLLM on localhost, the series named after the pod, judged as the fleet entry says.
    assert judged.url == f"http://127.0.0.1:{k8s.VLLM_PORT}/metrics"
    assert judged.name == pod_name
    for field in ("budget_seconds", "quantile", "histogram", "slo_objective"):
        assert getattr(judged, field) == getattr(target, field), field
    assert settings.web_token_file == f"{k8s.TOKEN_DIR}/{k8s.TOKEN_KEY}"
    # One pod of the model: N sidecars never publish its replica count N times.
    assert not settings.counts_replicas


def test_fleet_exporter_reads_the_fleet_file_from_its_config_map(tmp_path):
    data = COMMITTED["fleet/ConfigMap/batchscope-fleet"]["data"]
    (tmp_path / "fleet.yaml").write_text(data["fleet.yaml"])
    [exporter] = _containers(COMMITTED["fleet/Deployment/batchscope-exporter"]).values()
    flags = _flags(exporter["args"])
    mount = Path(flags["--config"]).parent
    volumes = {m["mountPath"]: m["name"] for m in exporter["volumeMounts"]}
    assert volumes[str(mount)] == "fleet"
    args = [a.replace(str(mount), str(tmp_path)) for a in exporter["args"]]
    settings = settings_from_args(build_parser().parse_args(args))
    assert [(t.name, t.url) for t in settings.targets] == [
        (t.name, f"http://{t.name}:{k8s.VLLM_PORT}/metrics") for t in FLEET.targets
    ]
    for ours, theirs in zip(settings.targets, FLEET.targets, strict=True):
        assert (ours.cap, ours.budget_seconds, ours.slo_objective) == (
            theirs.cap,
            theirs.budget_seconds,
            theirs.slo_objective,
        )
    assert settings.listen == f"0.0.0.0:{k8s.EXPORTER_PORT}"


def _exporters() -> list[tuple[str, dict, dict]]:
    return [
        (name, obj, _containers(obj)[k8s.EXPORTER_NAME])
        for name, obj in COMMITTED.items()
        if obj["kind"] == "Deployment"
    ]


def test_exporter_listens_beyond_loopback_only_with_the_token_from_the_secret():
    exporters = _exporters()
    assert len(exporters) == 3
    for name, obj, container in exporters:
        flags = _flags(container["args"])
        host = flags["--listen"].rsplit(":", 1)[0]
        assert not ipaddress.ip_address(host).is_loopback, name
        token = Path(flags["--web-token-file"])
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        secret = volumes[mounts[str(token.parent)]]["secret"]
        assert (secret["secretName"], token.name) == (k8s.TOKEN_SECRET, k8s.TOKEN_KEY), name
    # Prometheus scrapes the exporter port with the same Secret's token.
    for name in (
        "sidecar/PodMonitor/batchscope-exporter",
        "fleet/ServiceMonitor/batchscope-exporter",
    ):
        spec = COMMITTED[name]["spec"]
        [endpoint] = spec.get("endpoints") or spec["podMetricsEndpoints"]
        assert endpoint["port"] == k8s.EXPORTER_PORT_NAME
        assert endpoint["authorization"]["credentials"] == {
            "name": k8s.TOKEN_SECRET,
            "key": k8s.TOKEN_KEY,
        }


def test_exporter_runs_non_root_read_only_with_resources_and_the_deployment_a_readiness_probe():
    for name, _, container in _exporters():
        security = container["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] != 0, name
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"] == {"drop": ["ALL"]}
        resources = container["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"], name
        assert resources["limits"]["memory"], name
        probe = container.get("readinessProbe")
        if name.startswith("fleet/"):
            assert probe["httpGet"] == {"path": "/health", "port": k8s.EXPORTER_PORT_NAME}
        else:
            # A pod is ready when every container is: a slow sidecar must not take vLLM out
            # of its Service.
            assert probe is None, name
    service = COMMITTED["fleet/Service/batchscope-exporter"]["spec"]
    deployment = COMMITTED["fleet/Deployment/batchscope-exporter"]
    assert service["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def test_exporter_series_are_scraped_as_the_job_its_alerts_select():
    job = CONFIG["exporter_selector"]
    assert job == f'job="{k8s.EXPORTER_JOB}"'
    # A ServiceMonitor's job is its Service's name; the PodMonitor sets it.
    assert COMMITTED["fleet/Service/batchscope-exporter"]["metadata"]["name"] == k8s.EXPORTER_JOB
    [endpoint] = COMMITTED["sidecar/PodMonitor/batchscope-exporter"]["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "job", "replacement": k8s.EXPORTER_JOB} in endpoint["relabelings"]
    # ...and no `target` target label, which would rename the exporter's own.
    assert all(r["targetLabel"] != "target" for r in endpoint["relabelings"])


def test_vllm_pod_monitor_labels_each_pod_as_the_constants_select_it():
    [endpoint] = COMMITTED["monitoring/PodMonitor/batchscope-vllm"]["spec"]["podMetricsEndpoints"]
    relabel = {(tuple(r["sourceLabels"]), r["targetLabel"]) for r in endpoint["relabelings"]}
    # Prometheus's discovery label of a pod label: each character outside [a-zA-Z0-9_] as _.
    assert relabel == {
        (("__meta_kubernetes_pod_name",), "target"),
        (("__meta_kubernetes_pod_label_batchscope_io_target",), "target"),
        (("__meta_kubernetes_pod_label_batchscope_io_config",), k8s.CONFIG_SERIES_LABEL),
    }
    constants = COMMITTED["monitoring/PrometheusRule/batchscope-pod-constants"]["spec"]["groups"]
    assert [g["name"] for g in constants] == [f"batchscope-config-{t.name}" for t in FLEET.targets]
    assert all(
        f'up{{{k8s.CONFIG_SERIES_LABEL}="{g["name"].removeprefix("batchscope-config-")}"}}'
        in r["expr"]
        for g in constants
        for r in g["rules"]
    )


POD_CONSTANTS_TEST = """
rule_files: [constants.yml, vllm-rules.yml]
evaluation_interval: 10s
tests:
  - interval: 10s
    input_series:
      - series: 'up{job="vllm", instance="10.0.0.1:8000", target="llm-a-5d9f-abcde", batchscope_config="llm-a"}'
        values: '1x6'
      - series: 'vllm:num_requests_running{job="vllm", instance="10.0.0.1:8000", target="llm-a-5d9f-abcde", batchscope_config="llm-a", model_name="m", engine="0"}'
        values: '128x6'
      - series: 'up{job="vllm", instance="10.0.0.2:8000", target="llm-a-5d9f-fghij", batchscope_config="llm-a"}'
        values: '1x6'
      - series: 'vllm:num_requests_running{job="vllm", instance="10.0.0.2:8000", target="llm-a-5d9f-fghij", batchscope_config="llm-a", model_name="m", engine="0"}'
        values: '64x6'
      - series: 'up{job="vllm", instance="10.0.0.3:8000", target="llm-b-77c4-klmno", batchscope_config="llm-b"}'
        values: '1x6'
      - series: 'vllm:num_requests_running{job="vllm", instance="10.0.0.3:8000", target="llm-b-77c4-klmno", batchscope_config="llm-b", model_name="m", engine="0"}'
        values: '16x6'
    promql_expr_test:
      - expr: target:vllm_max_num_seqs:config
        eval_time: 30s
        exp_samples:
          - labels: 'target:vllm_max_num_seqs:config{target="llm-a-5d9f-abcde"}'
            value: 256
          - labels: 'target:vllm_max_num_seqs:config{target="llm-a-5d9f-fghij"}'
            value: 256
          - labels: 'target:vllm_max_num_seqs:config{target="llm-b-77c4-klmno"}'
            value: 64
      - expr: RUNNING_VS_CAP
        eval_time: 30s
        exp_samples:
          - labels: 'RUNNING_VS_CAP{target="llm-a-5d9f-abcde", model_name="m", engine="0"}'
            value: 0.5
          - labels: 'RUNNING_VS_CAP{target="llm-a-5d9f-fghij", model_name="m", engine="0"}'
            value: 0.25
          - labels: 'RUNNING_VS_CAP{target="llm-b-77c4-klmno", model_name="m", engine="0"}'
            value: 0.25
"""


def test_each_vllm_pod_gets_its_fleet_entrys_cap_in_the_rules_path(tmp_path):
    """Two pods of llm-a (cap 256) and one of llm-b (cap 64), each labelled by the PodMonitor
    with its fleet entry: the constants PrometheusRule gives each pod its entry's cap, and
    the recording rules divide each pod's running requests by it (promtool)."""
    for name, source in (
        ("constants.yml", "monitoring/PrometheusRule/batchscope-pod-constants"),
        ("vllm-rules.yml", "monitoring/PrometheusRule/batchscope-vllm"),
    ):
        groups = COMMITTED[source]["spec"]["groups"]
        (tmp_path / name).write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "test.yml").write_text(POD_CONSTANTS_TEST.replace("RUNNING_VS_CAP", RUNNING_VS_CAP))
    result = subprocess.run(
        [tool("promtool"), "test", "rules", "test.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_autoscalers_follow_the_held_count_the_rules_record_within_the_models_bounds():
    """The ScaledObject and the HPA scale the model's Deployment to the count the recording
    rules hold (`replica_rules.MODEL_DESIRED`), a replica a unit of it, with no window of
    their own; prometheus-adapter serves that series as the HPA's external metric."""
    (bounds,) = [(m, low, high) for m, low, high in FLEET.models]
    model, low, high = bounds
    records = {
        r["record"]
        for g in yaml.safe_load((PROMETHEUS / "vllm-rules.yml").read_text())["groups"]
        for r in g["rules"]
    }
    assert MODEL_DESIRED in records
    keda = COMMITTED[f"autoscaling-keda/ScaledObject/{model}"]["spec"]
    (trigger,) = keda["triggers"]
    assert trigger["metadata"]["query"] == f'max({MODEL_DESIRED}{{model_name="{model}"}})'
    assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "1")
    # KEDA reads an empty result as 0 unless told not to: an absent (stale) count would
    # scale the model to its minimum; with "false" KEDA errors and the HPA holds.
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (low, high)
    assert keda["scaleTargetRef"]["name"] == model
    hpa = COMMITTED[f"autoscaling-hpa/HorizontalPodAutoscaler/{model}"]["spec"]
    (metric,) = hpa["metrics"]
    assert metric["external"]["metric"] == {
        "name": "batchscope_desired_replicas",
        "selector": {"matchLabels": {"model_name": model}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (low, high)
    for behavior in (
        hpa["behavior"],
        keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
    ):
        assert {w["stabilizationWindowSeconds"] for w in behavior.values()} == {0}
    adapter = COMMITTED["autoscaling-hpa/ConfigMap/batchscope-prometheus-adapter-rules"]
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    assert rule["seriesQuery"].startswith(MODEL_DESIRED + "{")
    assert rule["name"]["as"] == "batchscope_desired_replicas"


# A Kubernetes object name (a DNS-1123 label) and a label value a selector may match.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def test_a_hugging_face_model_id_gets_dns_names_and_an_escaped_promql_label():
    """`meta-llama/Llama-3-8B` is no object name: the objects and the Deployment they
    scale take `meta-llama-llama-3-8b`, while PromQL selects the id itself, quoted."""
    hf, odd = "meta-llama/Llama-3-8B", 'Org/"Quoted"\\Model-' + "x" * 80
    folders = autoscaling_folders([ModelBounds(hf, 1, 4), ModelBounds(odd, 2, None)])
    (so_hf, so_odd) = folders["autoscaling-keda"]
    (adapter, hpa_hf, hpa_odd) = folders["autoscaling-hpa"]
    assert so_hf["metadata"]["name"] == "meta-llama-llama-3-8b"
    assert so_hf["spec"]["scaleTargetRef"]["name"] == "meta-llama-llama-3-8b"
    assert hpa_hf["metadata"]["name"] == "meta-llama-llama-3-8b"
    # Trimmed to 63, alphanumeric at both ends.
    assert so_odd["metadata"]["name"] == ("org-quoted-model-" + "x" * 80)[:63]
    for obj in (so_hf, so_odd, hpa_hf, hpa_odd):
        for version in KUBERNETES_VERSIONS:
            validate(obj, version)
        assert DNS_LABEL.fullmatch(obj["metadata"]["name"]), obj["metadata"]["name"]
        assert DNS_LABEL.fullmatch(obj["spec"]["scaleTargetRef"]["name"])
    query = so_hf["spec"]["triggers"][0]["metadata"]["query"]
    assert query == f'max({MODEL_DESIRED}{{model_name="meta-llama/Llama-3-8B"}})'
    odd_query = so_odd["spec"]["triggers"][0]["metadata"]["query"]
    # The quote and the backslash escaped as a PromQL string escapes them.
    assert odd_query.startswith(
        MODEL_DESIRED.join(("max(", r'{model_name="Org/\"Quoted\"\\Model-x'))
    )
    # The HPA may not select "meta-llama/Llama-3-8B" by label (a '/' is no label value):
    # it reads a metric of the model's own, which the adapter selects in PromQL.
    metric = hpa_hf["spec"]["metrics"][0]["external"]["metric"]
    assert metric == {"name": "batchscope_desired_replicas_meta_llama_llama_3_8b"}
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    own = {r["name"]["as"]: r for r in rules}[metric["name"]]
    assert own["metricsQuery"] == 'max(<<.Series>>{model_name="meta-llama/Llama-3-8B"})'
    assert len(rules) == 3
    # A name a selector may hold keeps the shared metric, selected by model_name.
    plain = autoscaling_folders([ModelBounds("Llama-3.1_8B", 1, 2)])["autoscaling-hpa"]
    assert LABEL_VALUE.fullmatch("Llama-3.1_8B")
    assert plain[1]["spec"]["metrics"][0]["external"]["metric"] == {
        "name": "batchscope_desired_replicas",
        "selector": {"matchLabels": {"model_name": "Llama-3.1_8B"}},
    }
    assert plain[1]["metadata"]["name"] == "llama-3-1-8b"


def test_two_models_that_give_one_object_name_are_refused():
    with pytest.raises(ValueError, match="'Llama_3' and 'llama-3' both name"):
        autoscaling_folders([ModelBounds("Llama_3", 1, 2), ModelBounds("llama-3", 1, 2)])
