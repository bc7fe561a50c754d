"""Fetching one target's /metrics: timeouts, a size cap and auth, never an exception."""

from __future__ import annotations

import asyncio
import base64
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from exporter.config import Auth, ConfigError, Target, redact_url_in

CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """The payload, or why there is none; `seconds` is the wall time the scrape took."""

    text: str | None
    error: str | None
    seconds: float


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


class BodyRefused(Exception):
    """The body is over the size cap, or in an encoding the exporter does not read."""


def _inflater(encoding: str) -> zlib._Decompress | None:
    """A decompressor for the Content-Encoding (None: the body is as sent)."""
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise BodyRefused(f"unsupported Content-Encoding {encoding!r}")


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, decompressed here, never more than `max_bytes` of it at any moment.

    The inflation itself is bounded: each chunk inflates at most up to the cap, so a
    gzip bomb costs the cap, not its inflated size. A body without Content-Length is
    counted as it comes. Raises BodyRefused.
    """
    too_large = BodyRefused(f"response larger than {max_bytes} bytes")
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise too_large
    inflater = _inflater(response.headers.get("Content-Encoding", "").strip().lower())
    body = bytearray()
    wire = 0
    try:
        async for chunk in response.content.iter_chunked(CHUNK):
            wire += len(chunk)
            if wire > max_bytes:
                raise too_large
            if inflater is not None:
                chunk = inflater.decompress(chunk, max_bytes + 1 - len(body))
                if inflater.unconsumed_tail:
                    raise too_large
            body += chunk
            if len(body) > max_bytes:
                raise too_large
        if inflater is not None:
            body += inflater.flush(max_bytes + 1 - len(body))
            if not inflater.eof:
                raise BodyRefused("truncated compressed body")
    except zlib.error as err:
        raise BodyRefused(f"invalid compressed body: {err}") from None
    if len(body) > max_bytes:
        raise too_large
    return bytes(body)


async def scrape(
    session: aiohttp.ClientSession, target: Target, timeout: float, max_bytes: int
) -> ScrapeResult:
    """GET the target's metrics URL. Any failure becomes `error`, with no secret in it."""
    started = time.perf_counter()

    def failed(reason: str) -> ScrapeResult:
        # Query values (file_sd __param_*) may hold keys: never in an error.
        return ScrapeResult(None, redact_url_in(reason, target.url), time.perf_counter() - started)

    headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "gzip"}
    if target.auth is not None:
        try:
            headers["Authorization"] = authorization_header(target.auth)
        except (OSError, ValueError) as err:
            return failed(f"credentials unavailable: {err}")
    try:
        async with asyncio.timeout(timeout):
            # Redirects are refused: following one would send the credentials elsewhere.
            async with session.get(
                target.url, headers=headers, allow_redirects=False, auto_decompress=False
            ) as resp:
                if resp.status != 200:
                    return failed(f"HTTP {resp.status} {resp.reason or ''}".strip())
                body = await read_capped(resp, max_bytes)
    except BodyRefused as err:
        return failed(str(err))
    except TimeoutError:
        return failed(f"timed out after {timeout:g} s")
    except aiohttp.ClientError as err:
        return failed(f"{type(err).__name__}: {err}")
    except OSError as err:
        return failed(f"{type(err).__name__}: {err}")
    return ScrapeResult(body.decode("utf-8", errors="replace"), None, time.perf_counter() - started)
