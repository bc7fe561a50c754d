"""The exporter loop's target set: file_sd files are re-read every round."""

from __future__ import annotations

import json

import pytest

from batchscope.exporter.config.settings import Settings
from batchscope.exporter.scrape.fetch import client_session
from batchscope.exporter.scrape.loop import Exporter

# Starts an exporter, a server or a subprocess, or opens a socket.
pytestmark = pytest.mark.integration


def write_sd(path, groups) -> None:
    path.write_text(json.dumps(groups))


async def test_file_sd_reload_adds_keeps_last_good_and_drops_deleted(tmp_path) -> None:
    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": ["127.0.0.1:1"], "labels": {"name": "a", "cap": "8"}}])
    exporter = Exporter(
        Settings(
            targets=(), file_sd=(str(tmp_path / "*.json"),), interval_seconds=1, timeout_seconds=0.5
        )
    )
    assert sorted(exporter.states) == ["a"]
    assert exporter.states["a"].target.cap == 8

    async with client_session() as session:
        write_sd(sd, [{"targets": ["127.0.0.1:1", "127.0.0.1:2"], "labels": {}}])
        await exporter.run_round(session)
        assert sorted(exporter.states) == ["127.0.0.1:1", "127.0.0.1:2"]
        assert all(not s.signals.up for s in exporter.states.values())  # nothing listens there

        sd.write_text('[{"targets": ["127.0.0.1:1"')  # half-written: keep the last good set
        await exporter.run_round(session)
        assert sorted(exporter.states) == ["127.0.0.1:1", "127.0.0.1:2"]

        sd.unlink()
        await exporter.run_round(session)
        assert exporter.states == {}
