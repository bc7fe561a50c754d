"""The demo server's edges: a bounded request body, an admin endpoint that wants its token
and a local Host, and a failing embedding that does not leak the exception's text."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.embedding.service import Encoder
from batchscope.demo_server.http.app import MAX_REQUEST_BYTES, ServerConfig
from tests.support.demo_http import serve

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "demo-admin-token-2468"
SECRET_TEXT = "/opt/internal/weights-7f3a.bin"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    config = ServerConfig(
        device="cpu",
        max_num_seqs=4,
        admin_token=ADMIN_TOKEN,
        embedding=BatcherSettings(mode="fixed").with_ms(max_batch_size=8, max_wait_ms=50),
    )
    with serve(config) as url:
        yield url


def test_a_body_over_the_limit_is_refused_with_or_without_content_length(server: str) -> None:
    huge = "x" * (MAX_REQUEST_BYTES + 1)
    declared = httpx.post(
        f"{server}/v1/completions",
        content=huge,
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert declared.status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(MAX_REQUEST_BYTES // 65536 + 2):
            yield b"y" * 65536
        yield b'", "max_tokens": 1}'

    streamed = httpx.post(
        f"{server}/v1/completions",
        content=chunks(),
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert "content-length" not in streamed.request.headers
    assert streamed.status_code == 413
    assert str(MAX_REQUEST_BYTES) in streamed.json()["error"]["message"]
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_admin_wants_its_token_and_a_local_host(server: str) -> None:
    bearer = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.get(f"{server}/admin/config", timeout=10).status_code == 401
    wrong = {"authorization": "Bearer guess"}
    assert httpx.get(f"{server}/admin/config", headers=wrong, timeout=10).status_code == 401
    assert httpx.get(f"{server}/admin/config", headers=bearer, timeout=10).status_code == 200
    rebound = {**bearer, "host": "attacker.example:8000"}
    refused = httpx.post(
        f"{server}/admin/config", headers=rebound, timeout=10, json={"max_num_seqs": 1}
    )
    assert refused.status_code == 403 and "local Host" in refused.json()["error"]["message"]
    changed = httpx.post(
        f"{server}/admin/config", headers=bearer, timeout=10, json={"max_num_seqs": 3}
    )
    assert changed.json()["generation"]["max_num_seqs"] == 3
    assert ADMIN_TOKEN not in repr(ServerConfig(admin_token=ADMIN_TOKEN))


def test_a_failing_embedding_answers_500_without_the_exception_text_and_its_mates_200(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenize = Encoder.tokenize

    def exploding(self: Encoder, texts):
        if any("explode" in t for t in texts):
            raise RuntimeError(f"CUDA error: device-side assert at {SECRET_TEXT}")
        return tokenize(self, texts)

    monkeypatch.setattr(Encoder, "tokenize", exploding)

    async def batch() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post("/v1/embeddings", json={"input": text})
                    for text in ("fine one", "explode", "fine two", "fine three")
                )
            )

    fine, bad, *others = asyncio.run(batch())
    assert bad.status_code == 500
    assert SECRET_TEXT not in bad.text and "RuntimeError" not in bad.text
    assert bad.json()["error"]["message"] == (
        "input: the embedding failed; the server log has the details"
    )
    assert [r.status_code for r in (fine, *others)] == [200, 200, 200]
