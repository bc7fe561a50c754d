"""Where things are: the repository root and the real /metrics payloads in tests/fixtures/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()
