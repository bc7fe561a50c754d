"""Fixtures shared by every test package (helpers live in tests/support/)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.paths import fixture_text

# Every property test draws the same examples on every run: a suite that passed cannot
# fail on a fresh random draw, nor on a slow machine (no deadline per example). New examples are the fuzzer's job, run for longer by hand
# (`scripts/fuzz_parser.py -max_total_time=300`), and what it finds lands here as a test.
settings.register_profile("repeatable", derandomize=True, deadline=None)
settings.load_profile("repeatable")

# The one subprocess the unit tier may start: promtool's rule tests, short and serverless.
UNIT_TIER_COMMANDS = ("promtool",)


class LeftTheUnitTier(AssertionError):
    """A test of the unit tier opened a network socket or started a subprocess."""


def _in_unit_tier(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in ("integration", "slow"))


@pytest.fixture(autouse=True)
def _unit_tier_stays_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """The unit tier (`make test-fast`) opens no network socket and starts no subprocess
    but promtool: a test that needs either is marked `integration`, and one that forgot
    fails here instead of making the fast tier slow or flaky."""
    if not _in_unit_tier(request.node):
        return

    def refuse(what: str):
        def refused(*args, **kwargs):
            raise LeftTheUnitTier(f"{what} in the unit tier: mark the test integration")

        return refused

    for method in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, method, refuse(f"socket.{method}"))
    execute_child = subprocess.Popen._execute_child

    def only_promtool(self, args, *rest, **kwargs):
        program = args[0] if isinstance(args, list | tuple) else str(args).split()[0]
        if Path(str(program)).name not in UNIT_TIER_COMMANDS:
            raise LeftTheUnitTier(
                f"subprocess {program} in the unit tier: mark the test integration"
            )
        return execute_child(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", only_promtool)


@pytest.fixture
def vllm_load() -> str:
    return fixture_text("vllm-0.32.0-cpu-load.txt")
