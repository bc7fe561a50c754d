"""The demo server under a fuzzed request stream: every bad request gets a 4xx, never a
5xx, and the good requests sent beside it (its batch mates) all answer 200."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.http.app import ServerConfig
from tests.support.demo_http import serve

pytestmark = pytest.mark.integration

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**15), 10**15),
    st.floats(allow_nan=False, allow_subnormal=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
wild_numbers = st.one_of(
    st.integers(-(10**12), 10**12),
    st.sampled_from([0, -1, 10**9, 2**63, -(2**63)]),
    st.floats(allow_nan=False, allow_subnormal=False),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)
prompts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\u0000", "é" * 300, "\ud7ff"]),
    wild_numbers,
    st.lists(st.text(max_size=5), max_size=3),
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={
        "prompt": prompts,
        "max_tokens": wild_numbers,
        "ignore_eos": json_leaves,
        "stream": json_leaves,
        "model": json_leaves,
        "stream_options": json_values,
    },
)
embedding_bodies = st.fixed_dictionaries(
    {},
    optional={"input": st.one_of(prompts, st.lists(prompts, max_size=4)), "model": json_leaves},
)
# (path, raw body bytes)
requests = st.one_of(
    st.tuples(st.just("/v1/completions"), completion_bodies.map(lambda b: json.dumps(b).encode())),
    st.tuples(st.just("/v1/embeddings"), embedding_bodies.map(lambda b: json.dumps(b).encode())),
    st.tuples(
        st.sampled_from(["/v1/completions", "/v1/embeddings", "/admin/config"]),
        st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())),
    ),
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    config = ServerConfig(
        device="cpu",
        max_num_seqs=8,
        max_queue=4096,
        embedding=BatcherSettings(mode="fixed").with_ms(max_batch_size=8, max_wait_ms=20),
    )
    with serve(config) as url:
        yield url


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=requests)
def test_a_fuzzed_request_gets_a_4xx_and_its_batch_mates_200(server: str, request) -> None:
    path, body = request

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            return await asyncio.gather(
                client.post(path, content=body, headers={"content-type": "application/json"}),
                client.post("/v1/completions", json={"prompt": "mate", "max_tokens": 2}),
                client.post("/v1/embeddings", json={"input": ["mate one", "mate two"]}),
            )

    fuzzed, completion_mate, embedding_mate = asyncio.run(together())
    assert fuzzed.status_code < 500, (path, body, fuzzed.status_code, fuzzed.text[:300])
    if fuzzed.status_code >= 400:
        assert fuzzed.json()["error"]["message"]
    assert completion_mate.status_code == 200, completion_mate.text
    assert embedding_mate.status_code == 200, embedding_mate.text
