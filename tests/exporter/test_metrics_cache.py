"""/metrics from the real exporter process: gzip when asked, plain otherwise, each body
whole (the round cache's rendering is counted in test_round_cache)."""

from __future__ import annotations

import gzip

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.live import Targets, running_exporter, vllm_payload, wait_for

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


async def test_metrics_come_gzip_when_asked_and_agree_with_the_plain_body(tmp_path) -> None:
    async with Targets() as targets:
        targets.payloads = {"a": vllm_payload(3), "b": vllm_payload(5)}
        config = (
            "interval_seconds: 2\nwindow_seconds: 30\ntargets:\n"
            f'  - {{name: a, url: "{targets.url("a")}", cap: 8}}\n'
            f'  - {{name: b, url: "{targets.url("b")}", cap: 8}}\n'
        )
        async with (
            running_exporter(config, tmp_path) as exporter,
            aiohttp.ClientSession(auto_decompress=False) as s,
        ):

            async def both_up() -> bool:
                async with s.get(
                    exporter.base + "/metrics", headers={"Accept-Encoding": "identity"}
                ) as r:
                    text = await r.text()
                return all(f'batchscope_target_up{{target="{n}"}} 1.0' in text for n in "ab")

            await wait_for(both_up, 20, "both targets on /metrics")
            bodies = []
            for encoding in ("gzip", "identity", "gzip, deflate"):
                async with s.get(
                    exporter.base + "/metrics", headers={"Accept-Encoding": encoding}
                ) as r:
                    bodies.append((r.headers.get("Content-Encoding"), await r.read()))
    (zipped, packed), (plain_encoding, plain), (again, packed_again) = bodies
    assert (zipped, plain_encoding, again) == ("gzip", None, "gzip")
    # Each body whole, whichever round it is from (a round may turn between requests here;
    # that the same round's bodies are the same bytes, test_exporter_app holds in-process).
    for body in (gzip.decompress(packed), plain, gzip.decompress(packed_again)):
        families = {f.name for f in text_string_to_metric_families(body.decode())}
        assert {"batchscope_target_up", "batchscope_running_requests"} <= families
        assert b'batchscope_running_requests{engine="0",model_name="m",target="b"} 5.0' in body
