"""A cap is a whole number of sequences, at least 1: anything else is refused at start."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.support.live import ROOT


async def _start(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "batchscope.exporter.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, err.decode()


@pytest.mark.integration
@pytest.mark.parametrize("cap", ["0.5", "2.5", "1.5"])
async def test_a_cap_that_is_not_a_whole_number_of_at_least_one_is_refused(tmp_path, cap) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        f"targets:\n  - name: a\n    url: http://127.0.0.1:1/metrics\n    cap: {cap}\n"
    )
    code, err = await _start("--config", str(config))
    assert code == 2 and f"{config}:4: targets[0].cap: must be a whole number >= 1" in err, err
    code, err = await _start("--target", "http://127.0.0.1:1/metrics", "--cap", cap)
    assert code == 2 and "--cap: must be a whole number >= 1" in err, err
    sd = tmp_path / "sd.json"
    sd.write_text(json.dumps([{"targets": ["127.0.0.1:1"], "labels": {"cap": cap}}]))
    config.write_text(f"file_sd: [{sd}]\n")
    code, err = await _start("--config", str(config))
    assert code == 2 and "cap: must be a whole number >= 1" in err, err


async def test_a_whole_cap_written_as_a_float_is_accepted(tmp_path) -> None:
    from batchscope.exporter.config.fleet_file import load_config

    config = tmp_path / "fleet.yaml"
    config.write_text(
        "targets:\n  - name: a\n    url: http://127.0.0.1:1/metrics\n    cap: 256.0\n"
    )
    assert load_config(config).targets[0].cap == 256
