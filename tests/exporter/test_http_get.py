"""The scrape client: keep-alive reuse, body framings, broken answers, TLS, the request."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httptools
import pytest
import uvloop

from batchscope.exporter.scrape.http_client import (
    BodyRefused,
    Connections,
    Endpoint,
    HttpGetError,
    _Connection,
    build_request,
)
from tests.support.system_tools import self_signed_certificate

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


async def get(connections: Connections, url: str, max_bytes: int = 1_000_000):
    return await connections.get(build_request(url, {"Accept-Encoding": "gzip"}), max_bytes)


async def test_connection_is_kept_alive_across_requests() -> None:
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server) as url, Connections() as connections:
        for _ in range(5):
            response = await get(connections, url)
            assert (response.status, response.body) == (200, PAYLOAD)
    assert (server.connections, len(server.requests)) == (1, 5)


async def test_concurrent_requests_open_one_connection_each_then_reuse_them() -> None:
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server) as url, Connections() as connections:
        for _ in range(3):
            answers = await asyncio.gather(*(get(connections, url) for _ in range(4)))
            assert [a.body for a in answers] == [PAYLOAD] * 4
    assert (server.connections, len(server.requests)) == (4, 12)


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    server = Server(lambda n: ok(PAYLOAD), close_after=True)
    async with serving(server) as url, Connections() as connections:
        first = await get(connections, url)
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        second = await get(connections, url)
    assert first.body == second.body == PAYLOAD
    assert (server.connections, len(server.requests)) == (2, 2)


async def test_connection_close_header_is_honoured() -> None:
    server = Server(lambda n: ok(PAYLOAD, "Connection: close"))
    async with serving(server) as url, Connections() as connections:
        for _ in range(3):
            assert (await get(connections, url)).body == PAYLOAD
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
    async with serving(server) as url, Connections() as connections:
        assert (await get(connections, url)).body == PAYLOAD
        assert (await get(connections, url)).body == PAYLOAD
    assert server.connections == 1


async def test_body_delimited_by_close_is_read_whole() -> None:
    server = Server(lambda n: b"HTTP/1.0 200 OK\r\n\r\n" + PAYLOAD, close_after=True)
    async with serving(server) as url, Connections() as connections:
        assert (await get(connections, url)).body == PAYLOAD
        assert (await get(connections, url)).body == PAYLOAD
    assert server.connections == 2


async def test_non_200_answer_keeps_status_and_reason_and_drops_the_connection() -> None:
    server = Server(lambda n: b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nnope")
    async with serving(server) as url, Connections() as connections:
        first = await get(connections, url)
        second = await get(connections, url)
    assert (first.status, first.reason, first.body) == (401, "Unauthorized", b"")
    assert second.status == 401
    assert server.connections == 2


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
        (b"", "connection closed before any answer"),
    ],
)
async def test_broken_answers_fail_with_what_broke(answer: bytes, words: str) -> None:
    server = Server(lambda n: answer, close_after=True)
    async with serving(server) as url, Connections() as connections:
        with pytest.raises(HttpGetError, match=words):
            await get(connections, url)


async def test_size_cap_counts_the_inflated_body_and_refuses_beyond_it() -> None:
    bomb = gzip.compress(b"\0" * 10_000_000)  # 10 MB in about 10 KB
    server = Server(lambda n: ok(bomb, "Content-Encoding: gzip"))
    async with serving(server) as url, Connections() as connections:
        with pytest.raises(BodyRefused, match="larger than 100000 bytes"):
            await get(connections, url, max_bytes=100_000)
        small = await get(connections, url, max_bytes=10_000_000)
    assert len(small.body) == 10_000_000
    assert server.connections == 2  # the refused answer's connection was closed


async def test_declared_length_over_the_cap_is_refused_before_the_body() -> None:
    server = Server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n")
    async with serving(server) as url, Connections() as connections:
        with pytest.raises(BodyRefused, match="larger than 1000 bytes"):
            await get(connections, url, max_bytes=1000)


async def test_unsolicited_bytes_make_the_connection_unusable() -> None:
    server = Server(lambda n: ok(PAYLOAD) + b"HTTP/1.1 200 OK\r\n")
    async with serving(server) as url, Connections() as connections:
        assert (await get(connections, url)).body == PAYLOAD
        assert (await get(connections, url)).body == PAYLOAD
    assert server.connections == 2


async def test_dead_port_says_it_cannot_connect() -> None:
    async with Connections() as connections:
        with pytest.raises(HttpGetError, match=r"Cannot connect to 127\.0\.0\.1:1: "):
            await get(connections, "http://127.0.0.1:1/metrics")


async def test_a_cancelled_request_closes_its_connection() -> None:
    server = Server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12")
    async with serving(server) as url, Connections() as connections:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await get(connections, url)
        assert connections.idle() == 0


ANSWERS_THAT_CLOSE = {
    "connection: close": ok(PAYLOAD, "Connection: close"),
    "an error status": b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
    "a broken answer": b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    "no answer in time": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12",
}


@pytest.mark.parametrize("answer", ANSWERS_THAT_CLOSE.values(), ids=ANSWERS_THAT_CLOSE.keys())
def test_a_closed_connection_leaves_no_cycle_for_the_collector(answer: bytes) -> None:
    # The exporter runs the cyclic collector every few minutes only (gc_policy.py): a
    # connection that closed must be freed by reference counting, not left in a cycle
    # (its parser holds its callbacks) to pile up until then. On uvloop, as deployed.
    async def five_scrapes() -> None:
        async with serving(Server(lambda n: answer)) as url, Connections() as connections:
            for _ in range(5):
                with contextlib.suppress(HttpGetError, TimeoutError):
                    async with asyncio.timeout(0.2):
                        await get(connections, url)
            await asyncio.sleep(0.05)  # the closes reach connection_lost

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        uvloop.run(five_scrapes())
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, _Connection | httptools.HttpResponseParser)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(left) == 0


async def test_https_verifies_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    server = Server(lambda n: ok(PAYLOAD))
    async with serving(server, server_tls) as url:
        async with Connections() as connections:
            with pytest.raises(HttpGetError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
                await get(connections, url)
        trusting = ssl.create_default_context(cafile=str(cert))
        async with Connections(tls=trusting) as connections:
            assert (await get(connections, url)).body == PAYLOAD
            assert (await get(connections, url)).body == PAYLOAD
    assert len(server.requests) == 2


def test_request_head_names_the_host_path_and_headers() -> None:
    request = build_request("http://example.org:9100/t/3/metrics?a=1&b=2", {"Accept": "x"})
    assert request.endpoint == Endpoint("example.org", 9100, False)
    assert request.head == (
        b"GET /t/3/metrics?a=1&b=2 HTTP/1.1\r\nHost: example.org:9100\r\nAccept: x\r\n"
    )
    default = build_request("https://[::1]/metrics", {})
    assert default.endpoint == Endpoint("::1", 443, True)
    assert default.head == b"GET /metrics HTTP/1.1\r\nHost: [::1]\r\n"
    assert build_request("http://h", {}).head.startswith(b"GET / HTTP/1.1\r\n")
    unicode = build_request("http://bücher.example/métriques?q=ü&a=%41", {})
    assert unicode.head == (
        b"GET /m%C3%A9triques?q=%C3%BC&a=%41 HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n"
    )


@pytest.mark.parametrize("url", ["ftp://h/metrics", "http:///metrics", "http://h:99999/"])
def test_request_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(HttpGetError):
        build_request(url, {})
