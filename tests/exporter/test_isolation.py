"""One broken target never blinds the exporter to the others (the real process, real targets).

Each test serves a healthy target whose values move beside a bad one, and checks both
through the exporter's HTTP surface.
"""

from __future__ import annotations

import math
import re

import aiohttp
import pytest

from tests.support.live import Targets, running_exporter, vllm_payload, wait_for

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration

POISON_BUCKET = (
    vllm_payload(2)
    + 'vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m",le="abc"} 1\n'
    + 'vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m",le="+Inf"} 1\n'
    + 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1\n'
)
POISON_BATCH_SIZE = (
    'batchscope_batcher_queue_depth{batcher="b"} 1\n'
    'batchscope_batcher_batch_execution_seconds_count{batcher="b",batch_size="eight"} 3\n'
)
NOT_FINITE = (
    'vllm:num_requests_running{engine="0",model_name="m"} +Inf\n'
    'vllm:num_requests_waiting{engine="0",model_name="m"} NaN\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} -Inf\n'
)
# Registered families, no samples yet: what vLLM serves before its first request.
NO_SAMPLES_YET = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
)


def _config(targets: Targets, entries: dict[str, str]) -> str:
    lines = [
        f'  - {{name: {name}, url: "{targets.url(name)}"{extra}}}'
        for name, extra in entries.items()
    ]
    return "interval_seconds: 0.5\nwindow_seconds: 30\ntargets:\n" + "\n".join(lines) + "\n"


def _sample_values(metrics: str, target: str) -> list[str]:
    return [
        line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("batchscope_") and f'target="{target}"' in line
    ]


async def test_a_poison_sample_never_freezes_the_other_targets(tmp_path) -> None:
    async with Targets() as targets:
        targets.payloads = {
            "healthy": vllm_payload(3),
            "bucket": POISON_BUCKET,
            "batchsize": POISON_BATCH_SIZE,
            "notfinite": NOT_FINITE,
        }
        config = _config(
            targets,
            {
                "healthy": ", cap: 8",
                "bucket": ", cap: 8",
                "batchsize": ", engine: inhouse",
                "notfinite": ", cap: 8",
            },
        )
        async with running_exporter(config, tmp_path) as exporter, aiohttp.ClientSession() as s:

            async def healthy_running_is(value: float) -> bool:
                found = await exporter.signals(s)
                return found.get("healthy", {}).get("total", {}).get("running") == value

            await wait_for(lambda: healthy_running_is(3.0), 20, "running 3")
            targets.payloads["healthy"] = vllm_payload(6)
            await wait_for(lambda: healthy_running_is(6.0), 10, "running 6 after the change")
            await wait_for(
                lambda: _rounds_counted(exporter, s, "bucket", 4), 15, "four poisoned rounds"
            )
            found = await exporter.signals(s)
            metrics = await exporter.get_text(s, "/metrics")

    for name, words in (("bucket", "le='abc'"), ("batchsize", "batch_size='eight'")):
        bad = found[name]
        assert bad["up"] is True, bad
        assert words in bad["error"], bad["error"]
        assert bad["total"]["diagnosis"]["state"] == "unreadable"
        assert words in bad["total"]["diagnosis"]["reason"]
        assert f'batchscope_target_up{{target="{name}"}} 1.0' in metrics
        # logged once, though every round met the same error
        assert exporter.log().count(words) == 1, exporter.log()
    errors = re.search(
        r'batchscope_target_errors_total\{reason="evaluation",target="bucket"\} (\S+)', metrics
    )
    assert errors is not None and float(errors.group(1)) >= 4
    # NaN and infinities never become a signal: the values are absent, everything else finite
    notfinite = found["notfinite"]["total"]
    assert notfinite["running"] is None and notfinite["waiting"] is None
    assert notfinite["kv_cache_usage"] is None and notfinite["running_vs_cap"] is None
    values = _sample_values(metrics, "notfinite")
    assert values and all(math.isfinite(float(v)) for v in values), values


