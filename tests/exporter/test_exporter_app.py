"""The exporter's HTTP app over a real Exporter fed the payloads of tests/fixtures.

The JSON API returns exactly the fields docs/api.md documents, with their types; a
target's configured labels are on every one of its series on /metrics, and a label
the exporter sets itself is refused at start.

A local server plays the real vLLM payloads (idle, load, after) and, on a second
target, the same vLLM beside an in-house batcher.
"""

from __future__ import annotations

import gzip
import re

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.reserved_labels import RESERVED_LABELS
from batchscope.exporter.config.settings import ConfigError, Settings, Target
from batchscope.exporter.instrumentation import BatcherMetrics
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.api_json import POINT_NUMBERS, history_point, series_json
from batchscope.exporter.serve.app import create_app
from batchscope.exporter.serve.history import Histories
from tests.support.network import free_port
from tests.support.paths import REPO, fixture_text

DOC = (REPO / "docs" / "api.md").read_text()
VLLM_PAYLOADS = [
    "vllm-0.32.0-cpu-idle.txt",
    "vllm-0.32.0-cpu-load.txt",
    "vllm-0.32.0-cpu-after.txt",
]


def documented_objects(doc: str) -> dict[str, dict[str, set[str]]]:
    """Object name -> field -> allowed JSON types, from the `### The `x` object` tables."""
    objects: dict[str, dict[str, set[str]]] = {}
    current = None
    for line in doc.splitlines():
        heading = re.fullmatch(r"### The `(\w+)` object", line)
        if heading:
            current = objects.setdefault(heading.group(1), {})
            continue
        row = re.match(r"\| `(\w+)` \|", line)
        if current is not None and row:
            cells = re.split(r"(?<!\\)\|", line)
            current[row.group(1)] = {t.strip() for t in cells[2].split("\\|")}
    return objects


DOCUMENTED = documented_objects(DOC)


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", dict: "object", list: "list"}[type(value)]


