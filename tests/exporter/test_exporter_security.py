"""The exporter's own endpoints and its secrets: a token and TLS when asked for, no
cross-origin reads of the JSON API, query values redacted, warnings at start."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest
from aiohttp import web

from batchscope.exporter.config.exposure_warnings import exposure_warnings
from batchscope.exporter.config.settings import Auth, Settings, Target
from tests.support.live import Targets, running_exporter, vllm_payload, wait_for
from tests.support.system_tools import self_signed_certificate

WEB_TOKEN = "exporter-web-token-9876"
QUERY_KEY = "SUPERSECRETQUERYKEY42"


@pytest.mark.integration
async def test_token_tls_origin_and_redaction_on_the_real_endpoints(tmp_path) -> None:
    cert, key = map(str, self_signed_certificate(tmp_path))
    trust = ssl.create_default_context(cafile=cert)
    queries: list[str] = []
    async with Targets() as targets:
        targets.payloads = {"healthy": vllm_payload(3)}

        async def keyed(request: web.Request) -> web.Response:
            queries.append(request.query_string)
            return web.Response(text=vllm_payload(1))

        targets.handlers = {"keyed": keyed}
        sd = tmp_path / "sd.json"
        host = targets.base.removeprefix("http://")
        sd.write_text(
            json.dumps(
                [
                    {
                        "targets": [host],
                        "labels": {
                            "__metrics_path__": "/keyed/metrics",
                            "__param_key": QUERY_KEY,
                            "batchscope_name": "keyed",
                        },
                    }
                ]
            )
        )
        config = f"""interval_seconds: 0.5
window_seconds: 30
file_sd: ["{sd}"]
targets:
  - {{name: healthy, url: "{targets.url("healthy")}", cap: 8}}
  - name: clear-text
    url: "{targets.url("healthy")}"
    auth: {{type: bearer, token_env: WEB_TOKEN_FOR_TARGET}}
"""
        env = {"EXPORTER_WEB_TOKEN": WEB_TOKEN, "WEB_TOKEN_FOR_TARGET": "t"}
        args = (
            "--web-token-env",
            "EXPORTER_WEB_TOKEN",
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
        )
        async with (
            running_exporter(config, tmp_path, *args, env=env, tls=trust) as exporter,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as s,
        ):
            auth = {"Authorization": f"Bearer {WEB_TOKEN}"}

            async def status(path: str, headers: dict[str, str]) -> int:
                async with s.get(exporter.base + path, headers=headers) as r:
                    return r.status

            async def both_up() -> bool:
                async with s.get(exporter.base + "/api/v1/signals", headers=auth) as r:
                    found = {t["target"]: t for t in (await r.json())["targets"]}
                return all(found.get(n, {}).get("up") for n in ("healthy", "keyed"))

            await wait_for(both_up, 20, "both targets up")
            statuses = {
                "metrics without token": await status("/metrics", {}),
                "metrics with a wrong token": await status(
                    "/metrics", {"Authorization": "Bearer nope"}
                ),
                "metrics with the token": await status("/metrics", auth),
                "health without token": await status("/health", {}),
                "api from another origin": await status(
                    "/api/v1/signals", {**auth, "Origin": "https://evil.example"}
                ),
                "api from a cross-site script": await status(
                    "/api/v1/targets",
                    {**auth, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"},
                ),
                "api from its own origin": await status(
                    "/api/v1/signals", {**auth, "Origin": exporter.base}
                ),
            }
            bodies = []
            for path in ("/api/v1/targets", "/api/v1/signals", "/metrics", "/api/v1/history"):
                async with s.get(exporter.base + path, headers=auth) as r:
                    bodies.append(await r.text())
            plain = exporter.base.replace("https://", "http://")
            async with aiohttp.ClientSession() as insecure:
                try:
                    async with insecure.get(plain + "/health") as r:
                        plain_status = r.status
                except aiohttp.ClientError:
                    plain_status = None
    assert statuses == {
        "metrics without token": 401,
        "metrics with a wrong token": 401,
        "metrics with the token": 200,
        "health without token": 200,
        "api from another origin": 403,
        "api from a cross-site script": 403,
        "api from its own origin": 200,
    }
    assert plain_status != 200  # TLS only
    assert f"key={QUERY_KEY}" in queries  # the key still reaches its target
    for body in bodies:
        assert QUERY_KEY not in body
    assert "key=REDACTED" in bodies[0] and "key=REDACTED" in bodies[1]
    log = exporter.log()
    assert QUERY_KEY not in log and WEB_TOKEN not in log
    assert log.count("target clear-text: its bearer credentials go over plain http://") == 1


def test_listening_beyond_loopback_without_token_or_tls_is_warned() -> None:
    target = Target("a", "https://10.0.0.1:8000/metrics")
    open_wide = Settings(targets=(target,), listen="0.0.0.0:9500")
    warnings = exposure_warnings(open_wide, [target])
    assert len(warnings) == 1 and "without a token and TLS" in warnings[0]
    guarded = Settings(
        targets=(target,),
        listen="0.0.0.0:9500",
        web_token_env="T",
        tls_cert_file="c",
        tls_key_file="k",
    )
    assert exposure_warnings(guarded, [target]) == []
    assert exposure_warnings(Settings(targets=(target,)), [target]) == []  # 127.0.0.1
    clear = Target("b", "http://10.0.0.2/metrics", auth=Auth("bearer", token_env="X"))
    assert exposure_warnings(Settings(targets=(clear,)), [clear]) == [
        "target b: its bearer credentials go over plain http://, readable by anyone on "
        "the path; use https://"
    ]