async def _rounds_counted(exporter, session, target: str, at_least: int) -> bool:
    metrics = await exporter.get_text(session, "/metrics")
    m = re.search(
        rf'batchscope_target_errors_total\{{[^}}]*target="{target}"[^}}]*\}} (\S+)', metrics
    )
    return m is not None and float(m.group(1)) >= at_least


async def test_registered_families_without_samples_are_up_with_no_data_yet(tmp_path) -> None:
    async with Targets() as targets:
        targets.payloads = {"healthy": vllm_payload(3), "fresh": NO_SAMPLES_YET}
        config = _config(targets, {"healthy": ", cap: 8", "fresh": ""})
        async with running_exporter(config, tmp_path) as exporter, aiohttp.ClientSession() as s:

            async def both_seen() -> bool:
                return {"healthy", "fresh"} <= set(await exporter.signals(s))

            await wait_for(both_seen, 20, "both targets evaluated")
            targets.payloads["healthy"] = vllm_payload(5)

            async def healthy_moved() -> bool:
                return (await exporter.signals(s))["healthy"]["total"]["running"] == 5.0

            await wait_for(healthy_moved, 10, "the healthy target's running to move to 5")
            fresh = (await exporter.signals(s))["fresh"]
            metrics = await exporter.get_text(s, "/metrics")
    assert fresh["up"] is True and fresh["error"] is None
    assert fresh["total"]["diagnosis"]["state"] == "no_data"
    assert "no samples yet" in fresh["total"]["diagnosis"]["reason"]
    assert 'batchscope_target_up{target="fresh"} 1.0' in metrics
    assert 'batchscope_diagnosis{state="no_data",target="fresh"} 1.0' in metrics


def _sglang_payload(running: float, finished: float) -> str:
    hist = "sglang:e2e_request_latency_seconds"
    return (
        f'sglang:num_running_reqs{{model_name="m"}} {running}\n'
        f'sglang:num_queue_reqs{{model_name="m"}} 0\n'
        f'{hist}_bucket{{model_name="m",le="1.0"}} {finished}\n'
        f'{hist}_bucket{{model_name="m",le="+Inf"}} {finished}\n'
        f'{hist}_sum{{model_name="m"}} {finished / 2}\n'
        f'{hist}_count{{model_name="m"}} {finished}\n'
    )


async def test_an_engine_change_under_auto_resets_the_window_instead_of_a_false_rate(
    tmp_path,
) -> None:
    async with Targets() as targets:
        targets.payloads = {"healthy": vllm_payload(3), "port": vllm_payload(2, 0, 100)}
        config = _config(targets, {"healthy": ", cap: 8", "port": ", cap: 8"})
        async with running_exporter(config, tmp_path) as exporter, aiohttp.ClientSession() as s:

            async def port_rate_known() -> bool:
                found = await exporter.signals(s)
                return found.get("port", {}).get("total", {}).get("requests_per_second") == 0.0

            await wait_for(port_rate_known, 20, "a steady request rate of 0 on vLLM")
            # another server takes the port: SGLang, a million requests finished since its start
            targets.payloads["port"] = _sglang_payload(4, 1_000_000)
            targets.payloads["healthy"] = vllm_payload(7)
            rates = []

            async def sglang_seen_twice() -> bool:
                port = (await exporter.signals(s))["port"]["total"]
                if port["engine"] == "sglang":
                    rates.append(port["requests_per_second"])
                return len(rates) >= 4

            await wait_for(sglang_seen_twice, 15, "four evaluations of the new engine")
            found = await exporter.signals(s)
            metrics = await exporter.get_text(s, "/metrics")
    assert found["healthy"]["total"]["running"] == 7.0
    assert all(rate is None or rate == 0.0 for rate in rates), rates
    assert found["port"]["total"]["running"] == 4.0
    assert 'batchscope_window_resets_total{reason="engine_changed",target="port"} 1.0' in metrics
    assert exporter.log().count("engine changed from vllm to sglang") == 1, exporter.log()
