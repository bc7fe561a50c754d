"""A small HTTP/1.1 client for scrapes: one GET at a time per keep-alive connection.

Why not aiohttp's client: at a fleet's size its per-request machinery (cookies, tracing,
redirect handling, URL objects, two layers of streams) costs as much CPU per scrape as
reading the payload (docs/benchmarks.md). A scrape needs little of it: send one request
built once per URL, parse the answer with llhttp (`httptools`, the parser Node.js and
uvicorn use), and inflate gzip as it arrives, never past the size cap. Redirects are not
followed (the caller refuses any status but 200, so credentials never go elsewhere); no
proxy is used (HTTP_PROXY and the like are ignored).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httptools
from isal import isal_zlib

# Idle connections kept, all hosts together, and how long one may sit unused.
MAX_IDLE_CONNECTIONS = 2048
IDLE_SECONDS = 60.0


# Characters kept as written in a request's path and query (RFC 3986's reserved and
# unreserved ones, and "%" so that escapes already there stay as they are).
URL_SAFE = "/?:@!$&'()*+,;=-._~%"


class HttpGetError(Exception):
    """The request failed: no connection, a broken or refused answer. The message names
    no secret (the caller redacts the URL's query values)."""


class BodyRefused(HttpGetError):
    """The body is over the size cap, or in an encoding the exporter does not read."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a URL's requests go: connections are pooled per endpoint."""

    host: str
    port: int
    tls: bool


@dataclass(frozen=True, slots=True)
class Request:
    """A GET, ready to send: its endpoint and its head without the final blank line."""

    endpoint: Endpoint
    head: bytes


def build_request(url: str, headers: dict[str, str]) -> Request:
    """The GET of `url` with `headers` (Host is added). Raises HttpGetError for a URL
    that is not http(s)://host[:port]/path."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpGetError(f"not an http(s) URL: {url}")
    tls = parts.scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError as err:
        raise HttpGetError(f"bad port in URL: {err}") from None
    try:  # the request line and Host are ASCII: IDNA for the host, %-escapes for the rest
        ascii_host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError as err:
        raise HttpGetError(f"bad host name in URL: {err}") from None
    host = f"[{ascii_host}]" if ":" in ascii_host else ascii_host
    default_port = port == (443 if tls else 80)
    target = quote(parts.path or "/", safe=URL_SAFE) + (
        "?" + quote(parts.query, safe=URL_SAFE) if parts.query else ""
    )
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host if default_port else f'{host}:{port}'}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return Request(Endpoint(parts.hostname, port, tls), ("\r\n".join(lines) + "\r\n").encode())


def _inflater(encoding: str) -> isal_zlib.Decompress | None:
    """A decompressor for the Content-Encoding (None: the body is as sent).

    ISA-L's inflate (`isal`, zlib's interface), not zlib's: about half the CPU on a
    gzipped vLLM payload (77 against 166 us), the largest single cost of a scrape."""
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return isal_zlib.decompressobj(wbits=16 + isal_zlib.MAX_WBITS)
    if encoding == "deflate":
        return isal_zlib.decompressobj()
    raise BodyRefused(f"unsupported Content-Encoding {encoding!r}")


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; `exchange` sends a GET and reads its whole answer.

    The parser's callbacks (`on_*`) fill the answer as bytes arrive; the body is counted
    on the wire and inflated with the room left under the cap, so a gzip bomb costs the
    cap, not its inflated size.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._answer: asyncio.Future[Response] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: the connection is not reusable
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self._fail(self._error or HttpGetError("invalid HTTP response"))
        except httptools.HttpParserError as err:
            self._fail(HttpGetError(f"invalid HTTP response: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is not None and not self._answer.done():
            if self._headers_done and not self._framed:
                self._complete()  # a body delimited by the connection's close ends here
            elif not self._received:
                self._fail(_Stale("connection closed before any answer"))
            else:
                self._fail(HttpGetError("connection closed in the middle of the answer"))
        # The parser holds this connection's callbacks, and an error raised from one holds
        # its frame: cycles that only the cyclic collector would free, one a closed
        # connection (gc_policy.py: it runs every few minutes).
        self._parser = self._error = self._answer = None

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._answer is not None and self._answer.done():
            self.close()  # a second answer to one request: the stream cannot be trusted

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-encoding":
            self._encoding = value.decode("latin-1").strip().lower()
        elif name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self._framed = True
            if name == b"content-length" and value.strip().isdigit():
                self._declared = int(value)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        if self._parser.get_status_code() != 200:
            self._complete()  # only a 200's body is read; this connection is not reused
            self.close()
            return
        if self._declared is not None and self._declared > self._max_bytes:
            self._refuse(self._too_large())
        try:
            self._inflater = _inflater(self._encoding)
        except BodyRefused as err:
            self._refuse(err)

    def on_body(self, chunk: bytes) -> None:
        self._wire += len(chunk)
        if self._wire > self._max_bytes:
            self._refuse(self._too_large())
        if self._inflater is not None:
            try:
                chunk = self._inflater.decompress(chunk, self._max_bytes + 1 - len(self._body))
            except isal_zlib.error as err:
                self._refuse(BodyRefused(f"invalid compressed body: {err}"))
            if self._inflater.unconsumed_tail:
                self._refuse(self._too_large())
        self._body += chunk
        if len(self._body) > self._max_bytes:
            self._refuse(self._too_large())

    def on_message_complete(self) -> None:
        # Asked now: once the message is complete the parser starts over and forgets.
        self._keep_alive = self._parser.should_keep_alive()
        self._complete()

    # -- one exchange ------------------------------------------------------------------

    def exchange(self, head: bytes, max_bytes: int) -> asyncio.Future[Response]:
        """Send a GET (its head, without the blank line); the future gets the answer."""
        self._answer = asyncio.get_running_loop().create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._max_bytes = max_bytes
        self._reason = b""
        self._encoding = ""
        self._declared: int | None = None
        self._framed = False
        self._headers_done = False
        self._received = False
        self._wire = 0
        self._keep_alive = False
        self._body = bytearray()
        self._inflater: isal_zlib.Decompress | None = None
        self._error: HttpGetError | None = None
        assert self.transport is not None
        self.transport.write(head + b"\r\n")
        return self._answer

    def reusable(self) -> bool:
        return not self.closed and self._keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _too_large(self) -> BodyRefused:
        return BodyRefused(f"response larger than {self._max_bytes} bytes")

    def _refuse(self, error: HttpGetError) -> None:
        """Stop parsing from inside a callback: `data_received` reports `error`."""
        self._error = error
        raise error

    def _complete(self) -> None:
        if self._answer is None or self._answer.done():
            return
        body = bytes(self._body)
        if self._inflater is not None and self._parser.get_status_code() == 200:
            try:
                body += self._inflater.flush(self._max_bytes + 1 - len(body))
            except isal_zlib.error as err:
                self._fail(BodyRefused(f"invalid compressed body: {err}"))
                return
            if not self._inflater.eof:
                self._fail(BodyRefused("truncated compressed body"))
                return
            if len(body) > self._max_bytes:
                self._fail(self._too_large())
                return
        reason = self._reason.decode("latin-1", errors="replace").strip()
        self._answer.set_result(Response(self._parser.get_status_code(), reason, body))

    def _fail(self, error: HttpGetError) -> None:
        self.close()
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)


class _Stale(HttpGetError):
    """A kept-alive connection the server had closed: the request is sent again, once."""


class Connections:
    """Keep-alive connections by endpoint, reused scrape after scrape.

    A connection carries one request at a time; concurrent requests to one endpoint open
    more. Idle ones beyond MAX_IDLE_CONNECTIONS, or unused for IDLE_SECONDS, are closed.
    Use as an async context manager, or call `close()`. `tls`: the context https
    connections verify against (default: the system's certificate authorities).
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Endpoint, deque[_Connection]] = {}
        self._idle_count = 0
        self._tls = tls

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()

    async def get(self, request: Request, max_bytes: int) -> Response:
        """Send the GET and read its answer (a cancelled caller closes the connection).
        Raises HttpGetError."""
        connection = self._take_idle(request.endpoint)
        if connection is not None:
            try:
                return await self._exchange(connection, request, max_bytes)
            except _Stale:
                pass  # the server closed it while idle: one fresh connection, below
        connection = await self._open(request.endpoint)
        try:
            return await self._exchange(connection, request, max_bytes)
        except _Stale as err:
            raise HttpGetError(str(err)) from None

    async def _exchange(
        self, connection: _Connection, request: Request, max_bytes: int
    ) -> Response:
        try:
            response = await connection.exchange(request.head, max_bytes)
        except BaseException:
            connection.close()
            raise
        if connection.reusable():
            self._put_idle(request.endpoint, connection)
        else:
            connection.close()
        return response

    async def _open(self, endpoint: Endpoint) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if endpoint.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            _, connection = await loop.create_connection(
                _Connection, endpoint.host, endpoint.port, ssl=tls
            )
        except OSError as err:
            raise HttpGetError(
                f"Cannot connect to {endpoint.host}:{endpoint.port}: {err.strerror or err}"
            ) from None
        return connection

    def _take_idle(self, endpoint: Endpoint) -> _Connection | None:
        idle = self._idle.get(endpoint)
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if not connection.closed and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    def _put_idle(self, endpoint: Endpoint, connection: _Connection) -> None:
        if self._idle_count >= MAX_IDLE_CONNECTIONS:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(endpoint, deque()).append(connection)
        self._idle_count += 1

    def idle(self) -> int:
        """Idle connections kept for reuse."""
        return self._idle_count

    def close_idle(self) -> None:
        """Close the connections unused for IDLE_SECONDS or more (a target gone from the
        configuration leaves its connection here)."""
        now = asyncio.get_running_loop().time()
        for endpoint, idle in list(self._idle.items()):
            kept = deque(c for c in idle if not c.closed and now - c.idle_since < IDLE_SECONDS)
            for connection in idle:
                if connection not in kept:
                    connection.close()
            self._idle_count -= len(idle) - len(kept)
            if kept:
                self._idle[endpoint] = kept
            else:
                del self._idle[endpoint]

    def close(self) -> None:
        """Close every idle connection (those in use close when their request ends)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        self._idle_count = 0
