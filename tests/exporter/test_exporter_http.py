"""The real exporter process against good, dead, slow, garbage, huge and authenticated targets.

A bad target marks itself down with the reason and never stalls the others or the
exporter's own /metrics; a credential reaches its target and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from batchscope.exporter import cli
from batchscope.exporter.config.settings import ConfigError, Settings, Target
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter
from tests.support.live import Targets, vllm_payload
from tests.support.network import free_port
from tests.support.paths import fixture_text

SECRET = "s3cret-token-value-1234"


@pytest.fixture
async def targets():
    load = fixture_text("vllm-0.32.0-cpu-load.txt")
    seen_auth: list[str] = []

    async def good(_: web.Request) -> web.Response:
        return web.Response(text=load)

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response(text=load)

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html><h1>502 Bad Gateway</h1></html>", content_type="text/html")

    async def huge(_: web.Request) -> web.Response:
        return web.Response(text=load * 100)  # about 5 MB

    async def broken(_: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{model_name="x" 8\n')

    async def auth(request: web.Request) -> web.Response:
        seen_auth.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {SECRET}":
            return web.Response(status=401, text="unauthorized")
        return web.Response(text=load)

    app = web.Application()
    for name, handler in (
        ("good", good),
        ("slow", slow),
        ("garbage", garbage),
        ("huge", huge),
        ("broken", broken),
        ("auth", auth),
    ):
        app.router.add_get(f"/{name}/metrics", handler)
    # the slow handler never finishes on its own: do not wait for it at cleanup
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", seen_auth
    await runner.cleanup()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, float]:
    started = time.monotonic()
    async with session.get(url) as r:
        return r.status, await r.text(), time.monotonic() - started


@pytest.mark.integration
async def test_bad_targets_are_down_with_reasons_and_never_stall_the_exporter(
    targets, tmp_path
) -> None:
    base, seen_auth = targets
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    config = tmp_path / "fleet.yaml"
    config.write_text(
        f"""interval_seconds: 1
timeout_seconds: 0.8
window_seconds: 10
max_response_bytes: 1000000
targets:
  - {{name: good, url: "{base}/good/metrics", engine: vllm, cap: 8, budget_seconds: 2}}
  - {{name: slow, url: "{base}/slow/metrics", engine: vllm, cap: 8}}
  - {{name: garbage, url: "{base}/garbage/metrics"}}
  - {{name: huge, url: "{base}/huge/metrics", engine: vllm}}
  - {{name: broken, url: "{base}/broken/metrics", engine: vllm}}
  - {{name: dead, url: "{dead}", engine: vllm}}
  - name: env-auth
    url: "{base}/auth/metrics"
    engine: vllm
    auth: {{type: bearer, token_env: BATCHSCOPE_TEST_TOKEN}}
  - name: file-auth
    url: "{base}/auth/metrics"
    engine: vllm
    auth: {{type: bearer, token_file: "{token_file}"}}
