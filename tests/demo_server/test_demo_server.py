"""The demo server over real HTTP: uvicorn on a free port (in a thread, or a subprocess for
SIGTERM), httpx as the client."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.http.app import ServerConfig, create_app
from batchscope.exporter.core.static_util import static_utilization
from tests.support.demo_http import completion, serve
from tests.support.demo_process import running_demo_server
from tests.support.network import wait_until
from tests.support.paths import fixture_text

pytestmark = pytest.mark.integration

ARTICLE_TRACE = [3, 5, 8, 11, 4, 14, 6, 16]


# Waits poll often: some states they wait for last a moment only.
POLL_SECONDS = 0.02


def wait_for_state(predicate: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    wait_until(predicate, seconds, what, interval=POLL_SECONDS)


def refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def generation(url: str) -> dict[str, object]:
    return httpx.get(f"{url}/health").json()["generation"]


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def server(tmp_dir: Path) -> Iterator[str]:
    """Continuous batching, 2 slots, at most 4 waiting: small enough to overload."""
    config = ServerConfig(
        batching="continuous",
        max_num_seqs=2,
        max_queue=4,
        device="cpu",
        embedding=BatcherSettings(max_batch_size=4),
        request_log=str(tmp_dir / "continuous.jsonl"),
    )
    with serve(config) as url:
        yield url


def test_completion_answers_openai_style_with_usage(server: str) -> None:
    response = completion(server, 12)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["model"] == "batchscope-demo"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18}


def test_streamed_completion_sends_one_chunk_per_token_then_usage_and_done(server: str) -> None:
    body = {
        "prompt": "hi",
        "max_tokens": 7,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 7 + ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 7


def test_embeddings_answer_one_vector_per_input(server: str) -> None:
    response = httpx.post(f"{server}/v1/embeddings", json={"input": ["a", "bb", "ccc"]}, timeout=30)
    assert response.status_code == 200
    data = response.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert len({len(d["embedding"]) for d in data}) == 1
    single = httpx.post(f"{server}/v1/embeddings", json={"input": "a"}, timeout=30).json()
    assert single["data"][0]["embedding"] == pytest.approx(data[0]["embedding"], abs=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", {"max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": 5, "max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "ignore_eos": "perhaps"}, "ignore_eos"),
        ("/v1/completions", {"prompt": "x", "stream": [1]}, "stream"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": ["ok", 3]}, "input"),
        ("/v1/embeddings", {}, "input"),
        ("/admin/config", {"max_num_seqs": 0}, "max_num_seqs"),
        ("/admin/config", {"max_wait": 3}, "max_wait"),
    ],
)
def test_malformed_request_gets_400_naming_the_field_and_never_runs(
    server: str, path: str, body: dict[str, object], field: str
) -> None:
    before = generation(server)
    response = httpx.post(f"{server}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert field in error["message"]
    assert error["param"].startswith(field)
    after = generation(server)
    assert (after["steps"], after["finished"]) == (before["steps"], before["finished"])


def test_body_that_is_not_json_gets_400_naming_the_body(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


def test_unknown_model_gets_404_naming_the_model(server: str) -> None:
    response = completion(server, 2, model="gpt-9")
    assert response.status_code == 404
    assert "gpt-9" in response.json()["error"]["message"]


def test_overload_answers_429_with_retry_after_and_a_bounded_queue(server: str) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
            return await asyncio.gather(
                *(client.post(f"{server}/v1/completions", json=body) for _ in range(30))
            )

    responses = asyncio.run(burst())
    rejected = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert len(rejected) + len(served) == 30
    assert len(rejected) >= 10  # 2 slots + 4 waiting; a few more as requests finish
    for response in rejected:
        assert int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"]["type"] == "RateLimitError"
    assert all(r.json()["usage"]["completion_tokens"] == 400 for r in served)
    assert generation(server)["max_waiting_seen"] <= 4  # the queue never held more


def test_client_disconnect_frees_its_slot(server: str) -> None:
    def aborted() -> float:
        text = httpx.get(f"{server}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (
                    sample.name == "vllm:request_success_total"
                    and sample.labels["finished_reason"] == "abort"
                ):
                    return sample.value
        raise AssertionError("no abort series")

    before = aborted()
    # Non-streaming: the client gives up long before 1000 tokens are done.
    with pytest.raises(httpx.ReadTimeout):
        completion_body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
        httpx.post(f"{server}/v1/completions", json=completion_body, timeout=0.1)
    wait_for_state(lambda: aborted() == before + 1, "one abort")
    # Streaming: read a few tokens, then hang up.
    body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    wait_for_state(lambda: aborted() == before + 2, "two aborts")
    wait_for_state(lambda: generation(server)["running"] == 0, "none running")
    assert completion(server, 3).json()["usage"]["completion_tokens"] == 3


def test_every_vllm_name_served_exists_with_the_same_type_in_vllm_0_32(server: str) -> None:
    completion(server, 3)
    served = {
        f.name: f.type for f in text_string_to_metric_families(httpx.get(f"{server}/metrics").text)
    }
    real = {
        f.name: f.type
        for f in text_string_to_metric_families(fixture_text("vllm-0.32.0-cpu-load.txt"))
    }
    vllm_names = {name: kind for name, kind in served.items() if name.startswith("vllm:")}
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions",
        "vllm:kv_cache_usage_perc",
        "vllm:request_generation_tokens",
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:generation_tokens",
        "vllm:request_success",
    } <= vllm_names.keys()
    for name, kind in vllm_names.items():
        assert real.get(name) == kind, f"{name}: served {kind}, vLLM 0.32 has {real.get(name)}"


def test_metrics_buckets_and_labels_match_vllm(server: str) -> None:
    text = httpx.get(f"{server}/metrics").text
    real = fixture_text("vllm-0.32.0-cpu-load.txt")

    def buckets(payload: str, name: str) -> list[str]:
        for family in text_string_to_metric_families(payload):
            if family.name == name:
                return [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
        raise AssertionError(name)

    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_num_preemptions",
        "vllm:iteration_tokens_total",
    ):
        assert buckets(text, name) == buckets(real, name), name
    # Token-count buckets are vLLM's 1-2-5 series up to the model length (512 there, 1024 here).
    assert buckets(text, "vllm:request_generation_tokens") == [
        *buckets(real, "vllm:request_generation_tokens")[:-1],
        "1000.0",
        "+Inf",
    ]
    assert 'vllm:num_requests_running{engine="0",model_name="batchscope-demo"}' in text
    assert 'batchscope_demo_device_info{device="cpu",simulated="false"} 1.0' in text
    assert 'batchscope_demo_max_num_seqs{engine="0",model_name="batchscope-demo"} 2.0' in text


def test_admin_changes_settings_at_run_time_and_refuses_other_hosts(server: str) -> None:
    response = httpx.post(
        f"{server}/admin/config", json={"max_batch_size": 8, "max_wait_ms": 2.5}, timeout=10
    )
    assert response.status_code == 200
    assert response.json()["embedding"]["config"]["max_batch_size"] == 8
    assert httpx.get(f"{server}/admin/config").json()["generation"]["max_num_seqs"] == 2

    async def from_elsewhere() -> httpx.Response:
        app = create_app(ServerConfig(device="cpu"))
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://demo") as client:
            return await client.post("/admin/config", json={"max_num_seqs": 64})

    refused = asyncio.run(from_elsewhere())
    assert refused.status_code == 403


def test_health_says_which_device_and_whether_simulated(server: str) -> None:
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok"
    assert health["device"]["device"] == "cpu"
    assert health["device"]["simulated"] is False


def test_static_server_slot_utilization_is_the_articles_formula(tmp_dir: Path) -> None:
    """A blocker request holds the only group while the seed trace queues; the trace then
    runs as one static group, and the server's truth counters show 67/128."""
    log = tmp_dir / "static.jsonl"
    config = ServerConfig(
        batching="static", max_num_seqs=8, device="sim:h200", request_log=str(log)
    )
    with serve(config) as url:

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:

                def post(n: int) -> asyncio.Future[httpx.Response]:
                    body = {"prompt": "hello", "max_tokens": n, "ignore_eos": True}
                    return asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body))

                blocker = post(1018)  # the longest the model allows after a 6-token prompt
                await asyncio.to_thread(
                    wait_for_state, lambda: generation(url)["running"] == 1, "the blocker running"
                )
                trace = [post(n) for n in ARTICLE_TRACE]
                await asyncio.to_thread(
                    wait_for_state, lambda: generation(url)["waiting"] == 8, "the trace waiting"
                )
                assert generation(url)["running"] == 1, "the blocker must still hold the group"
                return [await blocker, *[await t for t in trace]]

        responses = asyncio.run(run())
        tokens = [r.json()["usage"]["completion_tokens"] for r in responses]
        assert tokens == [1018, *ARTICLE_TRACE]
        text = httpx.get(f"{url}/metrics").text
        metrics = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    useful = metrics["batchscope_demo_useful_slot_steps_total"] - 1018
    paid = metrics["batchscope_demo_slot_steps_total"] - 8 * 1018
    assert useful / paid == 0.5234375 == static_utilization(ARTICLE_TRACE)
    assert 'batchscope_demo_device_info{device="sim:h200",simulated="true"} 1.0' in text
    lengths = [json.loads(line)["output_tokens"] for line in log.read_text().splitlines()]
    assert sorted(lengths) == sorted([1018, *ARTICLE_TRACE])


