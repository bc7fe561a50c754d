"""/api/v1/history without a target is bounded: a page of targets, the last N points each."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.live import Targets, running_exporter, vllm_payload, wait_for

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


TARGETS = 150


async def test_all_histories_come_in_pages_of_at_most_100_targets_and_n_points(tmp_path) -> None:
    async with Targets() as targets:
        names = [f"t{i:03d}" for i in range(TARGETS)]
        targets.payloads = {name: vllm_payload(i % 8) for i, name in enumerate(names)}
        entries = "\n".join(f'  - {{name: {n}, url: "{targets.url(n)}", cap: 8}}' for n in names)
        config = f"interval_seconds: 0.5\nwindow_seconds: 30\ntargets:\n{entries}\n"
        async with running_exporter(config, tmp_path) as exporter, aiohttp.ClientSession() as s:

            async def four_points_each() -> bool:
                body = await exporter.get_json(s, "/api/v1/history?target=t149")
                return len(body["points"]) >= 4

            await wait_for(four_points_each, 30, "four rounds")
            first = await exporter.get_json(s, "/api/v1/history?points=3")
            second = await exporter.get_json(s, "/api/v1/history?points=3&page=1")
            default = await exporter.get_json(s, "/api/v1/history")
            async with s.get(exporter.base + "/api/v1/history?points=0") as r:
                refused = (r.status, await r.json())
            async with s.get(exporter.base + "/api/v1/history?page=2") as r:
                past_the_end = (r.status, await r.json())
    assert (first["page"], first["pages"], first["points_per_target"]) == (0, 2, 3)
    assert list(first["targets"]) == names[:100]
    assert list(second["targets"]) == names[100:]
    assert all(len(points) == 3 for points in first["targets"].values())
    assert all(len(points) == 3 for points in second["targets"].values())
    assert default["points_per_target"] == 60 and len(default["targets"]) == 100
    # the newest points: the same last point as the single-target history
    assert first["targets"]["t000"][-1]["t"] >= second["targets"]["t149"][0]["t"] - 5
    assert refused[0] == 400 and "points" in refused[1]["error"]
    assert past_the_end[0] == 400 and "page" in past_the_end[1]["error"]
