"""Fixtures shared by every test package (helpers live in tests/support/)."""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.support.paths import fixture_text

# Every property test draws the same examples on every run: a suite that passed cannot
# fail on a fresh random draw. New examples are the fuzzers' job, run for longer by
# `make bench` (scripts/fuzz_parser.py), and what they find lands here as a test.
settings.register_profile("repeatable", derandomize=True)
settings.load_profile("repeatable")


@pytest.fixture
def vllm_load() -> str:
    return fixture_text("vllm-0.32.0-cpu-load.txt")