@pytest.mark.timeout(180)
def test_sigterm_drains_in_flight_requests_then_exits_zero(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_demo_server(
        *("--device", "cpu", "--max-num-seqs", "4", "--request-log", str(log)),
        *("--log-level", "warning"),
        log=tmp_path / "server.log",
    ) as (url, process):
        port = urlsplit(url).port

        async def in_flight() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"prompt": "drain", "max_tokens": 600, "ignore_eos": True}
                requests = [
                    asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body))
                    for _ in range(6)
                ]
                await asyncio.to_thread(
                    wait_for_state, lambda: generation(url)["running"] == 4, "four running"
                )
                process.send_signal(signal.SIGTERM)
                # Draining admits nothing new: the listener closes (however long a loaded
                # machine takes to get there) while the six are still in flight.
                await asyncio.to_thread(
                    wait_for_state, lambda: refuses_connections(port), "the listener closed", 60
                )
                assert not any(request.done() for request in requests)
                with pytest.raises(httpx.ConnectError):
                    await client.post(f"{url}/v1/completions", json=body)
                return await asyncio.gather(*requests)

        responses = asyncio.run(in_flight())
        assert process.wait(timeout=60) == 0
    assert [r.status_code for r in responses] == [200] * 6
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [600] * 6
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["finish_reason"] for r in records] == ["length"] * 6


def test_models_lists_the_served_model_as_openai_and_vllm_do(server: str) -> None:
    body = httpx.get(f"{server}/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [
        ("batchscope-demo", "model", "batchscope")
    ]


def test_the_openai_python_client_lists_embeds_and_completes(server: str) -> None:
    import openai  # the test extra's; imported here so only this test needs it

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["batchscope-demo"]
    embedded = client.embeddings.create(model="batchscope-demo", input=["one", "two words"])
    assert [len(d.embedding) for d in embedded.data] == [64, 64]
    assert sum(x * x for x in embedded.data[0].embedding) == pytest.approx(1.0, rel=1e-4)
    completed = client.completions.create(
        model="batchscope-demo", prompt="hello", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert completed.usage is not None and completed.usage.completion_tokens == 5
    assert completed.choices[0].finish_reason == "length"
    streamed = client.completions.create(
        model="batchscope-demo",
        prompt="hello",
        max_tokens=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [c for c in streamed if c.choices]
    assert len(chunks) == 4  # one per token, then the one carrying finish_reason
    assert chunks[-1].choices[0].finish_reason == "length"
