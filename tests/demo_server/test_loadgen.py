"""batchscope-loadgen: arrival processes, result records, files, and servers that fail."""

from __future__ import annotations

import asyncio
import csv
import json
import random
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from batchscope.dashboard import load_format
from batchscope.demo_server.loadgen import report as loadgen_report
from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen import workload
from batchscope.demo_server.loadgen.workload import LoadSpec
from batchscope.exporter.length_log import InputError
from tests.support.network import free_port
from tests.support.threaded_app import serve_in_thread

pytestmark = pytest.mark.timeout(120)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


@pytest.mark.parametrize(
    ("process", "burstiness", "coefficient_of_variation"),
    [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5), ("constant", 1.0, 0.0)],
)
def test_arrival_processes_have_the_asked_mean_rate_and_shape(
    process: str, burstiness: float, coefficient_of_variation: float
) -> None:
    # 200/s for 50 s: ~10,000 gaps. The gap mean's standard error is CV/sqrt(n), under
    # 2%; the CV's own spread at this n is a few percent: 10% is several of either.
    times = workload.arrival_times(200.0, 50.0, random.Random(11), process, burstiness)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 50.0
    assert len(times) == pytest.approx(10_000, rel=0.06)
    intervals = gaps(times)
    assert statistics.fmean(intervals) == pytest.approx(1 / 200, rel=0.06)
    cv = statistics.pstdev(intervals) / statistics.fmean(intervals)
    assert cv == pytest.approx(coefficient_of_variation, abs=0.1 * max(1.0, cv))


def test_arrival_processes_refuse_what_has_no_meaning() -> None:
    with pytest.raises(ValueError, match="arrivals must be one of"):
        workload.arrival_times(10.0, 1.0, random.Random(0), "bursty")
    with pytest.raises(ValueError, match="burstiness"):
        workload.arrival_times(10.0, 1.0, random.Random(0), "gamma", 0.0)


def test_record_reads_percentiles_goodput_and_throughput_off_known_data() -> None:
    result = loadgen_report.RunResult(
        {"max_wait_ms": 5},
        100.0,
        10.0,
        sent=104,
        ok=100,
        elapsed_s=10.0,
        endpoint="completions",
        output_tokens=1600,
    )
    result.latencies_ms = [float(v) for v in range(1, 101)]  # 1..100 ms
    result.ttfts_ms = [float(v) / 10 for v in range(1, 101)]  # 0.1..10 ms
    for status in ("429", "429", "500", "timeout"):
        result.fail(status)
    record = result.record(slo_ms=40.0)
    assert set(load_format.RECORD_FIELDS) == set(record)
    assert record["p50_e2el_ms"] == pytest.approx(50.5)
    assert record["p90_e2el_ms"] == pytest.approx(90.1)
    assert record["p99_e2el_ms"] == pytest.approx(99.01)
    assert record["mean_e2el_ms"] == pytest.approx(50.5)
    assert record["mean_ttft_ms"] == pytest.approx(5.05)
    assert record["p99_ttft_ms"] == pytest.approx(9.901)
    assert record["request_throughput"] == 10.0
    assert record["output_throughput"] == 160.0
    assert record["goodput"] == 4.0  # 40 of the answers within 40 ms, over 10 s
    assert (record["completed"], record["failed"]) == (100, 4)
    assert record["errors_by_status"] == {"429": 2, "500": 1, "timeout": 1}
    assert (result.errors, result.rejected_429) == (2, 2)
    assert record["rate"] == 100.0 and record["setting"] == {"max_wait_ms": 5}
    assert record["output_throughput"] is not None
    embeddings = loadgen_report.RunResult({}, 1.0, 1.0, endpoint="embeddings").record(None)
    assert embeddings["output_throughput"] is None and embeddings["goodput"] is None


def test_a_generator_that_falls_behind_its_schedule_says_so() -> None:
    on_time = loadgen_report.RunResult({}, 10.0, 1.0, send_lags_ms=[0.5] * 100)
    assert on_time.record(None)["behind_schedule"] is False
    late = loadgen_report.RunResult({}, 10.0, 1.0, send_lags_ms=[0.5] * 90 + [40.0] * 10)
    record = late.record(None)
    assert record["behind_schedule"] is True and record["max_send_lag_ms"] == 40.0
    assert "BEHIND SCHEDULE" in loadgen_report.behind_schedule_note(record)


def test_output_lengths_come_from_any_length_file(tmp_path: Path) -> None:
    plain = tmp_path / "lengths.txt"
    plain.write_text("# output tokens\n12\n7\n300\n")
    assert workload.lengths_from_file(str(plain)) == [12, 7, 300]
    jsonl = tmp_path / "requests.jsonl"
    jsonl.write_text('{"output_tokens": 5}\n{"output_tokens": 9}\n')
    assert workload.lengths_from_file(str(jsonl)) == [5, 9]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(InputError, match="empty.txt: no output lengths"):
        workload.lengths_from_file(str(empty))
    draws = workload.lognormal_lengths(5000, 40.0, 1.0, 400, random.Random(2))
    assert statistics.median(draws) == pytest.approx(40, rel=0.08)
    assert min(draws) >= 1 and max(draws) <= 400


