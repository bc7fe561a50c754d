"""Real targets served locally and the real exporter process, for end-to-end checks.

`Targets` serves `/{name}/metrics` from a dict a test changes while the exporter runs;
`running_exporter` starts `python -m batchscope.exporter.cli --config FILE` and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.network import free_port
from tests.support.paths import REPO

ROOT = REPO
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def vllm_payload(running: float, waiting: float = 0.0, requests_total: float = 0.0) -> str:
    """A minimal vLLM V1 payload with the given scheduler gauges and finished requests."""
    labels = 'engine="0",model_name="m"'
    return (
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.5\n"
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {requests_total}\n'
    )


class Targets:
    """An aiohttp server answering `/{name}/metrics` with `payloads[name]` (text) or a
    handler from `handlers`; `requests[name]` counts the requests each one got."""

    def __init__(self) -> None:
        self.payloads: dict[str, str] = {}
        self.handlers: dict[str, Handler] = {}
        self.requests: dict[str, int] = {}
        self.base = ""
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests[name] = self.requests.get(name, 0) + 1
        if name in self.handlers:
            return await self.handlers[name](request)
        if name not in self.payloads:
            return web.Response(status=404)
        return web.Response(text=self.payloads[name])

    async def __aenter__(self) -> Targets:
        app = web.Application()
        app.router.add_get("/{name}/metrics", self._answer)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def url(self, name: str) -> str:
        return f"{self.base}/{name}/metrics"


class Exporter:
    """A running exporter process: its base URL and its log."""

    def __init__(self, base: str, log_path: Path, pid: int) -> None:
        self.base = base
        self.log_path = log_path
        self.pid = pid

    def peak_memory_bytes(self) -> int:
        """The process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc status")

    def log(self) -> str:
        return self.log_path.read_text()

    async def get_json(self, session: aiohttp.ClientSession, path: str) -> dict[str, Any]:
        async with session.get(self.base + path) as r:
            assert r.status == 200, (path, r.status, await r.text())
            return await r.json()

    async def get_text(self, session: aiohttp.ClientSession, path: str) -> str:
        async with session.get(self.base + path) as r:
            assert r.status == 200, (path, r.status)
            return await r.text()

    async def signals(self, session: aiohttp.ClientSession) -> dict[str, dict]:
        body = await self.get_json(session, "/api/v1/signals")
        return {t["target"]: t for t in body["targets"]}


@contextlib.asynccontextmanager
async def running_exporter(
    config: str,
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[Exporter]:
    """The exporter process on `config` (YAML text), up and answering /health
    (over HTTPS, trusting `tls`, when given)."""
    config_path = tmp_path / "exporter.yaml"
    config_path.write_text(config)
    port = free_port()
    log_path = tmp_path / "exporter.log"
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "batchscope.exporter.cli",
            "--config",
            str(config_path),
            "--listen",
            f"127.0.0.1:{port}",
            *args,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
    scheme = "https" if tls is not None else "http"
    exporter = Exporter(f"{scheme}://127.0.0.1:{port}", log_path, proc.pid)
    try:
        connector = aiohttp.TCPConnector(ssl=tls) if tls is not None else None
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.monotonic() + 30
            while True:
                assert proc.returncode is None, exporter.log()
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(exporter.base + "/health") as r:
                        if r.status == 200:
                            break
                assert time.monotonic() < deadline, exporter.log()
                await asyncio.sleep(0.2)
        yield exporter
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)


async def wait_for(
    check: Callable[[], Awaitable[bool]], seconds: float, what: str, step: float = 0.3
) -> None:
    """Poll `check` until it holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(step)
