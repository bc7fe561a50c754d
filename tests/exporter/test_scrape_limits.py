"""Bombs, floods and refusals at the scrape, each beside a healthy target that keeps moving.

The real exporter process scrapes: a gzip body that inflates to 1 GiB, 134 times the size cap,
a body over the cap sent without Content-Length, a payload with 100,000 series, a 401
and a redirect to another host (which must never see the target's credentials).
"""

from __future__ import annotations

import zlib

import aiohttp
import pytest
from aiohttp import web

from tests.support.live import Targets, running_exporter, vllm_payload, wait_for

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration

CAP_BYTES = 8_000_000
# Far above what the exporter holds while it refuses every bad target at once (260-270 MB
# at its peak on a loaded 2-core machine): a bomb it inflated would show as twice that.
BOMB_INFLATED_BYTES = 1 << 30
SERIES_FLOOD = 100_000
SAMPLE_LIMIT = 10_000
TOKEN = "hardening-token-5678"


async def test_bombs_floods_401_and_redirects_are_refused_while_a_healthy_target_moves(
    tmp_path,
) -> None:

    bomb = _gzip_of_newlines(BOMB_INFLATED_BYTES)
    flood = "".join(
        f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n'
        for i in range(SERIES_FLOOD)
    )
    line = b'vllm:num_requests_running{engine="0",model_name="m"} 1\n'

    async def gzip_bomb(_: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    async def no_length(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(2 * CAP_BYTES // (len(line) * 1000)):
            await response.write(line * 1000)
        return response

    async def unauthorized(_: web.Request) -> web.Response:
        return web.Response(status=401, text="unauthorized")

    async with Targets() as targets, Targets() as elsewhere:
        elsewhere.payloads["stolen"] = vllm_payload(1)
        seen_auth: list[str] = []

        async def redirect(request: web.Request) -> web.Response:
            seen_auth.append(request.headers.get("Authorization", ""))
            raise web.HTTPFound(elsewhere.url("stolen"))

        targets.payloads = {"healthy": vllm_payload(3), "flood": flood}
        targets.handlers = {
            "bomb": gzip_bomb,
            "nolength": no_length,
            "unauthorized": unauthorized,
            "redirect": redirect,
        }
        config = f"""interval_seconds: 0.5
window_seconds: 30
max_response_bytes: {CAP_BYTES}
sample_limit: {SAMPLE_LIMIT}
targets:
  - {{name: healthy, url: "{targets.url("healthy")}", cap: 8}}
  - {{name: bomb, url: "{targets.url("bomb")}", engine: vllm}}
  - {{name: nolength, url: "{targets.url("nolength")}", engine: vllm}}
  - {{name: flood, url: "{targets.url("flood")}", engine: vllm}}
  - {{name: unauthorized, url: "{targets.url("unauthorized")}", engine: vllm}}
  - name: redirect
    url: "{targets.url("redirect")}"
    engine: vllm
    auth: {{type: bearer, token_env: HARDENING_TOKEN}}
"""
        env = {"HARDENING_TOKEN": TOKEN}
        async with (
            running_exporter(config, tmp_path, env=env) as exporter,
            aiohttp.ClientSession() as s,
        ):

            async def healthy_running_is(value: float) -> bool:
                found = await exporter.signals(s)
                return len(found) == 6 and found["healthy"]["total"]["running"] == value

            await wait_for(lambda: healthy_running_is(3.0), 30, "all six targets, running 3")
            for _ in range(3):  # every bad target gets scraped again, the healthy one moves
                before = dict(targets.requests)
                targets.payloads["healthy"] = vllm_payload(4 if _ % 2 == 0 else 3)
                await wait_for(
                    lambda v=4.0 if _ % 2 == 0 else 3.0: healthy_running_is(v),
                    10,
                    "the healthy target to move",
                )
                await wait_for(
                    lambda b=before: _all_scraped_again(targets, b), 15, "every target again"
                )
            found = await exporter.signals(s)
            peak = exporter.peak_memory_bytes()

    errors = {name: found[name]["error"] for name in found if name != "healthy"}
    assert all(not found[name]["up"] for name in errors), errors
    assert f"response larger than {CAP_BYTES} bytes" in errors["bomb"]
    assert f"response larger than {CAP_BYTES} bytes" in errors["nolength"]
    assert f"more than {SAMPLE_LIMIT} samples" in errors["flood"]
    assert errors["unauthorized"] == "HTTP 401 Unauthorized"
    assert errors["redirect"].startswith("HTTP 302")
    assert seen_auth and all(a == f"Bearer {TOKEN}" for a in seen_auth)
    assert elsewhere.requests == {}  # the redirect was never followed
    # the bomb is stopped at the inflation: it never costs its inflated size in memory
    assert peak < BOMB_INFLATED_BYTES / 2, f"peak RSS {peak / 1e6:.0f} MB"


def _gzip_of_newlines(size: int) -> bytes:
    """A gzip body of `size` newlines (under 5 MB: below the cap, so only inflating it
    can cross the cap), compressed 16 MiB at a time: the test never holds `size` bytes."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\n" * (16 << 20)
    parts = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join([*parts, compressor.flush()])


def _all_scraped_again(targets: Targets, before: dict[str, int]) -> bool:
    async def check() -> bool:
        return all(targets.requests.get(n, 0) > before.get(n, 0) for n in before)

    return check()