class Troubled:
    """A server whose answers cycle: ok, 500, hang (longer than any client waits)."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: dict[str, int] = {"ok": 0, "500": 0, "hang": 0}
        self.served = 0

    async def embeddings(self, request: web.Request) -> web.Response:
        await request.read()
        kind = ("ok", "500", "hang")[self.served % 3]
        self.served += 1
        self.seen[kind] += 1
        if kind == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if kind == "hang":
            await asyncio.sleep(3600)
        return web.json_response({"data": [{"embedding": [0.0]}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for token in ("a", "b", "c"):
            chunk = {"choices": [{"index": 0, "text": token, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.005)
        usage = {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 2}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response


@pytest.fixture
def troubled() -> Iterator[Troubled]:
    server = Troubled()
    app = web.Application()
    app.router.add_post("/v1/embeddings", server.embeddings)
    app.router.add_post("/v1/completions", server.completions)
    with serve_in_thread(app, shutdown_timeout=0.1) as url:
        server.url = url
        yield server


@pytest.mark.integration
def test_a_server_that_errors_or_hangs_gives_counted_errors_and_a_finished_run(
    troubled: Troubled,
) -> None:
    [result] = asyncio.run(
        loadgen.sweep(troubled.url, LoadSpec(rates=(40.0,), duration_s=0.5, seed=3, timeout_s=0.5))
    )
    record = result.record(None)
    assert result.sent == troubled.served > 6
    assert record["completed"] == troubled.seen["ok"]
    assert record["errors_by_status"] == {
        "500": troubled.seen["500"],
        "timeout": troubled.seen["hang"],
    }
    assert record["completed"] + record["failed"] == result.sent


@pytest.mark.integration
def test_a_dead_server_gives_connection_errors_not_a_crash() -> None:
    port = free_port()  # nobody listens on it
    [result] = asyncio.run(
        loadgen.sweep(f"http://127.0.0.1:{port}", LoadSpec(rates=(20.0,), duration_s=0.3, seed=1))
    )
    assert result.sent > 0
    assert result.record(None)["errors_by_status"] == {"connection": result.sent}


@pytest.mark.integration
def test_streamed_completions_give_ttft_and_output_tokens(troubled: Troubled) -> None:
    [result] = asyncio.run(
        loadgen.sweep(
            troubled.url,
            LoadSpec("completions", rates=(20.0,), duration_s=0.5, seed=5, max_tokens=(3,)),
        )
    )
    record = result.record(None)
    assert result.sent == record["completed"] > 3
    assert record["total_output_tokens"] == 3 * record["completed"]
    assert len(result.ttfts_ms) == record["completed"]
    assert 0 < record["mean_ttft_ms"] < record["mean_e2el_ms"]


@pytest.mark.integration
def test_result_file_holds_vllm_bench_names_with_a_csv_beside_it(
    troubled: Troubled, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("3\n3\n")
    output = tmp_path / "out" / "results.json"
    code = loadgen.main(
        [
            "--base-url",
            troubled.url,
            "--endpoint",
            "completions",
            "--rates",
            "10,20",
            "--duration",
            "0.3",
            "--output-len-file",
            str(lengths),
            "--slo-ms",
            "5000",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    body = json.loads(output.read_text())
    assert body["endpoint"] == "completions" and body["slo_ms"] == 5000.0
    assert [run["rate"] for run in body["runs"]] == [10.0, 20.0]
    for run in body["runs"]:
        assert list(run) == list(load_format.RECORD_FIELDS)
        assert run["goodput"] == pytest.approx(run["request_throughput"])
    with output.with_suffix(".csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["rate"]) for r in rows] == [10.0, 20.0]
    assert [int(r["completed"]) for r in rows] == [run["completed"] for run in body["runs"]]
    assert "wrote" in capsys.readouterr().err


def test_an_unreadable_length_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    assert loadgen.main(["--output-len-file", str(missing), "--endpoint", "completions"]) == 2


def test_embeddings_carry_the_asked_number_of_texts_as_a_list() -> None:
    args = loadgen.build_parser().parse_args(["--inputs-per-request", "4"])
    spec = loadgen.load_spec(args)
    assert spec.inputs_per_request == 4
    body = workload.make_payload("embeddings", random.Random(1), (16,), inputs=4)
    assert len(body["input"]) == 4 and all(isinstance(t, str) and t for t in body["input"])
    # One text stays a string, drawn as before: the bodies of a one-text run do not change.
    one = workload.make_payload("embeddings", random.Random(1), (16,))
    assert one["input"] == body["input"][0]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--inputs-per-request", "0"], "--inputs-per-request must be at least 1"),
        (
            ["--inputs-per-request", "2", "--endpoint", "completions"],
            "--inputs-per-request sends a list of texts to embeddings only",
        ),
    ],
)
def test_inputs_per_request_that_means_nothing_is_refused(flags: list[str], problem: str) -> None:
    from batchscope.demo_server.loadgen.arguments import usage_problem

    assert usage_problem(loadgen.build_parser().parse_args(flags)) == problem


def test_sweep_max_wait_is_the_admin_setting_it_names() -> None:
    args = loadgen.build_parser().parse_args(["--sweep-max-wait", "5,10", "--url", "http://x"])
    assert args.sweep_max_wait == [5.0, 10.0] and args.urls == ["http://x"]


def test_the_dashboard_reads_the_result_file_loadgen_writes(tmp_path: Path) -> None:
    from batchscope.dashboard.load_results import load_result

    result = loadgen_report.RunResult(
        {"max_wait_ms": 5}, 50.0, 2.0, sent=100, ok=100, elapsed_s=2.0
    )
    result.latencies_ms = [float(v) for v in range(1, 101)]
    path, _ = loadgen_report.write_results(tmp_path / "r.json", [result.record(50.0)], {})
    [run] = load_result(path.read_text(), "r.json")
    assert (run.setting, run.rate_per_s, run.throughput_per_s) == ("max_wait_ms=5", 50.0, 50.0)
    assert (run.p50_ms, run.p99_ms) == (50.5, pytest.approx(99.01))
