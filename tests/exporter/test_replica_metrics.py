"""The replica count on /metrics: `render_models` writes what prometheus_client's
generate_latest writes for a Collector of the model families, byte for byte; a count
not known is left out, never NaN; the JSON says the same numbers."""

from __future__ import annotations

import dataclasses
import json
import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.demand import Demand, ReplicaCapacity
from batchscope.exporter.core.families import (
    CURRENT_REPLICAS,
    DESIRED_REPLICAS,
    MODEL_DEMAND,
    MODEL_FAMILIES,
    NEEDED_REPLICAS,
    REPLICA_CAPACITY,
    REPLICAS_STALE,
)
from batchscope.exporter.core.replicas import (
    HeldCount,
    ModelReplicas,
    Replica,
    ReplicaBounds,
    ReplicaSettings,
    count_model,
)
from batchscope.exporter.serve.api_json import encode, replicas_response
from batchscope.exporter.serve.app import _Handlers
from batchscope.exporter.serve.exposition import render_models
from tests.support.live_screens import SCREENS
from tests.support.live_stories import START, story_exporter


class ModelCollector:
    """The reference: fresh families of the models' counts at every collect()."""

    def __init__(self, models: list[ModelReplicas]) -> None:
        self.models = models

    def collect(self):
        metrics = {f.name: Metric(f.name, f.documentation, f.type) for f in MODEL_FAMILIES}
        for m in self.models:
            c, labels = m.count, {"model_name": m.count.model}
            for family, value in (
                (DESIRED_REPLICAS, m.desired),
                (NEEDED_REPLICAS, c.count),
                (CURRENT_REPLICAS, c.current),
                (MODEL_DEMAND, c.demand),
            ):
                if value is not None:
                    metrics[family.name].add_sample(family.name, labels, value)
            if c.capacity is not None:
                name = REPLICA_CAPACITY.name
                metrics[name].add_sample(name, {**labels, "limit": c.limit}, c.capacity)
            stale = REPLICAS_STALE.name
            metrics[stale].add_sample(stale, labels, float(m.held.stale))
        yield from metrics.values()


def _busy(target: str) -> Replica:
    return Replica(
        target,
        {"engine": "0", "model_name": 'llama "8b"'},
        True,
        16.0,
        40.0,
        16.0,
        "requests",
        Demand(14.5, 9.5, 0.0, 5.0, 60.0),
        ReplicaCapacity(8.54, "requests", 9.5, 16.0, 1.684, 0.899),
    )


MODELS = [
    ModelReplicas(count_model('llama "8b"', [_busy("a")], ReplicaBounds()), HeldCount(2)),
    ModelReplicas(
        count_model("gone", [Replica("b", read=False)], ReplicaBounds(2)),
        HeldCount(read_at=0.0, stale=True),
    ),
]


def test_the_model_families_are_generate_latests_byte_for_byte() -> None:
    registry = CollectorRegistry()
    registry.register(ModelCollector(MODELS))
    assert render_models(MODELS) == generate_latest(registry)


def test_a_stale_model_has_no_count_and_its_flag_set() -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(render_models(MODELS).decode())
        for s in family.samples
    }
    llama = (("model_name", 'llama "8b"'),)
    assert samples[("batchscope_desired_replicas", llama)] == 2.0
    assert samples[("batchscope_needed_replicas", llama)] == 2.0
    assert samples[("batchscope_replicas", llama)] == 1.0
    assert samples[("batchscope_model_demand_per_second", llama)] == 14.5
    assert samples[("batchscope_replica_capacity", (("limit", "requests"), *llama))] == 8.54
    gone = (("model_name", "gone"),)
    assert samples[("batchscope_desired_replicas_stale", gone)] == 1.0
    assert ("batchscope_desired_replicas", gone) not in samples
    assert ("batchscope_needed_replicas", gone) not in samples
    assert samples[("batchscope_replicas", gone)] == 1.0


