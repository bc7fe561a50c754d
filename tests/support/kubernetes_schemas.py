"""Kubernetes objects checked against their kinds' real schemas, with no cluster.

Built-in kinds: the Kubernetes OpenAPI schemas that `kubernetes-validate` ships, strict
(a field the schema does not declare is refused, as `kubectl apply` does by default).
Custom resources: their projects' CustomResourceDefinitions in tests/fixtures/schemas/
(README there: versions and licences), each object schema closed as an API server treats
a structural schema, and `metadata` checked as ObjectMeta.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
import yaml
from kubernetes_validate.utils import latest_version

from tests.support.paths import FIXTURES

SCHEMAS = FIXTURES / "schemas"
# The oldest Kubernetes still served by its project's releases when this was written, and
# the newest the package ships: a manifest must validate on both.
KUBERNETES_VERSIONS = ("1.30.0", latest_version())
CRDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator-v0.93.0/"
    "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator-v0.93.0/"
    "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-operator-v0.93.0/"
    "monitoring.coreos.com_prometheusrules.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-v2.20.2/keda.sh_scaledobjects.yaml",
}
DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": f"{DEFINITIONS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}


class Invalid(Exception):
    """An object its kind's schema refuses; the message names the field's path."""


def closed(schema: dict) -> dict:
    """`schema` as an API server applies it: an object's undeclared fields refused (unless
    it keeps unknown fields or declares `additionalProperties`), `nullable` as a null
    type. The x-kubernetes extensions are otherwise annotations to jsonschema."""
    schema = dict(schema)
    if schema.pop("nullable", False) and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    for key in ("properties", "patternProperties"):
        if key in schema:
            schema[key] = {name: closed(sub) for name, sub in schema[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            schema[key] = closed(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [closed(sub) for sub in schema[key]]
    keeps_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in schema and "additionalProperties" not in schema and not keeps_unknown:
        schema["additionalProperties"] = False
    return schema


@functools.cache
def _definitions(version: str) -> referencing.Resource:
    folder = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    text = (folder / f"v{version}-local-strict" / "_definitions.json").read_text()
    return referencing.Resource.from_contents(json.loads(text))


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict:
    """The closed schema of a custom resource's version, its apiVersion and kind fixed."""
    crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = closed(served[api_version.split("/")[1]]["schema"]["openAPIV3Schema"])
    schema["properties"] |= {
        "apiVersion": {"const": api_version},
        "kind": {"const": kind},
        "metadata": OBJECT_META,
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return schema


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top)"


def validate(obj: dict, version: str = KUBERNETES_VERSIONS[-1]) -> None:
    """Raise Invalid naming the field unless `obj` is valid for its kind at `version`."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    try:
        if key in CRDS:
            registry = referencing.Registry().with_resource(DEFINITIONS_ID, _definitions(version))
            validator = jsonschema.Draft202012Validator(crd_schema(*key), registry=registry)
            validator.validate(copy.deepcopy(obj))
        else:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
    except jsonschema.ValidationError as err:
        raise Invalid(f"{key[1]} {_path(err)}: {err.message}") from None
    except kubernetes_validate.utils.SchemaNotFoundError as err:
        raise Invalid(err.message) from None


def objects(folder: Path) -> Iterator[tuple[Path, dict]]:
    """Every object in every YAML file under `folder`, with its file."""
    for path in sorted(folder.rglob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if obj is not None:
                yield path, obj
