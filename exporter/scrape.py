"""Fetching one target's /metrics: timeouts, a size cap and auth, never an exception."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from exporter.config import Target

CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """The payload, or why there is none; `seconds` is the wall time the scrape took."""

    text: str | None
    error: str | None
    seconds: float


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        return None
    chunks = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def scrape(
    session: aiohttp.ClientSession, target: Target, timeout: float, max_bytes: int
) -> ScrapeResult:
    """GET the target's metrics URL. Any failure becomes `error`, with no secret in it."""
    started = time.perf_counter()

    def failed(reason: str) -> ScrapeResult:
        return ScrapeResult(None, reason, time.perf_counter() - started)

    headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"}
    if target.auth is not None:
        try:
            headers["Authorization"] = target.auth.header()
        except (OSError, ValueError) as err:
            return failed(f"credentials unavailable: {err}")
    try:
        async with asyncio.timeout(timeout):
            async with session.get(target.url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 200:
                    return failed(f"HTTP {resp.status} {resp.reason or ''}".strip())
                body = await _read_capped(resp, max_bytes)
                if body is None:
                    return failed(f"response larger than {max_bytes} bytes")
    except TimeoutError:
        return failed(f"timed out after {timeout:g} s")
    except aiohttp.ClientError as err:
        return failed(f"{type(err).__name__}: {err}")
    except OSError as err:
        return failed(f"{type(err).__name__}: {err}")
    return ScrapeResult(body.decode("utf-8", errors="replace"), None, time.perf_counter() - started)
