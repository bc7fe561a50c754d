"""The exporter reading the demo server, held against the server's own truth."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.demo_server.http.app import ServerConfig
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter
from tests.support.demo_http import completion, serve
from tests.support.metrics_doc import DOCUMENTED, family_names

pytestmark = pytest.mark.integration


def truth(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not served")


async def test_static_estimate_brackets_the_demo_servers_true_slot_utilization() -> None:
    config = ServerConfig(batching="static", max_num_seqs=8, device="cpu", max_queue=256)
    rng = random.Random(7)
    lengths = [rng.randint(11, 90) for _ in range(96)]
    with serve(config) as url:
        exporter = Exporter(
            Settings(
                targets=(Target(name="demo", url=f"{url}/metrics", cap=8),),
                window_seconds=600,
                interval_seconds=1,
                timeout_seconds=1,
            )
        )
        async with client_session() as session:
            await exporter.run_round(session)  # the baseline before any request
            with ThreadPoolExecutor(96) as pool:
                answers = list(pool.map(lambda n: completion(url, n), lengths))
            assert all(a.status_code == 200 for a in answers)
            await exporter.run_round(session)
        [signals] = exporter.current()
        true_utilization = truth(url, "batchscope_demo_slot_utilization_ratio")

    by_engine = {s.engine: s for s in signals.series}
    assert set(by_engine) == {"vllm", "inhouse"}  # generation and the embedding batcher
    static = by_engine["vllm"].static_utilization
    # 96 requests of 11..90 tokens in groups of 8: the histogram's bucket edges
    # (10, 20, 50, 100) bound the estimate; the server's measured truth lies inside.
    assert static.lower <= true_utilization <= static.upper
    assert abs(static.estimate - true_utilization) < 0.15
    assert by_engine["vllm"].requests_per_second > 0
    assert by_engine["inhouse"].cap == 32  # the batcher publishes its own max batch size


def test_every_demo_server_metric_is_documented() -> None:
    config = ServerConfig(batching="continuous", max_num_seqs=2, device="sim:h200")
    with serve(config) as url:
        assert completion(url, 4).status_code == 200
        assert httpx.post(f"{url}/v1/embeddings", json={"input": ["a"]}, timeout=30).is_success
        emitted = family_names(httpx.get(f"{url}/metrics").text)
    assert len(emitted) >= 40
    assert emitted <= DOCUMENTED, sorted(emitted - DOCUMENTED)
