"""batchscope-loadgen reading the server as it loads it: --watch, over-saturation, the
knee and the capacity search, against the demo server and a scripted one."""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from batchscope.dashboard import load_format
from batchscope.dashboard.load_format import CAUSES, NO_REQUEST_SEEN
from batchscope.demo_server.http.app import ServerConfig
from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen.oversaturation import MIN_SAMPLES
from batchscope.demo_server.loadgen.workload import LoadSpec
from tests.support.demo_http import serve
from tests.support.threaded_app import serve_in_thread

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    # One sequence at a time on the simulated H200, which paces each forward to at least
    # the H200's time: a request of 32 tokens takes about 40 ms however fast this machine,
    # so the server answers at most about 25 req/s. 40 req/s queues behind the cap for the
    # whole step (p99 in seconds), 5 req/s does not.
    with serve(ServerConfig(batching="continuous", max_num_seqs=1, device="sim:h200")) as url:
        yield url


@pytest.mark.integration
def test_watch_records_each_steps_batching_and_names_the_knees_cause(
    demo: str, tmp_path: Path
) -> None:
    output = tmp_path / "watched.json"
    code = loadgen.main(
        [
            *("--url", demo, "--endpoint", "completions", "--rates", "5,40"),
            *("--duration", "4", "--max-tokens", "32", "--slo-ms", "600"),
            *("--watch", f"{demo}/metrics", "--engine", "vllm", "--cap", "1"),
            *("--output", str(output), "--report", str(tmp_path / "report.html")),
        ]
    )
    assert code == 0
    body = json.loads(output.read_text())
    low, high = body["runs"]
    for run in body["runs"]:
        # vllm bench serve's fields stay, in order; `batching` is an addition.
        assert list(run) == [*load_format.RECORD_FIELDS, "batching"]
        batching = run["batching"]
        assert batching["cap"] == 1.0 and batching["engine"] == "vllm"
        # A scrape a second from the end of the 0.8 s warm-up to the step's last answer
        # (3.2 s at least; longer while a queue drains), the window spanning them.
        assert batching["evaluations"] >= 3 and batching["unread"] == 0
        assert batching["window_seconds"] >= 2.0
        assert sum(batching["diagnosis_shares"].values()) == pytest.approx(1.0)
        assert sum(batching["binding_shares"].values()) == pytest.approx(1.0)
        assert 0 <= batching["running_mean"] <= batching["running_max"] <= 1
    # 5 req/s of ~40 ms: a scrape finds one running (the cap) or none; nothing waits long.
    assert low["batching"]["binding_limit"] in ("requests", "arrivals", None)
    assert low["batching"]["waiting_mean"] < 1 < high["batching"]["waiting_mean"]
    assert high["batching"]["binding_limit"] == "requests"
    assert high["batching"]["running_max"] == 1 and high["batching"]["waiting_mean"] > 1
    # The knee: the first step over the SLO (at 40 req/s, over the server's ~25 req/s;
    # at 5 req/s only on a machine slow enough to put it over too), named with that
    # step's binding limit.
    [knee] = body["knees"]
    step = {run["rate"]: run for run in body["runs"]}[knee["rate"]]
    assert knee["reason"] == "slo" and step["p99_e2el_ms"] > 600
    assert all(run["p99_e2el_ms"] <= 600 for run in body["runs"] if run["rate"] < knee["rate"])
    assert knee["binding_limit"] == step["batching"]["binding_limit"]
    assert knee["sentence"].endswith(CAUSES.get(str(knee["binding_limit"]), NO_REQUEST_SEEN))
    if knee["rate"] == 40.0:
        assert "the batch stopped at 1 of 1 running" in knee["sentence"]
    report = (tmp_path / "report.html").read_text()
    assert html.escape(knee["sentence"]) in report
    # Self-contained: plotly's JavaScript inlined, nothing fetched from a network.
    assert 'src="http' not in report and len(report) > 1_000_000
    assert report.count("Plotly.newPlot") == 2
    csv_header = output.with_suffix(".csv").read_text().splitlines()[0]
    assert csv_header.endswith(
        "binding_limit,diagnosis,running_mean,running_max,cap,"
        "waiting_mean,kv_usage_max,preemptions_per_s,tokens_per_step"
    )


@pytest.mark.integration
def test_find_capacity_brackets_the_demo_servers_rate_at_the_slo(demo: str, tmp_path: Path) -> None:
    output = tmp_path / "capacity.json"
    code = loadgen.main(
        [
            *("--url", demo, "--endpoint", "completions", "--rates", "5"),
            *("--duration", "3", "--max-tokens", "32", "--slo-ms", "600"),
            *("--find-capacity", "--max-steps", "6", "--precision", "0.25"),
            *("--output", str(output)),
        ]
    )
    assert code == 0
    body = json.loads(output.read_text())
    capacity = body["capacity"]
    runs = body["runs"]
    assert capacity["steps"] == len(runs) <= 6
    assert runs[0]["rate"] == 5.0
    by_rate = {run["rate"]: run for run in runs}
    # The rate found passed (99% within 600 ms), the bracket's top failed.
    assert capacity["rate"] == capacity["low"]
    assert by_rate[capacity["low"]]["slo_attainment"] >= 0.99
    assert capacity["high"] is not None and capacity["high"] > capacity["low"]
    assert by_rate[capacity["high"]]["slo_attainment"] < 0.99
    assert capacity["converged"] == (capacity["high"] <= capacity["low"] * 1.25)


class Hanging:
    """A server that takes every request and never answers: its queue only grows."""

    def __init__(self) -> None:
        self.received = 0

    async def embeddings(self, request: web.Request) -> web.Response:
        await request.read()
        self.received += 1
        await asyncio.sleep(3600)
        return web.json_response({})


@pytest.mark.integration
def test_an_over_saturated_step_ends_early_and_says_so() -> None:
    server = Hanging()
    app = web.Application()
    app.router.add_post("/v1/embeddings", server.embeddings)
    spec = LoadSpec(rates=(20.0,), duration_s=30.0, seed=2, timeout_s=120.0, warmup_share=0.02)
    with serve_in_thread(app, shutdown_timeout=0.1) as url:
        [result] = asyncio.run(loadgen.sweep(url, spec))
    record = result.record(None)
    assert record["over_saturated"]
    # The rule needs MIN_SAMPLES samples a second apart after the 0.6 s warm-up: the step
    # stops after about 6 s of its 30, not at its end.
    assert result.stopped_at_s is not None
    assert MIN_SAMPLES < result.stopped_at_s < 20.0
    assert result.sent < 20.0 * 20.0
    # Nothing answered: every request sent was in flight at the stop and cancelled.
    assert record["errors_by_status"] == {"cancelled": result.sent}
    assert result.saturation_reason is not None and "in flight +" in result.saturation_reason


def test_a_bad_watch_setting_is_refused_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    code = loadgen.main(["--watch", "http://127.0.0.1:1/metrics", "--cap", "-3"])
    assert code == 2
    assert "--cap" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--find-capacity"], "--find-capacity needs --slo-ms"),
        (["--find-capacity", "--slo-ms", "100", "--set", "max_wait_ms=5,10"], "one setting"),
        (["--slo-attainment", "1.5"], "--slo-attainment is a share"),
    ],
)
def test_capacity_flags_that_mean_nothing_are_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_:
        loadgen.main(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