"""
    )
    listen = free_port()
    log_path = tmp_path / "exporter.log"
    env = {**os.environ, "BATCHSCOPE_TEST_TOKEN": SECRET}
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "batchscope.exporter.cli",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{listen}",
            "--log-level",
            "debug",
            stdout=log,
            stderr=log,
            env=env,
        )
    try:
        api = f"http://127.0.0.1:{listen}"
        async with aiohttp.ClientSession() as session:
            by_name: dict[str, dict] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                try:
                    status, _, _ = await _get(session, f"{api}/api/v1/signals")
                except aiohttp.ClientError:
                    continue
                async with session.get(f"{api}/api/v1/signals") as r:
                    by_name = {t["target"]: t for t in (await r.json())["targets"]}
                if len(by_name) == 8 and by_name["good"]["total"]["running"] == 8:
                    break
            assert len(by_name) == 8, by_name.keys()

            good = by_name["good"]
            assert good["up"] and good["total"]["running_vs_cap"] == 1.0
            assert good["total"]["diagnosis"]["state"] == "healthy"
            assert by_name["env-auth"]["up"] and by_name["file-auth"]["up"]
            reasons = {
                n: by_name[n]["error"] for n in ("slow", "garbage", "huge", "broken", "dead")
            }
            assert "timed out after 0.8 s" in reasons["slow"]
            assert "no known engine" in reasons["garbage"]
            assert "larger than 1000000 bytes" in reasons["huge"]
            assert "line 1" in reasons["broken"]
            assert "Connect" in reasons["dead"]
            for name in reasons:
                assert not by_name[name]["up"]
                assert by_name[name]["total"]["diagnosis"]["state"] == "down"

            # the slow target hangs for 60 s on every round; /metrics still answers at once
            latencies = []
            for _ in range(5):
                status, text, seconds = await _get(session, f"{api}/metrics")
                assert status == 200
                latencies.append(seconds)
            assert max(latencies) < 2.0, latencies
            assert 'batchscope_target_up{target="slow"} 0.0' in text
            assert 'batchscope_target_up{target="good"} 1.0' in text
            assert (
                'batchscope_diagnosis{engine="0",model_name="/tmp/tinyllama",state="healthy",'
                'target="good"} 1.0' in text
            )

            status, _, _ = await _get(session, f"{api}/api/v1/history?target=nope")
            assert status == 404
            status, body, _ = await _get(session, f"{api}/api/v1/history?target=good")
            assert status == 200 and '"points"' in body

            pages = [
                await _get(session, f"{api}{p}")
                for p in ("/metrics", "/api/v1/signals", "/api/v1/targets", "/api/v1/history")
            ]
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    log_text = log_path.read_text()
    assert SECRET in "".join(seen_auth)  # it did reach the target
    assert SECRET not in log_text
    for _, body, _ in pages:
        assert SECRET not in body
    assert "stopped" in log_text
    assert "event loop: uvloop" in log_text  # the default where uvloop is installed


def test_the_event_loop_is_uvloop_unless_asked_otherwise(monkeypatch) -> None:
    import uvloop

    assert cli.loop_factory("auto") is uvloop.new_event_loop
    assert cli.loop_factory("uvloop") is uvloop.new_event_loop
    assert cli.loop_factory("asyncio") is None
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed
    assert cli.loop_factory("auto") is None
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        cli.loop_factory("uvloop")


@pytest.mark.integration
def test_uvloop_reads_a_fleet_as_asyncio_s_own_loop_reads_it() -> None:
    # uvloop is a fast path behind one seam (`cli.loop_factory`); asyncio's loop is its
    # plain twin: the same scrapes read on either give the same signals.
    def one_round(factory) -> list[TargetSignals]:
        async def main() -> list[TargetSignals]:
            async with Targets() as served:
                served.payloads = {
                    "load": fixture_text("vllm-0.32.0-cpu-load.txt"),
                    "small": vllm_payload(3, 2, 10),
                    "garbage": "<html>502</html>",
                }
                names = [*served.payloads, "dead"]
                targets = tuple(Target(n, served.url(n), engine="vllm", cap=8) for n in names)
                exporter = Exporter(Settings(targets=targets), clock=lambda: 1000.0)
                async with client_session() as session:
                    await exporter.run_round(session)
            # the wall time a scrape took, and the port the targets were served on, differ
            return [replace(s, scrape_seconds=None, url="") for s in exporter.current()]

        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main())

    read = one_round(cli.loop_factory("uvloop"))
    assert [(s.target, s.up) for s in read] == [
        ("load", True),
        ("small", True),
        ("garbage", False),
        ("dead", False),
    ]
    assert repr(read) == repr(one_round(cli.loop_factory("asyncio")))


@pytest.mark.integration
async def test_config_error_names_file_and_line(tmp_path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("targets:\n  - name: a\n    url: http://127.0.0.1:1/metrics\n    cap: -3\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "batchscope.exporter.cli",
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    message = err.decode()
    assert f"{config}:4" in message and "cap" in message


def _dead_target_on(port: int) -> tuple[str, ...]:
    """The exporter's flags for one target that never answers, served on `port`."""
    return (
        "--target",
        "http://127.0.0.1:1/metrics",
        "--name",
        "x",
        "--listen",
        f"127.0.0.1:{port}",
    )


@pytest.mark.integration
async def test_listen_on_a_busy_port_is_a_clear_error(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "batchscope.exporter.cli",
            *_dead_target_on(port),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err.decode()


SWITCH_REPORTER = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("switch interval", sys.getswitchinterval(), flush=True))
atexit.register(lambda: print("gc threshold", gc.get_threshold()[0], flush=True))
sys.argv = ["batchscope.exporter.cli", *sys.argv[1:]]
runpy.run_module("batchscope.exporter.cli", run_name="__main__")
"""


@pytest.mark.integration
async def test_the_exporter_hands_the_gil_over_every_half_millisecond() -> None:
    # Renders run in a thread beside the event loop; at CPython's 5 ms switch interval a
    # /metrics request that came during a render of 1,000 targets waited 100 to 200 ms
    # (docs/benchmarks.md, /metrics latency). The process the CLI runs sets 0.5 ms, and
    # its collector's young threshold (`tune_collector`).
    from batchscope.exporter.serve.app import SWITCH_INTERVAL_SECONDS

    assert SWITCH_INTERVAL_SECONDS == 0.0005
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SWITCH_REPORTER,
        *_dead_target_on(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while True:
                try:
                    status, _, _ = await _get(session, f"http://127.0.0.1:{port}/metrics")
                    if status == 200:
                        break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "the exporter never answered"
                await asyncio.sleep(0.2)
    finally:
        proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert "switch interval 0.0005" in out.decode(), err.decode()
    assert "gc threshold 50000" in out.decode(), err.decode()
