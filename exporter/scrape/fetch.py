"""Fetching one target's /metrics with aiohttp: timeouts, a size cap and auth, never an exception.

One aiohttp ClientSession serves every scrape of an exporter (`client_session`), its
connections kept alive from one scrape to the next. A scrape follows no redirect (any
status but 200 is a failed scrape, so credentials never go elsewhere), uses no proxy
(HTTP_PROXY and the like are ignored) and keeps no cookie. The body is counted against
the size cap as it arrives, and a gzip body is inflated here, never past the cap:
aiohttp's own inflation would pass a gzip body cut short as a whole one.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from isal import isal_zlib

from batchscope.exporter.config.settings import Auth, ConfigError, Target
from batchscope.exporter.config.values import redact_url_in

# Sent with every scrape, as Prometheus does (the text format first; gzip accepted).
SCRAPE_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "batchscope-exporter",
}
# An idle connection is closed after this long: longer than a scrape interval, so that a
# target's connection lasts from one scrape to its next.
IDLE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """The payload, or why there is none; `seconds` is the wall time the scrape took."""

    text: str | None
    error: str | None
    seconds: float


class FetchError(Exception):
    """The GET failed: no connection, a refused or broken answer. The message names no
    secret (the caller redacts the URL's query values)."""


class BodyRefused(FetchError):
    """The body is over the size cap, or not in an encoding the exporter reads."""


def client_session(limit: int = 100, tls: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """The exporter's HTTP client, for `scrape`: at most `limit` connections open at once;
    https verified against `tls` (default: the system's certificate authorities). Each
    scrape sets its own time limit, so the session sets none."""
    connector = aiohttp.TCPConnector(
        limit=limit, keepalive_timeout=IDLE_SECONDS, ssl=True if tls is None else tls
    )
    return aiohttp.ClientSession(
        connector=connector,
        headers=SCRAPE_HEADERS,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
    )


def authorization_header(auth: Auth) -> str:
    """The Authorization header value, reading the environment or file now.

    Raises ConfigError naming the variable or file (never the secret) when it is
    unset, empty or unreadable. Reading at every scrape picks up rotated secrets.
    """
    if auth.type == "bearer":
        return "Bearer " + read_secret("token", auth.token_env, auth.token_file)
    password = read_secret("password", auth.password_env, auth.password_file)
    pair = f"{auth.username}:{password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def read_secret(kind: str, env: str | None, path: str | None) -> str:
    """A secret from the environment variable `env`, else the file `path`, stripped.

    Raises ConfigError naming where it looked (never the value)."""
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ConfigError(f"auth: environment variable {env} (the {kind}) is not set or empty")
        where = f"environment variable {env}"
    else:
        try:
            value = Path(str(path)).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ConfigError(f"auth: cannot read {kind} file {path}: {reason}") from None
        if not value:
            raise ConfigError(f"auth: {kind} file {path} is empty")
        where = f"{kind} file {path}"
    if "\n" in value or "\r" in value:
        # A line break would split the HTTP header; say so without showing the value.
        raise ConfigError(f"auth: the {kind} in {where} contains a line break")
    return value


async def scrape(
    session: aiohttp.ClientSession, target: Target, timeout: float, max_bytes: int
) -> ScrapeResult:
    """GET the target's metrics URL. Any failure becomes `error`, with no secret in it."""
    started = time.perf_counter()

    def failed(reason: str) -> ScrapeResult:
        # Query values (file_sd __param_*) may hold keys: never in an error.
        return ScrapeResult(None, redact_url_in(reason, target.url), time.perf_counter() - started)

    try:
        headers = (
            {} if target.auth is None else {"Authorization": authorization_header(target.auth)}
        )
    except (OSError, ValueError) as err:
        return failed(f"credentials unavailable: {err}")
    try:
        async with asyncio.timeout(timeout):
            body = await fetch_body(session, target.url, headers, max_bytes)
    except TimeoutError:
        return failed(f"timed out after {timeout:g} s")
    except FetchError as err:
        return failed(str(err))
    return ScrapeResult(body.decode("utf-8", errors="replace"), None, time.perf_counter() - started)


async def fetch_body(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], max_bytes: int
) -> bytes:
    """The body of a 200 answer to GET `url`, inflated, at most `max_bytes`. Raises
    FetchError saying what went wrong (from the exporter's words, never aiohttp's, which
    may quote the URL)."""
    try:
        async with session.get(url, headers=headers, allow_redirects=False) as response:
            if response.status != 200:
                raise FetchError(f"HTTP {response.status} {response.reason or ''}".strip())
            return await _read_body(response, max_bytes)
    except aiohttp.ClientConnectorCertificateError as err:
        raise FetchError(
            f"Cannot connect to {err.host}:{err.port}: {err.certificate_error}"
        ) from None
    except aiohttp.ClientConnectorError as err:
        reason = err.os_error.strerror or type(err.os_error).__name__
        raise FetchError(f"Cannot connect to {err.host}:{err.port}: {reason}") from None
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError):
        raise FetchError(f"not an http(s) URL: {url}") from None
    except aiohttp.ServerDisconnectedError:
        raise FetchError("connection closed before an answer") from None
    except aiohttp.ClientPayloadError:
        raise FetchError("connection closed in the middle of the answer") from None
    except aiohttp.ClientResponseError as err:
        raise FetchError(f"invalid HTTP response: {err.message}") from None
    except aiohttp.ClientError as err:
        raise FetchError(f"request failed: {type(err).__name__}") from None


async def _read_body(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body as it arrives, inflated when gzip- or deflate-encoded; BodyRefused as soon
    as it (or what came on the wire) passes `max_bytes`, so that a gzip bomb costs the cap,
    not its inflated size. Leaving unread, the connection closes, never reused."""
    if response.content_length is not None and response.content_length > max_bytes:
        raise _too_large(max_bytes)
    inflater = _inflater(response.headers.get("Content-Encoding", "").strip().lower())
    body = bytearray()
    wire = 0
    try:
        async for chunk in response.content.iter_any():
            wire += len(chunk)
            if inflater is not None:
                chunk = inflater.decompress(chunk, max_bytes + 1 - len(body))
                if inflater.unconsumed_tail:
                    raise _too_large(max_bytes)
            body += chunk
            if len(body) > max_bytes or wire > max_bytes:
                raise _too_large(max_bytes)
        if inflater is not None:
            body += inflater.flush()
            if not inflater.eof:
                raise BodyRefused("truncated compressed body")
    except isal_zlib.error as err:
        raise BodyRefused(f"invalid compressed body: {err}") from None
    return bytes(body)


def _inflater(encoding: str) -> isal_zlib.Decompress | None:
    """A decompressor for the Content-Encoding (None: the body is as sent): ISA-L's
    inflate, zlib's interface on fewer instructions, inflation being most of a scrape's."""
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return isal_zlib.decompressobj(wbits=16 + isal_zlib.MAX_WBITS)
    if encoding == "deflate":
        return isal_zlib.decompressobj()
    raise BodyRefused(f"unsupported Content-Encoding {encoding!r}")


def _too_large(max_bytes: int) -> BodyRefused:
    return BodyRefused(f"response larger than {max_bytes} bytes")
