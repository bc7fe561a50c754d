"""Sharding: N exporters with --shard K/N over one file_sd list split the fleet between
them (each target in exactly one shard) and give the same signals as one exporter."""

from __future__ import annotations

import contextlib
import json

import aiohttp
import pytest

from batchscope.exporter.config.settings import Settings
from tests.support.live import Targets, running_exporter, vllm_payload, wait_for

FLEET = 24
SHARDS = 3
COMPARED = ("running", "waiting", "cap", "running_vs_cap", "kv_cache_usage")


def test_every_name_falls_in_exactly_one_shard() -> None:
    names = [f"host-{i}:8000" for i in range(1000)]
    shards = [Settings(targets=(), shard=f"{k}/4") for k in range(4)]
    counts = [sum(s.in_shard(n) for n in names) for s in shards]
    assert all(sum(s.in_shard(n) for s in shards) == 1 for n in names)
    assert sum(counts) == 1000 and min(counts) > 200, counts  # about a quarter each


@pytest.mark.integration
async def test_shards_over_one_file_sd_give_the_signals_of_one_exporter(tmp_path) -> None:
    async with Targets() as targets:
        names = [f"t{i:02d}" for i in range(FLEET)]
        targets.payloads = {n: vllm_payload(i % 9, i % 4) for i, n in enumerate(names)}
        host = targets.base.removeprefix("http://")
        sd = tmp_path / "fleet.json"
        sd.write_text(
            json.dumps(
                [
                    {
                        "targets": [host],
                        "labels": {
                            "__metrics_path__": f"/{n}/metrics",
                            "batchscope_name": n,
                            "cap": "8",
                        },
                    }
                    for n in names
                ]
            )
        )
        config = f'interval_seconds: 0.5\nwindow_seconds: 30\nfile_sd: ["{sd}"]\n'
        seen: list[dict[str, dict]] = []
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(aiohttp.ClientSession())
            exporters = []
            for k in range(SHARDS + 1):
                folder = tmp_path / f"e{k}"
                folder.mkdir()
                args = ("--shard", f"{k}/{SHARDS}") if k < SHARDS else ()
                exporters.append(
                    await stack.enter_async_context(running_exporter(config, folder, *args))
                )
            for exporter in exporters:

                async def settled(e=exporter) -> bool:
                    found = await e.signals(session)
                    return (
                        bool(found)
                        and all(t["up"] for t in found.values())
                        and (e is not exporters[-1] or len(found) == FLEET)
                    )

                await wait_for(settled, 20, "an exporter's targets up")
            for exporter in exporters:
                seen.append(await exporter.signals(session))
    *shards, single = seen
    in_shards = [set(s) for s in shards]
    assert sum(len(s) for s in in_shards) == FLEET
    assert set().union(*in_shards) == set(single) == set(names)
    assert all(len(s) >= 2 for s in in_shards), [len(s) for s in in_shards]
    for shard in shards:
        for name, signals in shard.items():
            assert {f: signals["total"][f] for f in COMPARED} == {
                f: single[name]["total"][f] for f in COMPARED
            }
            assert signals["total"]["diagnosis"] == single[name]["total"]["diagnosis"]