class Seen:
    """Every object the API returned, by its documented name."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict]] = {}

    def add(self, name: str, obj: dict) -> None:
        self.objects.setdefault(name, []).append(obj)

    def signals(self, body: dict) -> None:
        self.add("signals", body)
        self.add("evaluation", body["evaluation"])
        for target in body["targets"]:
            self.add("target", target)
            for series in (*target["series"], target["total"]):
                self.add("series", series)
                self.add("diagnosis", series["diagnosis"])
                self.add("limits", series["limits"])
                for reading in series["limits"]["readings"]:
                    self.add("limit_reading", reading)
                self.advice(series["advice"])
                if series["static_utilization"] is not None:
                    self.add("static_utilization", series["static_utilization"])
                if series["slo_attainment"] is not None:
                    self.add("slo_attainment", series["slo_attainment"])
                if series["goodput_per_second"] is not None:
                    self.add("bounded", series["goodput_per_second"])
                if series["slo"] is not None:
                    self.add("slo", series["slo"])
                    for burn in series["slo"]["burn_rates"]:
                        self.add("burn_rate", burn)
                for size_bin in series["batch_size_distribution"]:
                    self.add("batch_size_bin", size_bin)
                if series["demand"] is not None:
                    self.add("demand", series["demand"])
                if series["replica_capacity"] is not None:
                    self.add("replica_capacity", series["replica_capacity"])

    def summary(self, body: dict) -> None:
        self.add("signals_summary", body)
        self.add("evaluation", body["evaluation"])
        for target in body["targets"]:
            self.add("target_summary", target)
            for series in (*target["series"], target["total"]):
                self.add("series_summary", series)
                self.add("diagnosis", series["diagnosis"])

    def advice(self, advice: dict) -> None:
        self.add("advice", advice)
        for item in advice["items"]:
            self.add("advice_item", item)

    def advice_body(self, body: dict) -> None:
        self.add("advice_body", body)
        for target in body["targets"]:
            self.add("target_advice", target)
            self.advice(target["total"])
            for series in target["series"]:
                self.add("series_advice", series)
                self.advice(series["advice"])

    def replicas(self, body: dict) -> None:
        self.add("replicas", body)
        for model in body["models"]:
            self.add("model_replicas", model)
            for replica in model["spread"]:
                self.add("replica", replica)

    def points(self, points: list[dict]) -> None:
        for point in points:
            self.add("point", point)
            for series_point in point["series"]:
                self.add("series_point", series_point)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def fed_exporter():
    """An Exporter after three rounds over the fixture payloads, its app's base URL, and
    the histories the app reads.

    Targets: `llm` (vLLM, cap 8, budget 2 s, 99% within it, labels team=search), `mixed`
    (the same vLLM
    payload beside an in-house batcher: two series), `dead` (nothing listens).
    """
    served: dict[str, str] = {}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=served[request.match_info["name"]])

    source = web.Application()
    source.router.add_get("/{name}/metrics", metrics)
    source_runner, base = await serve(source)

    registry = CollectorRegistry()
    batcher = BatcherMetrics(
        "embeddings",
        max_batch_size=32,
        max_wait_seconds=0.01,
        latency_budget_seconds=0.1,
        registry=registry,
    )
    settings = Settings(
        targets=(
            Target(
                "llm",
                f"{base}/llm/metrics",
                engine="vllm",
                cap=8,
                budget_seconds=2.0,
                slo_objective=0.99,
                labels=(("team", "search"),),
            ),
            Target("mixed", f"{base}/mixed/metrics", cap=8),
            Target("dead", f"http://127.0.0.1:{free_port()}/metrics", engine="vllm"),
        ),
        interval_seconds=5.0,
        window_seconds=30.0,
    )
    clock = Clock()
    exporter = Exporter(settings, clock=clock)
    histories = Histories(exporter)
    async with client_session() as session:
        for i, name in enumerate(VLLM_PAYLOADS):
            for _ in range(4 * i):
                batcher.observe_batch(4, "timeout", 0.002)
                batcher.observe_request("ok", queue_wait_seconds=0.004, latency_seconds=0.02)
            batcher.observe_batch(1, "full", 0.001)
            batcher.set_queue_depth(i)
            vllm = fixture_text(name)
            served["llm"] = vllm
            served["mixed"] = vllm + generate_latest(registry).decode()
            clock.t += 5.0
            await exporter.run_round(session)
    app_runner, api = await serve(create_app(exporter, histories=histories))
    yield exporter, api, histories
    await app_runner.cleanup()
    await source_runner.cleanup()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.get(url) as r:
        return r.status, await r.json()


@pytest.mark.integration
async def test_every_endpoint_returns_exactly_the_documented_fields(fed_exporter) -> None:
    _, api, _ = fed_exporter
    seen = Seen()
    async with aiohttp.ClientSession() as session:
        status, signals = await _get(session, f"{api}/api/v1/signals")
        assert status == 200
        seen.signals(signals)
        status, summary = await _get(session, f"{api}/api/v1/signals?view=summary")
        assert status == 200
        seen.summary(summary)
        status, one = await _get(session, f"{api}/api/v1/signals?target=mixed")
        assert status == 200
        seen.signals(one)
        status, advice = await _get(session, f"{api}/api/v1/advice")
        assert status == 200
        seen.advice_body(advice)
        status, replicas = await _get(session, f"{api}/api/v1/replicas")
        assert status == 200
        seen.replicas(replicas)
        status, history = await _get(session, f"{api}/api/v1/history?target=mixed")
        assert status == 200
        seen.add("history", history)
        seen.points(history["points"])
        status, histories = await _get(session, f"{api}/api/v1/history")
        seen.add("histories", histories)
        for points in histories["targets"].values():
            seen.points(points)
        status, targets = await _get(session, f"{api}/api/v1/targets")
        seen.add("targets", targets)
        for target in targets["targets"]:
            seen.add("configured_target", target)
        status, error = await _get(session, f"{api}/api/v1/history?target=nope")
        assert status == 404
        seen.add("error", error)

    assert set(seen.objects) == set(DOCUMENTED), set(seen.objects) ^ set(DOCUMENTED)
    for name, objects in seen.objects.items():
        fields = DOCUMENTED[name]
        for obj in objects:
            assert set(obj) == set(fields), (name, set(obj) ^ set(fields))
            for field, value in obj.items():
                assert json_type(value) in fields[field], (name, field, value)
    for body in (signals, summary, one, advice, replicas, history, histories, targets, error):
        assert body["api_version"] == 1


@pytest.mark.integration
async def test_history_points_carry_the_new_fields_and_each_series(fed_exporter) -> None:
    exporter, api, _ = fed_exporter
    async with aiohttp.ClientSession() as session:
        _, mixed = await _get(session, f"{api}/api/v1/history?target=mixed")
        _, llm = await _get(session, f"{api}/api/v1/history?target=llm")
        _, signals = await _get(session, f"{api}/api/v1/signals")
    last = mixed["points"][-1]
    # the total: vLLM's recent peak of 8 running against caps 8 + 32, the batcher's 2 queued
    assert (last["waiting"], last["cap"], last["diagnosis"]) == (2.0, 40.0, "batch_limited")
    assert last["diagnosis_reason"].startswith("running 8 of cap 40 while 2 wait")
    assert last["budget_saturated_seconds"] == 0.0
    by_labels = {tuple(sorted(s["labels"].items())): s for s in last["series"]}
    assert len(by_labels) == 2
    batcher = by_labels[(("batcher", "embeddings"),)]
    vllm = by_labels[(("engine", "0"), ("model_name", "/tmp/tinyllama"))]
    # after the first scrape: 4 batches of 4 and 1 of 1, then 8 of 4 and 1 of 1
    assert batcher["mean_batch_size"] == pytest.approx(50 / 14)
    assert batcher["cap"] == 32 and batcher["diagnosis"] == "batch_limited"
    assert "batches average 3.57 of max 32 while 2 wait" in batcher["diagnosis_reason"]
    # vLLM: 60 requests finished between idle and after, 10 s apart
    assert vllm["cap"] == 8 and vllm["requests_per_second"] == pytest.approx(6.0)
    assert vllm["diagnosis"] == "healthy"
    # one series: no per-series history (the total is that series)
    assert all(p["series"] == [] for p in llm["points"])
    load = llm["points"][1]
    assert load["kv_cache_usage"] == pytest.approx(0.001220852154804053)
    # 20 requests finished between idle and load: p99 0.48 s of the 2 s budget
    assert load["latency_seconds"] == pytest.approx(0.48)
    assert load["budget_utilization"] == pytest.approx(0.24)
    assert load["budget_saturated_seconds"] == 0.0
    assert load["diagnosis"] == "healthy" and "running 8 of cap 8" in load["diagnosis_reason"]
    # the JSON shows the target's configured labels
    by_name = {t["target"]: t for t in signals["targets"]}
    assert by_name["llm"]["labels"] == {"team": "search"}
    assert by_name["mixed"]["labels"] == {}
    assert by_name["dead"]["total"]["diagnosis"]["state"] == "down"
    assert exporter.rounds == 3


@pytest.mark.integration
async def test_the_summary_view_and_one_target_agree_with_the_full_signals(fed_exporter) -> None:
    _, api, _ = fed_exporter
    async with aiohttp.ClientSession() as session:
        _, full = await _get(session, f"{api}/api/v1/signals")
        _, summary = await _get(session, f"{api}/api/v1/signals?view=summary")
        _, one = await _get(session, f"{api}/api/v1/signals?target=mixed")
        unknown, missing = await _get(session, f"{api}/api/v1/signals?target=nope")
        bad, wrong = await _get(session, f"{api}/api/v1/signals?view=everything")
    evaluation = {
        "interval_seconds": 5.0,
        "window_seconds": 30.0,
        "hold_seconds": 60.0,
        "saturation_threshold": 0.95,
    }
    assert summary["evaluation"] == full["evaluation"] == one["evaluation"] == evaluation
    by_name = {t["target"]: t for t in full["targets"]}
    assert [t["target"] for t in summary["targets"]] == list(by_name)
    for row in summary["targets"]:
        target = by_name[row["target"]]
        assert (row["t"], row["up"], row["error"]) == (target["t"], target["up"], target["error"])
        for field, value in row["total"].items():
            assert value == target["total"][field], (row["target"], field)
        # a target's series are in its row where it has several (the total is the sole one)
        assert len(row["series"]) == (len(target["series"]) if len(target["series"]) > 1 else 0)
    mixed = next(t for t in summary["targets"] if t["target"] == "mixed")
    assert {s["diagnosis"]["state"] for s in mixed["series"]} == {"healthy", "batch_limited"}
    # the vLLM series' recent peak is what its diagnosis judged: running 8 of cap 8
    assert sorted(s["running_peak"] for s in mixed["series"]) == [pytest.approx(50 / 14), 8.0]
    assert [t["target"] for t in one["targets"]] == ["mixed"]
    assert one["targets"][0] == by_name["mixed"]
    assert unknown == 404 and missing["error"] == "no configured target named 'nope'"
    assert bad == 400 and "view must be one of full, summary" in wrong["error"]


@pytest.mark.integration
async def test_target_labels_are_on_every_series_of_that_target_on_metrics(fed_exporter) -> None:
    _, api, _ = fed_exporter
    async with aiohttp.ClientSession() as session, session.get(f"{api}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    llm = [s for s in samples if s.labels.get("target") == "llm"]
    others = [s for s in samples if s.labels.get("target") in ("mixed", "dead")]
    # up, scrape duration, every gauge of the series and of the total, 10 diagnosis states
    assert len(llm) > 40 and len(others) > 40
    assert all(s.labels["team"] == "search" for s in llm)
    assert not any("team" in s.labels for s in others)
    by_name = {(s.name, frozenset(s.labels.items())): s.value for s in llm}
    assert (
        by_name[("batchscope_target_up", frozenset({("target", "llm"), ("team", "search")}))] == 1
    )
    series = {"target": "llm", "team": "search", "model_name": "/tmp/tinyllama", "engine": "0"}
    assert by_name[("batchscope_batch_cap", frozenset(series.items()))] == 8
    # every label the exporter itself sets is one a target label may not take
    assert {name for s in samples for name in s.labels} - {"team"} <= set(RESERVED_LABELS)


@pytest.mark.parametrize(
    "label", ["target", "histogram", "le", "batcher", "model", "state", "reason"]
)
def test_a_target_label_the_exporter_sets_is_refused_at_start(tmp_path, label) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "targets:\n  - name: a\n    url: http://127.0.0.1:1/metrics\n"
        f"    labels: {{team: search, {label}: x}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert message.startswith(f"{config}:4: targets[0].labels.{label}: the exporter sets")
    assert (
        "reserved are target, bound, histogram, kind, le, limit, quantile, reason, speed, state, "
        "window, application, batcher, "
        "deployment, engine, function_name, model, model_name, version" in message
    )


@pytest.mark.integration
async def test_history_rows_are_the_signals_numbers(fed_exporter) -> None:
    exporter, _, histories = fed_exporter
    for signals in exporter.current():
        row = histories.rows(signals.target)[-1]
        point = history_point(row)
        pairs = [(signals.total, point)]
        if len(signals.series) > 1:
            pairs += zip(signals.series, point["series"], strict=True)
        for series, shown in pairs:
            expected = series_json(series)
            static, attained = expected["static_utilization"], expected["slo_attainment"]
            expected["static_utilization"] = static["estimate"] if static else None
            expected["slo_attainment"] = attained["estimate"] if attained else None
            burning = expected["slo"]["burning"] if expected["slo"] else []
            expected["slo_burning_fast"] = "fast" in burning
            expected["slo_burning_slow"] = "slow" in burning
            assert {n: shown[n] for n in POINT_NUMBERS} == {n: expected[n] for n in POINT_NUMBERS}
            diagnosis = series.diagnosis
            assert (shown["diagnosis"], shown["diagnosis_reason"]) == (
                diagnosis.state,
                diagnosis.reason,
            )
        assert point["t"] == signals.t and point["up"] is signals.up
        assert type(point["budget_saturated"]) is bool
        assert type(point["slo_burning_fast"]) is bool
    assert {s.target: len(s.series) for s in exporter.current()}["mixed"] == 2


def test_the_help_names_every_path_the_app_serves() -> None:
    # The epilog named /api/v1/signals and /history only, when the app also serves
    # /advice and /targets.
    from batchscope.exporter.cli import EPILOG
    from batchscope.exporter.config.settings import Settings, Target
    from batchscope.exporter.scrape.loop import Exporter

    app = create_app(Exporter(Settings(targets=(Target("a", "http://127.0.0.1:1/metrics"),))))
    paths = {r.resource.canonical for r in app.router.routes() if r.method == "GET"} - {"/"}
    assert paths == {
        "/health",
        "/metrics",
        "/api/v1/signals",
        "/api/v1/advice",
        "/api/v1/replicas",
        "/api/v1/history",
        "/api/v1/targets",
    }
    for path in paths:
        assert path in EPILOG, path


@pytest.mark.integration
async def test_metrics_come_gzip_when_asked_and_agree_with_the_plain_body(fed_exporter) -> None:
    # No loop runs between the requests (the rounds are the fixture's, on its clock), so
    # all three are this round's body: the same bytes, packed or not, whatever the speed.
    _, api, _ = fed_exporter
    bodies = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for encoding in ("gzip", "identity", "gzip, deflate"):
            async with session.get(f"{api}/metrics", headers={"Accept-Encoding": encoding}) as r:
                bodies.append((r.headers.get("Content-Encoding"), await r.read()))
    (zipped, packed), (plain_encoding, plain), (again, packed_again) = bodies
    assert (zipped, plain_encoding, again) == ("gzip", None, "gzip")
    assert packed == packed_again
    assert gzip.decompress(packed) == plain
    assert b'batchscope_target_up{target="llm",team="search"} 1.0' in plain
