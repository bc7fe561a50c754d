"""Fetching one target's /metrics: timeouts, a size cap and auth, never an exception."""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from batchscope.exporter.config.settings import Auth, ConfigError, Target, redact_url_in
from batchscope.exporter.scrape.http_client import Connections, HttpGetError, Request, build_request


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


# Sent with every scrape, as Prometheus does (the text format first; gzip accepted).
SCRAPE_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "batchscope-exporter",
}


@functools.lru_cache(maxsize=65536)
def scrape_request(url: str) -> Request:
    """The GET of a target's URL, built once (the Authorization header is added per scrape,
    so that a rotated secret is read)."""
    return build_request(url, SCRAPE_HEADERS)


async def scrape(
    connections: Connections, target: Target, timeout: float, max_bytes: int
) -> ScrapeResult:
    """GET the target's metrics URL. Any failure becomes `error`, with no secret in it."""
    started = time.perf_counter()

    def failed(reason: str) -> ScrapeResult:
        # Query values (file_sd __param_*) may hold keys: never in an error.
        return ScrapeResult(None, redact_url_in(reason, target.url), time.perf_counter() - started)

    try:
        request = scrape_request(target.url)
        if target.auth is not None:
            header = f"Authorization: {authorization_header(target.auth)}\r\n"
            request = Request(request.endpoint, request.head + header.encode("latin-1"))
    except HttpGetError as err:
        return failed(str(err))
    except (OSError, ValueError) as err:
        return failed(f"credentials unavailable: {err}")
    try:
        async with asyncio.timeout(timeout):
            response = await connections.get(request, max_bytes)
    except TimeoutError:
        return failed(f"timed out after {timeout:g} s")
    except HttpGetError as err:
        return failed(str(err))
    if response.status != 200:
        return failed(f"HTTP {response.status} {response.reason}".strip())
    text = response.body.decode("utf-8", errors="replace")
    return ScrapeResult(text, None, time.perf_counter() - started)