def test_the_json_says_the_same_counts_and_the_change_pending() -> None:
    pending = ModelReplicas(MODELS[0].count, HeldCount(1, pending=2, since=100.0, read_at=110.0))
    body = replicas_response(120.0, [pending, MODELS[1]], ReplicaSettings(scale_up_seconds=60))
    llama, gone = body["models"]
    assert (llama["desired_replicas"], llama["needed_replicas"], llama["replicas"]) == (1, 2, 1)
    assert llama["pending"] == {"replicas": 2, "since": 100.0, "at": 160.0}
    assert llama["capacity"]["limit"] == "requests" and llama["capacity"]["per_second"] == 8.54
    assert llama["spread"][0]["role"] == "" and llama["spread"][0]["running"] == 16.0
    assert (gone["desired_replicas"], gone["stale"], gone["state"]) == (None, True, "unread")


def _odd(target: str, demand: float, capacity: float) -> Replica:
    """A replica at its cap whose demand and capacity are the numbers given."""
    return Replica(
        target,
        {"engine": "0", "model_name": target},
        True,
        16.0,
        40.0,
        16.0,
        "requests",
        Demand(demand, demand, 0.0, 0.0, 60.0),
        ReplicaCapacity(capacity, "requests", capacity, 16.0, 0.0, 1.0),
    )


def test_infinite_or_nan_inputs_reach_neither_metrics_nor_json_as_numbers() -> None:
    """A replica whose window gave an infinite capacity (a slot of 0 s) or demand, or NaN,
    counts nothing, and neither /metrics nor the JSON carries a NaN or an infinity."""
    cases = {
        "inf-capacity": (14.5, math.inf),
        "inf-demand": (math.inf, 8.54),
        "nan-demand": (math.nan, 8.54),
    }
    models = [
        ModelReplicas(count_model(name, [_odd(name, d, c)], ReplicaBounds()), HeldCount(3))
        for name, (d, c) in cases.items()
    ]
    for m in models:
        assert (m.count.count, m.count.needed, m.count.state) == (None, None, "measuring")
    text = render_models(models).decode()
    samples = [
        (s.name, s.labels.get("model_name"), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert all(math.isfinite(value) for _, _, value in samples), samples
    assert "batchscope_replica_capacity" not in {
        n for n, model, _ in samples if model == "inf-capacity"
    }
    assert {n for n, model, _ in samples if model == "inf-demand"} == {
        "batchscope_desired_replicas",
        "batchscope_replicas",
        "batchscope_replica_capacity",
        "batchscope_desired_replicas_stale",
    }
    body = json.loads(encode(replicas_response(0.0, models, ReplicaSettings())))
    by_name = {m["model"]: m for m in body["models"]}
    assert by_name["inf-capacity"]["capacity"]["per_second"] is None
    assert by_name["inf-demand"]["demand"]["per_second"] is None
    assert by_name["nan-demand"]["demand"]["per_second"] is None
    assert [m["desired_replicas"] for m in body["models"]] == [3, 3, 3]


def test_replica_count_is_on_by_default_off_with_a_shard_or_when_asked() -> None:
    target = (Target("llm", "http://127.0.0.1:8000/metrics"),)
    assert Settings(targets=target).counts_replicas
    assert not Settings(targets=target, shard="0/2").counts_replicas
    assert Settings(targets=target, shard="0/2", replica_count="on").counts_replicas
    assert not Settings(targets=target, replica_count="off").counts_replicas


async def test_an_exporter_with_the_count_off_publishes_no_model_family() -> None:
    """A sidecar sees one pod of a model: N sidecars must not publish its count N times."""
    exporter, histories = story_exporter(SCREENS, START)
    on = _Handlers(exporter, histories)
    body = (await on.bodies.body("metrics", False)).decode()
    assert 'batchscope_desired_replicas{model_name="tiny"} 6' in body
    exporter.settings = dataclasses.replace(exporter.settings, replica_count="off")
    off = _Handlers(exporter, histories)
    body = (await off.bodies.body("metrics", False)).decode()
    assert "batchscope_desired_replicas" not in body and "batchscope_target_up" in body
    replicas = json.loads(await off.bodies.body("replicas", False))
    assert (replicas["counting"], replicas["models"]) == (False, [])
