"""Shared test helpers: the real /metrics payloads in tests/fixtures/."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def vllm_load() -> str:
    return fixture_text("vllm-0.32.0-cpu-load.txt")
