"""Fixtures shared by every test package (helpers live in tests/support/)."""

from __future__ import annotations

import pytest

from tests.support.paths import fixture_text


@pytest.fixture
def vllm_load() -> str:
    return fixture_text("vllm-0.32.0-cpu-load.txt")
