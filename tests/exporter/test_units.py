"""How shares and durations read: the diagnosis' reasons and the dashboard write them alike."""

from __future__ import annotations

import pytest

from batchscope.exporter.core.units import count_text, percent_text, rate_text, seconds_text


@pytest.mark.parametrize(
    ("ratio", "text"),
    [(2.3298, "233%"), (0.095, "9.5%"), (0.004, "0.4%"), (0.0, "0%"), (0.9995, "100%")],
)
def test_a_share_is_a_whole_percentage_with_one_decimal_under_ten(ratio: float, text: str):
    assert percent_text(ratio) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.045, "45 ms"),
        (4.975, "4.97 s"),
        (2.0, "2 s"),
        (57.01, "57 s"),
        (150.0, "2.5 min"),
        (2700.0, "45 min"),
        (9000.0, "2.5 h"),
        (3 * 86400.0, "3.0 d"),
        (30 * 86400.0, "30 d"),
    ],
)
def test_a_duration_reads_in_the_unit_that_reads_best(seconds: float, text: str):
    assert seconds_text(seconds) == text


def test_rates_and_counts_read_as_the_replica_reasons_write_them():
    assert [rate_text(x) for x in (None, 0.0123, 9.5, 14.53, 99.94, 1234.6)] == [
        "0",
        "0.0123",
        "9.5",
        "14.5",
        "99.9",
        "1,235",
    ]
    assert [count_text(x) for x in (None, 16.0, 2.25, 7)] == ["0", "16", "2.2", "7"]
