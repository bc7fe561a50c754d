"""Shared by the tests: moved out of tests/exporter/test_capacity.py so no test imports another."""

from __future__ import annotations

LINEAR = {b: 0.001 + 0.001 * b for b in (1, 2, 4, 8, 16, 32)}
