"""Every dashboard page run by Streamlit's AppTest against a real exporter that scrapes
scripted vLLM-format targets: the numbers, states and words a user sees."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time

import numpy as np
import plotly.io
import pytest
import streamlit as st
from aiohttp import web
from streamlit.testing.v1 import AppTest

from batchscope.dashboard.calculator import ONE_LONG_ANSWER
from batchscope.dashboard.client import signals
from batchscope.dashboard.formatting import plain_markdown
from batchscope.exporter.alerts.specs import SLOW_SCRAPE_SECONDS
from batchscope.exporter.config.settings import Settings, Target
from tests.support.network import free_port, wait_until
from tests.support.paths import REPO, fixture_text
from tests.support.scripted_fleet import (
    BackgroundServer,
    ScriptedTargets,
    fast_settings,
    start_exporter,
    wait_for_states,
)
from tests.support.vllm_payload import VllmState, render

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


VIEWS = REPO / "dashboard" / "views"
ODD_NAME = "**fast** <b>x</b>"
SLO_SCALE = 1e-4
TOO_TIGHT = "the budget is too tight for this traffic, or the server needs more capacity"


def _finishing(n: int, latency: float):
    return lambda state: state.finish(n, latency, 40)


def _stepping(state: VllmState) -> None:
    """A request finishing and ten engine steps of 500 tokens at every scrape."""
    state.finish(1, 1.0, 40)
    state.steps += 10
    state.step_tokens += 10 * 500


@pytest.fixture(scope="module")
def fleet():
    targets = ScriptedTargets(
        {
            "mem": (
                VllmState(running=3, waiting=5, kv_usage=0.95, kv_cache_tokens=1024),
                _finishing(1, 1.0),
            ),
            "sat": (VllmState(running=8, waiting=2, kv_usage=0.5), _finishing(3, 4.0)),
            "fast": (VllmState(running=8, waiting=0, kv_usage=0.4), _finishing(2, 0.4)),
            "tok": (VllmState(running=3, waiting=20, kv_usage=0.05), _stepping),
        }
    )
    targets.start()
    # The SLO windows scaled down (the 6 h window is 2.2 s) so that sat's history covers
    # the short window of every pair within seconds: a burn pair fires only then.
    settings = fast_settings(
        tuple(
            Target(name, url, engine="vllm", cap=8, budget_seconds=2, slo_objective=objective)
            for name, url, objective in (
                ("mem", targets.metrics_url("mem"), None),
                ("sat", targets.metrics_url("sat"), 0.99),
                (ODD_NAME, targets.metrics_url("fast"), None),
                ("dead", f"http://127.0.0.1:{free_port()}/metrics", None),
            )
        )
        + (Target("tok", targets.metrics_url("tok"), cap=8, max_num_batched_tokens=512),)
    )
    exporter = start_exporter(dataclasses.replace(settings, slo_window_scale=SLO_SCALE))
    wait_for_states(
        exporter.url,
        {
            "mem": "memory_bound",
            "sat": "budget_saturated",
            ODD_NAME: "healthy",
            "dead": "down",
            "tok": "token_budget_bound",
        },
    )
    wait_until(
        lambda: any(
            t["target"] == "sat" and t["total"]["slo"]["burning"] == ["fast", "slow"]
            for t in signals(exporter.url)["targets"]
        ),
        20.0,
        "sat burning at both speeds",
    )
    yield exporter.url
    exporter.stop()
    targets.stop()


def page(name: str, exporter_url: str | None = None) -> AppTest:
    st.cache_data.clear()
    at = AppTest.from_file(str(VIEWS / name), default_timeout=30)
    if exporter_url is not None:
        at.session_state["exporter_url"] = exporter_url
    return at.run()


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def decoded(values) -> list:
    """Plotly's JSON stores number arrays as base64 with a dtype."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def not_judged(at: AppTest) -> str:
    """What the limits box could not judge: its headline's tooltip."""
    return next(m.proto.help for m in at.markdown if m.value.startswith("Binding now"))


