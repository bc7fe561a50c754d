"""The scrape client: keep-alive reuse, body framings, broken answers, TLS, the request."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from batchscope.exporter.config.settings import Target
from batchscope.exporter.scrape.fetch import (
    BodyRefused,
    FetchError,
    client_session,
    fetch_body,
    scrape,
)
from tests.support.system_tools import self_signed_certificate

pytestmark = pytest.mark.integration

PAYLOAD = b"vllm:num_requests_running 3\n" * 100


def ok(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Server:
    """A raw TCP server answering each request head with `answer(n)` (n counts requests
    over all connections); `close_after` closes the connection after each answer."""

    def __init__(self, answer: Callable[[int], bytes], close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                writer.write(self.answer(len(self.requests)))
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(server: Server, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=tls)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/metrics"
    finally:
        listener.close()
        for writer in server.writers:
            writer.close()
        await listener.wait_closed()


async def get(session, url: str, max_bytes: int = 1_000_000) -> bytes:
    return await fetch_body(session, url, {}, max_bytes)


async def test_connection_is_kept_alive_across_requests() -> None:
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server) as url, client_session() as session:
        for _ in range(5):
            assert await get(session, url) == PAYLOAD
    assert (server.connections, len(server.requests)) == (1, 5)


async def test_concurrent_requests_open_one_connection_each_then_reuse_them() -> None:
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server) as url, client_session() as session:
        for _ in range(3):
            answers = await asyncio.gather(*(get(session, url) for _ in range(4)))
            assert answers == [PAYLOAD] * 4
    assert (server.connections, len(server.requests)) == (4, 12)


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    server = Server(lambda n: ok(PAYLOAD), close_after=True)
    async with serving(server) as url, client_session() as session:
        first = await get(session, url)
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        second = await get(session, url)
    assert first == second == PAYLOAD
    assert (server.connections, len(server.requests)) == (2, 2)


async def test_connection_close_header_is_honoured() -> None:
    server = Server(lambda n: ok(PAYLOAD, "Connection: close"))
    async with serving(server) as url, client_session() as session:
        for _ in range(3):
            assert await get(session, url) == PAYLOAD
    assert server.connections == 3


async def test_chunked_gzip_body_is_inflated() -> None:
    packed = gzip.compress(PAYLOAD)
    chunks = b"".join(
        f"{len(packed[i : i + 100]):x}\r\n".encode() + packed[i : i + 100] + b"\r\n"
        for i in range(0, len(packed), 100)
    )
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    server = Server(lambda n: answer)
    async with serving(server) as url, client_session() as session:
        assert await get(session, url) == PAYLOAD
        assert await get(session, url) == PAYLOAD
    assert server.connections == 1


async def test_body_delimited_by_close_is_read_whole() -> None:
    server = Server(lambda n: b"HTTP/1.0 200 OK\r\n\r\n" + PAYLOAD, close_after=True)
    async with serving(server) as url, client_session() as session:
        assert await get(session, url) == PAYLOAD
        assert await get(session, url) == PAYLOAD
    assert server.connections == 2


async def test_non_200_answer_fails_with_its_status_and_reason() -> None:
    server = Server(lambda n: b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nnope")
    async with serving(server) as url, client_session() as session:
        for _ in range(2):
            with pytest.raises(FetchError, match="^HTTP 401 Unauthorized$"):
                await get(session, url)
    assert len(server.requests) == 2


async def test_a_redirect_is_not_followed() -> None:
    server = Server(
        lambda n: b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
    )
    async with serving(server) as url, client_session() as session:
        with pytest.raises(FetchError, match="^HTTP 302 Found$"):
            await get(session, url)
    assert [head.split(b" ")[1] for head in server.requests] == [b"/metrics"]


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "invalid HTTP response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "closed in the middle"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Encoding: br\r\n\r\n123456789",
            "unsupported Content-Encoding 'br'",
        ),
        (
            ok(b"\x1f\x8b\x08\x00" + b"not deflate" * 8, "Content-Encoding: gzip"),
            "invalid compressed body",
        ),
        (ok(gzip.compress(PAYLOAD)[:-12], "Content-Encoding: gzip"), "truncated compressed body"),
        (b"", "connection closed before an answer"),
    ],
)
async def test_broken_answers_fail_with_what_broke(answer: bytes, words: str) -> None:
    server = Server(lambda n: answer, close_after=True)
    async with serving(server) as url, client_session() as session:
        with pytest.raises(FetchError, match=words):
            await get(session, url)


async def test_size_cap_counts_the_inflated_body_and_refuses_beyond_it() -> None:
    bomb = gzip.compress(b"\0" * 10_000_000)  # 10 MB in about 10 KB
    server = Server(lambda n: ok(bomb, "Content-Encoding: gzip"))
    async with serving(server) as url, client_session() as session:
        with pytest.raises(BodyRefused, match="larger than 100000 bytes"):
            await get(session, url, max_bytes=100_000)
        small = await get(session, url, max_bytes=10_000_000)
    assert len(small) == 10_000_000


async def test_declared_length_over_the_cap_is_refused_before_the_body() -> None:
    server = Server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n")
    async with serving(server) as url, client_session() as session:
        with pytest.raises(BodyRefused, match="larger than 1000 bytes"):
            await get(session, url, max_bytes=1000)


async def test_unsolicited_bytes_do_not_spoil_the_next_answer() -> None:
    server = Server(lambda n: ok(PAYLOAD) + b"HTTP/1.1 200 OK\r\n")
    async with serving(server) as url, client_session() as session:
        assert await get(session, url) == PAYLOAD
        assert await get(session, url) == PAYLOAD


async def test_dead_port_says_it_cannot_connect() -> None:
    async with client_session() as session:
        with pytest.raises(FetchError, match=r"^Cannot connect to 127\.0\.0\.1:1: "):
            await get(session, "http://127.0.0.1:1/metrics")


async def test_a_cancelled_request_closes_its_connection() -> None:
    stalled = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12"
    server = Server(lambda n: stalled if n == 1 else ok(PAYLOAD))
    async with serving(server) as url, client_session() as session:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await get(session, url)
        assert await get(session, url) == PAYLOAD  # not the stalled answer's connection
    assert server.connections == 2


async def test_https_verifies_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server, server_tls) as url:
        async with client_session() as session:
            with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
                await get(session, url)
        trusting = ssl.create_default_context(cafile=str(cert))
        async with client_session(tls=trusting) as session:
            assert await get(session, url) == PAYLOAD
            assert await get(session, url) == PAYLOAD
    assert len(server.requests) == 2


async def test_the_scrape_sends_what_prometheus_sends_and_its_credentials() -> None:
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server) as url, client_session() as session:
        target = Target("t", url.replace("/metrics", "/t/m%C3%A9triques?a=1&b=%C3%BC"))
        result = await scrape(session, target, 5.0, 1_000_000)
    assert result.text == PAYLOAD.decode() and result.error is None
    (head,) = server.requests
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "GET /t/m%C3%A9triques?a=1&b=%C3%BC HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    assert headers["Host"] == url.split("/")[2]
    assert headers["Accept"] == "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    assert headers["Accept-Encoding"] == "gzip"
    assert headers["User-Agent"] == "batchscope-exporter"
    assert "Authorization" not in headers and "Cookie" not in headers


@pytest.mark.parametrize("url", ["ftp://h/metrics", "http:///metrics", "http://h:99999/"])
async def test_a_url_that_is_not_http_fails_the_scrape_with_a_reason(url: str) -> None:
    async with client_session() as session:
        result = await scrape(session, Target("t", url), 5.0, 1000)
    assert result.text is None and result.error == f"not an http(s) URL: {url}"