def test_live_lists_the_fleet_worst_first(fleet) -> None:
    at = page("live.py", fleet)
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["target"]) == ["dead", "sat", "mem", "tok", ODD_NAME]
    assert list(table["state"]) == [
        "down",
        "budget saturated",
        "memory-bound",
        "token-budget-bound",
        "healthy",
    ]
    mem = table.set_index("target").loc["mem"]
    assert (mem["running"], mem["cap"], mem["waiting"]) == (3, 8, 5)
    assert mem["kv_cache_usage"] == pytest.approx(0.95)


def test_memory_bound_target_shows_the_word_its_reason_and_next_step(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value("mem").run()
    shown = texts(at.markdown)
    assert ":orange-badge[memory-bound]" in shown
    assert any("KV cache 95% full" in t and "a higher cap will not help" in t for t in shown)
    assert any(t.startswith("**Next:** Spend your time on KV cache memory") for t in shown)
    values = metrics(at)
    assert values["KV cache"] == "95%"
    assert values["running / cap"] == "3 / 8"
    assert values["waiting"] == "5"


def test_what_limits_the_batch_names_the_token_budget_with_its_bar(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value("tok").run()
    assert not at.exception
    shown = texts(at.markdown)
    assert ":orange-badge[token-budget-bound]" in shown
    assert "Binding now: **token budget (--max-num-batched-tokens)**." in shown
    bars = {bar.text: bar.value for bar in at.get("progress")}
    token_bar = next(text for text in bars if text.startswith("▶ token budget"))
    assert token_bar == plain_markdown(
        "▶ token budget (--max-num-batched-tokens): 98% of its bound, 500.0 tokens per step "
        "of a 512-token budget"
    )
    requests_bar = next(text for text in bars if text.startswith("requests"))
    assert requests_bar == plain_markdown(
        "requests (the cap, --max-num-seqs): 38% of its bound, 3 of 8 running"
    )
    assert bars[token_bar] == 97  # percent filled: 500 / 512
    # The first screen: the binding limit alone, filled to its reading.
    first = next(text for text in bars if text.startswith("Binds"))
    assert first == plain_markdown(
        "Binds: the token budget, 500.0 tokens per step of a 512-token budget"
    )
    assert bars[first] == 97
    assert not_judged(at).startswith("Not judged here: ")
    assert plain_markdown("max wait (batches fired by the timeout)") in not_judged(at)
    # The memory-bound target: the KV cache binds; it ran no engine step in the window.
    at.selectbox(key="live_target").set_value("mem").run()
    assert "Binding now: **KV cache**." in texts(at.markdown)
    assert plain_markdown("no step ran in the window") in not_judged(at)


def test_memory_bound_target_shows_the_advice_with_its_numbers(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value("mem").run()
    # 95% of 1024 KV tokens over 3 running: 324 tokens each; the cache kept 95% full while
    # requests waited, so 3 fit (what runs), cap 8: 8 x 324 / 0.95 = 2731 tokens needed.
    assert "**Advice:** " + plain_markdown(
        "memory-bound: raising max-num-seqs will not help: the KV cache holds "
        "3 requests of today's mix, below the cap of 8"
    ) in texts(at.markdown)
    table = at.dataframe[1].value.set_index("what")
    assert table.loc["KV cache capacity", "value"] == "1,024 tokens"
    assert table.loc["KV tokens per running request, now", "value"] == "324 tokens"
    assert table.loc["Requests the KV cache holds at today's mix", "value"] == "3 requests"
    assert table.loc["KV cache kept full while requests wait", "value"] == "95%"
    assert table.loc["Would a higher cap help?", "value"] == "no"
    assert table.loc["KV tokens the cap needs", "value"] == "2,731 tokens"
    assert "kv_capacity_tokens 1024" in table.loc["KV cache capacity", "inputs"]
    assert table.loc["Would a higher cap help?", "confidence"].startswith("medium (short window")


def test_saturated_target_shows_the_banner_and_its_utilisation(fleet) -> None:
    at = page("live.py", fleet)
    banners = [e for e in at.expander if e.label.startswith(":red[**Budget saturated: sat**")]
    assert len(banners) == 1
    # One line: the target, the state, for how long, how far over; the reason folded in it.
    assert banners[0].label.endswith("p99 at 249% of the 2 s budget]")
    assert "\n" not in banners[0].label
    assert TOO_TIGHT in banners[0].markdown[0].value
    at.selectbox(key="live_target").set_value("sat").run()
    # all requests took 4 s, bucket (2.5, 5]: p99 = 2.5 + 0.99 * 2.5 = 4.975 s of a 2 s budget
    assert metrics(at)["budget used"] == "249%"
    latency = metrics(at)["p99 latency"]
    assert latency.endswith(" s") and float(latency[:-2]) == pytest.approx(4.975, abs=0.006)
    assert ":red-badge[budget saturated]" in texts(at.markdown)


def test_a_target_breaking_its_promise_shows_attainment_burn_and_the_alert(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value("sat").run()
    assert not at.exception
    values = metrics(at)
    # Every request at 4 s against 2 s, a bucket edge: none within, exactly.
    assert values["requests within the budget"] == "0.0%"
    assert values["objective"] == "99.00%"
    assert values["burn 5m"] == "100x" and values["burn 3d"] == "100x"
    # Not known until the exporter's history covers the period: a dash, and why.
    assert values["error budget left"] == "–"
    why = next(m.proto.help for m in at.metric if m.label == "error budget left")
    assert why.startswith("–: not known yet: the exporter's history covers ")
    assert why.endswith(" of the 30 d compliance period.")
    broken = [t for t in texts(at.error) if t.startswith("Breaking the latency promise")]
    assert len(broken) == 1 and "BatchingSLOBurnFast (a page)" in broken[0]
    assert any("BatchingSLOBurnSlow (a ticket)" in t for t in texts(at.warning))
    assert plain_markdown("Exact: 2 s is a bucket edge of the e2e histogram.") in [
        c.value for c in at.caption
    ]
    # A target with a budget and no objective: attainment, and no burn.
    at.selectbox(key="live_target").set_value("mem").run()
    assert metrics(at)["requests within the budget"] == "100.0%"
    assert "burn 5m" not in metrics(at)
    assert any(c.value.startswith("No slo_objective for this target") for c in at.caption)


def test_dead_target_says_what_to_check(fleet) -> None:
    at = page("live.py", fleet)
    assert at.selectbox(key="live_target").value == "dead"  # the worst is selected first
    down = [t for t in texts(at.error) if t.startswith("This target does not answer")]
    assert len(down) == 1 and "Check the URL and port" in down[0]


def test_target_names_are_shown_as_text_not_markdown(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value(ODD_NAME).run()
    assert texts(at.subheader)[-1] == f"Target {plain_markdown(ODD_NAME)}"
    assert r"\*\*fast\*\* \<b\>x\</b\>" in texts(at.subheader)[-1]
    assert ":green-badge[healthy]" in texts(at.markdown)


def test_charts_carry_units_the_threshold_and_the_cap(fleet) -> None:
    at = page("live.py", fleet)
    at.selectbox(key="live_target").set_value("sat").run()
    figures = [plotly.io.from_json(c.proto.spec) for c in at.get("plotly_chart")]
    by_title = {f.layout.title.text: f for f in figures}
    budget = by_title["Latency budget utilisation (shaded: sustained saturation)"]
    assert budget.layout.yaxis.title.text == "latency quantile / budget"
    assert budget.layout.yaxis.tickformat == ".0%"
    assert [s.y0 for s in budget.layout.shapes if s.type == "line"] == [0.95]
    assert any(s.type == "rect" for s in budget.layout.shapes)  # saturated stretch shaded
    running = by_title["Running batch vs cap"]
    assert [t.name for t in running.data] == ["running", "cap"]
    assert set(decoded(running.data[1].y)) == {8}
    assert by_title["KV cache usage"].layout.yaxis.title.text == "KV cache used"


def test_a_dead_exporter_is_named_and_the_last_data_stays_with_its_age() -> None:
    targets = ScriptedTargets({"one": (VllmState(running=2, waiting=0), _finishing(1, 0.3))})
    targets.start()
    exporter = start_exporter(fast_settings((Target("one", targets.metrics_url("one"), cap=8),)))
    wait_for_states(exporter.url, {"one": "underloaded"})
    at = page("live.py", exporter.url)
    assert list(at.dataframe[0].value["target"]) == ["one"]
    exporter.stop()
    targets.stop()
    st.cache_data.clear()
    at.run()
    problems = texts(at.error)
    assert any("cannot reach" in t and "\\-\\-exporter" in t for t in problems), problems
    assert any(t.startswith("Showing the last data received") for t in texts(at.warning))
    assert list(at.dataframe[0].value["target"]) == ["one"]


def test_calculator_shows_the_articles_examples() -> None:
    at = page("calculator.py")
    assert not at.exception
    toy = at.dataframe[0].value
    assert list(toy["static utilisation"]) == [0.5234375, 0.25]
    assert metrics(at)["Static utilisation at B=8"] == "0.5234375"
    shown = texts(at.markdown)
    assert "Static: **67 of 128** slot-steps do work (52.3%)." in shown
    assert any(
        t.startswith("Continuous, with requests like these waiting: **128 of 128**") for t in shown
    )
    at.radio(key="calculator_source").set_value(ONE_LONG_ANSWER).run()
    assert metrics(at)["Static utilisation at B=8"] == "0.25"
    assert len(at.get("plotly_chart")) == 2


def test_calculator_streams_an_upload_and_reports_bad_lines() -> None:
    at = page("calculator.py")
    at.radio(key="calculator_source").set_value("upload a file").run()
    at.text_input(key="calculator_sizes").set_value("4, 8").run()
    # groups of 4 hold 1, 2, 3, 4: 10 useful of 16 paid slot-steps
    lines = [str(i % 4 + 1) for i in range(100_000)] + ["oops", "-3"]
    at.file_uploader(key="calculator_file").upload(
        "lengths.txt", "\n".join(lines).encode(), "text/plain"
    ).run()
    assert not at.exception
    results = at.dataframe[1].value.set_index("batch_size")
    assert results.loc[4, "static_utilization"] == 0.625
    assert results.loc[4, "requests"] == 100_000
    assert results.loc[8, "static_utilization"] == 0.625
    assert any(t.startswith("2 lines held no valid length") for t in texts(at.warning))


def test_calculator_rejects_a_bad_batch_size() -> None:
    at = page("calculator.py")
    at.text_input(key="calculator_sizes").set_value("8, 0").run()
    assert texts(at.error) == ["'0' is not a batch size (a whole number from 1)"]


LOADGEN = [
    {
        "setting": {"max_wait_ms": 5},
        "rate_per_s": 10,
        "duration_s": 10,
        "sent": 100,
        "ok": 100,
        "throughput_per_s": 10.0,
        "p50_ms": 20.0,
        "p99_ms": 80.0,
    },
    {
        "setting": {"max_wait_ms": 5},
        "rate_per_s": 50,
        "duration_s": 10,
        "sent": 500,
        "ok": 500,
        "throughput_per_s": 40.0,
        "p50_ms": 30.0,
        "p99_ms": 400.0,
    },
]
VLLM_BENCH = {
    "label": "vllm",
    "request_rate": 5,
    "request_throughput": 4.0,
    "completed": 100,
    "latencies": [0.05] * 90 + [2.0] * 10,
}


def test_load_tests_page_compares_loadgen_and_vllm_results() -> None:
    at = page("load_tests.py")
    at.number_input(key="load_slo").set_value(100.0)
    at.file_uploader(key="load_files").set_value(
        [
            ("sweep.json", json.dumps(LOADGEN).encode(), "application/json"),
            ("vllm.json", json.dumps(VLLM_BENCH).encode(), "application/json"),
        ]
    ).run()
    assert not at.exception
    runs = at.dataframe[0].value
    assert list(runs["setting"]) == ["max_wait_ms=5", "max_wait_ms=5", "vllm"]
    # p99 80 ms within 100 ms: at least 99% in time; p50 30 <= 100 < p99 400: 50% to 99%
    assert list(runs["goodput_per_s"]) == pytest.approx([9.9, 20.0, 3.6])
    assert list(runs["goodput_upper_per_s"]) == pytest.approx([10.0, 39.6, 3.6])
    assert list(runs["goodput_exact"]) == [False, False, True]
    assert runs["p99_ms"].iloc[2] == pytest.approx(2000.0)
    assert len(at.get("plotly_chart")) == 2


def watched_step(rate: float, throughput: float, p99: float, binding: str, state: str) -> dict:
    return {
        "setting": {},
        "rate": rate,
        "request_throughput": throughput,
        "p50_e2el_ms": p99 / 2,
        "p99_e2el_ms": p99,
        "batching": {
            "binding_limit": binding,
            "diagnosis": state,
            "running_mean": 3.0,
            "running_max": 8.0 if binding == "kv_cache" else 4.0,
            "cap": 8.0,
            "waiting_mean": 2.0,
            "kv_usage_max": 0.99 if binding == "kv_cache" else 0.3,
            "preemptions_per_s": 3.0 if binding == "kv_cache" else 0.0,
        },
    }


WATCHED = {
    "slo_ms": 500.0,
    "runs": [
        watched_step(10.0, 10.0, 100.0, "arrivals", "underloaded"),
        watched_step(20.0, 19.5, 200.0, "arrivals", "healthy"),
        watched_step(40.0, 20.5, 3000.0, "kv_cache", "memory_bound"),
    ],
    "capacity": {"rate": 22.0, "low": 22.0, "high": 24.0, "steps": 6, "converged": True},
}


def test_load_tests_page_marks_knee_capacity_and_binding_limits_of_a_watched_run() -> None:
    at = page("load_tests.py")
    at.number_input(key="load_slo").set_value(500.0)
    at.file_uploader(key="load_files").set_value(
        [
            ("watched.json", json.dumps(WATCHED).encode(), "application/json"),
            ("old.json", json.dumps(LOADGEN).encode(), "application/json"),
        ]
    ).run()
    assert not at.exception
    runs = at.dataframe[0].value
    watched = runs[runs["source"] == "watched.json"]
    assert list(watched["binding_limit"]) == ["arrivals", "arrivals", "kv_cache"]
    assert list(watched["preemptions_per_s"]) == [0.0, 0.0, 3.0]
    # The file without `batching` opens as before, its batching columns empty.
    assert runs[runs["source"] == "old.json"]["binding_limit"].isna().all()
    # The file's name in bold (its own characters inert), as the page draws it.
    names = [m.value.split(":")[0] for m in at.markdown if m.value.startswith("**")]
    assert names == ["**watched\\.json**", "**watched\\.json**"]
    said = " ".join(m.value for m in at.markdown).replace("\\", "")  # markdown escapes
    assert (
        "knee at 40 req/s: p99 3,000 ms crossed the 500 ms SLO, the batch stopped at 8 of 8 "
        "running with the KV cache full and 3 preemptions/s and 2 waiting: memory-bound; a "
        "higher --max-num-seqs will not help" in said
    )
    assert "watched.json**: capacity at the SLO 22 req/s (bracket 22..24)" in said
    latency = plotly.io.from_json(at.get("plotly_chart")[0].proto.spec)
    shapes = latency.layout.shapes
    bands = [s for s in shapes if s.type == "rect"]
    assert len(bands) == 3  # one per watched step; the old file has none
    assert [s.fillcolor for s in bands][2] == "#ea580c"  # memory-bound's colour
    lines = sorted(s.x0 for s in shapes if s.type == "line" and s.xref == "x")
    assert lines == [22.0, 40.0]  # the capacity and the knee
    labels = {a.text for a in latency.layout.annotations}
    assert {"kv_cache", "arrivals"} <= labels


def test_load_tests_page_says_what_is_wrong_with_a_file() -> None:
    at = page("load_tests.py")
    at.file_uploader(key="load_files").set_value([("bad.json", b"{oops", "application/json")])
    at.run()
    assert any(t.startswith("bad\\.json\\: not JSON") for t in texts(at.error))
    assert texts(at.info) == ["No results opened yet."]


def test_alerts_lists_the_ongoing_saturation_episode(fleet) -> None:
    at = page("alerts.py", fleet)
    assert not at.exception
    episodes = at.dataframe[0].value
    assert list(episodes["target"]) == ["sat"]
    assert bool(episodes["ongoing"].iloc[0]) is True
    assert episodes["peak_utilization"].iloc[0] == pytest.approx(2.4875)
    assert any(t.startswith("**sat** is saturated now") for t in texts(at.error))
    # sat also breaks its promise; the other targets set no objective.
    burns = at.dataframe[1].value
    assert set(burns["target"]) == {"sat"} and all(burns["ongoing"])
    assert set(burns["alert"]) == {"BatchingSLOBurnFast (page)", "BatchingSLOBurnSlow (ticket)"}
    assert list(burns["lowest"]) == [0.0, 0.0]
    assert any(t.startswith("**sat** is breaking its latency promise now") for t in texts(at.error))


def fake_prometheus(now: float, queries: list[str]) -> web.Application:
    """Prometheus' HTTP API answering with a scripted range of the exporter's metrics."""
    times = [now - 300 + 60 * i for i in range(5)]

    async def labels(_: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": ["gpu-1"]})

    async def query_range(request: web.Request) -> web.Response:
        queries.append(request.query["query"])
        series = [
            ("batchscope_budget_saturated", ["0", "1", "1", "0", "0"]),
            ("batchscope_budget_utilization_ratio", ["0.9", "1.1", "1.4", "0.5", "0.4"]),
        ]
        result = [
            {
                "metric": {"__name__": name, "target": "gpu-1"},
                "values": [[t, v] for t, v in zip(times, values, strict=True)],
            }
            for name, values in series
        ]
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}
        )

    app = web.Application()
    app.router.add_get("/api/v1/label/target/values", labels)
    app.router.add_get("/api/v1/query_range", query_range)
    return app


def test_alerts_read_longer_history_from_prometheus() -> None:
    queries: list[str] = []
    prometheus = BackgroundServer(fake_prometheus(time.time(), queries))
    prometheus.start()
    try:
        st.cache_data.clear()
        at = AppTest.from_file(str(VIEWS / "alerts.py"), default_timeout=30)
        at.session_state["prometheus_url"] = prometheus.url
        at.run()
    finally:
        prometheus.stop()
    assert not at.exception
    episodes = at.dataframe[0].value
    assert list(episodes["target"]) == ["gpu-1"]
    assert episodes["duration_seconds"].iloc[0] == pytest.approx(120.0)
    assert episodes["peak_utilization"].iloc[0] == pytest.approx(1.4)
    assert not bool(episodes["ongoing"].iloc[0])
    assert 'target="gpu-1"' in queries[0]


def test_the_app_opens_on_the_live_page(fleet) -> None:
    st.cache_data.clear()
    at = AppTest.from_file(str(VIEWS.parent / "app.py"), default_timeout=30)
    at.session_state["exporter_url"] = fleet
    at.run()
    assert not at.exception
    assert texts(at.title) == ["Is batching doing its job?"]
    assert list(at.dataframe[0].value["target"])[0] == "dead"


def _in_turn(payloads: list[str]):
    """A handler answering each payload in turn, then the last one again."""
    queue = list(payloads)

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=queue.pop(0) if len(queue) > 1 else queue[0])

    return handler


def _serving(payloads: dict[str, list[str]]) -> BackgroundServer:
    """/NAME/metrics for each target's payloads."""
    app = web.Application()
    for name, texts_ in payloads.items():
        app.router.add_get(f"/{name}/metrics", _in_turn(texts_))
    return BackgroundServer(app)


@pytest.fixture(scope="module")
def engines_fleet():
    """A llama.cpp server and a TGI router, from their written payloads."""
    server = _serving(
        {
            "llama": [fixture_text("llamacpp-b4500-a.txt"), fixture_text("llamacpp-b4500-b.txt")],
            "tgi": [fixture_text("tgi-3.x-a.txt"), fixture_text("tgi-3.x-b.txt")],
        }
    )
    server.start()
    settings = fast_settings(
        (
            Target("llama", f"{server.url}/llama/metrics", cap=4),
            Target("tgi", f"{server.url}/tgi/metrics", token_cap=16000),
        )
    )
    exporter = start_exporter(settings)
    wait_for_states(exporter.url, {"llama": "healthy", "tgi": "healthy"})
    yield exporter.url
    exporter.stop()
    server.stop()


def test_a_signal_the_engine_lacks_says_so_instead_of_a_blank(engines_fleet) -> None:
    at = page("live.py", engines_fleet)
    at.selectbox(key="live_target").set_value("llama").run()
    assert not at.exception
    values = metrics(at)
    assert values["running / cap"] == "4 / 4"
    assert values["KV cache"] == "74%"
    # Said once a group, not a dash a tile (a dash a tile once cut its words off).
    assert "preemptions/s" not in values and "p99 latency" not in values
    captions = [c.value for c in at.caption]
    window = "Not exposed by this engine (llamacpp): preemptions/s, requests/s, latency, "
    assert window + "throughput gain." in captions
    overview = plotly.io.from_json(at.get("plotly_chart")[0].proto.spec)
    assert overview.layout.title.text == (
        "Batch and queue (budget used: not exposed by this engine)"
    )
    notes = [t for t in texts(at.info) if "not exposed by this engine" in t]
    assert "**Preemptions**: not exposed by this engine (llamacpp)." in notes
    assert (
        "**Latency budget utilisation (shaded: sustained saturation)**: not exposed by "
        "this engine (llamacpp)." in notes
    )
    titles = {plotly.io.from_json(c.proto.spec).layout.title.text for c in at.get("plotly_chart")}
    assert {"Running batch vs cap", "KV cache usage", "Waiting requests"} <= titles
    assert "Preemptions" not in titles


def test_a_token_cap_is_shown_beside_the_request_cap(engines_fleet) -> None:
    at = page("live.py", engines_fleet)
    at.selectbox(key="live_target").set_value("tgi").run()
    values = metrics(at)
    assert values["batch tokens / token cap"] == "15500 / 16000"
    assert "KV cache" not in values
    now = next(
        c.value for c in at.caption if c.value.startswith("Not exposed by this engine (tgi)")
    )
    assert "KV cache" in now
    assert any("a token cap, not a request cap" in t for t in texts(at.markdown))


def test_a_slow_target_is_called_slow_before_it_is_down() -> None:
    # A /metrics that answers in 2.8 s: slower than SLOW_SCRAPE_SECONDS (2.5 s), well
    # within the timeout. The page says so while the target is up.
    state = VllmState(running=8, waiting=0, kv_usage=0.4)

    async def slow(_: web.Request) -> web.Response:
        state.finish(2, 0.4, 40)
        await asyncio.sleep(2.8)
        return web.Response(text=render(state))

    app = web.Application()
    app.router.add_get("/metrics", slow)
    target = BackgroundServer(app)
    target.start()
    settings = Settings(
        targets=(Target("slow", f"{target.url}/metrics", engine="vllm", cap=8, budget_seconds=2),),
        interval_seconds=1.0,
        window_seconds=10.0,
        timeout_seconds=5.0,
    )
    exporter = start_exporter(settings)
    try:
        wait_for_states(exporter.url, {"slow": "healthy"}, seconds=30)
        at = page("live.py", exporter.url)
    finally:
        exporter.stop()
        target.stop()
    assert SLOW_SCRAPE_SECONDS == 2.5
    slow_words = [t for t in texts(at.warning) if t.startswith("This target's /metrics is slow")]
    assert len(slow_words) == 1, texts(at.warning)
    took = float(slow_words[0].split("the last scrape took ")[1].split(" s ")[0])
    assert 2.8 <= took < 5.0, slow_words[0]
    assert not [t for t in texts(at.error) if t.startswith("This target does not answer")]
