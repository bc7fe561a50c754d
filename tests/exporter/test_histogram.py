"""The one counter-reset algorithm for histograms: `histogram_increase` over a window."""

from __future__ import annotations

import math

import pytest

from batchscope.exporter.core.histogram import Histogram, histogram_increase, histogram_quantile

INF = math.inf
BOUNDS = (0.1, 0.5, 1.0, INF)


def hist(counts, bounds=BOUNDS, total=0.0):
    return Histogram(tuple(bounds), tuple(float(c) for c in counts), total, float(counts[-1]))


def test_without_a_reset_the_increase_is_newest_minus_oldest() -> None:
    window = [
        hist([1, 2, 3, 3], total=1.0),
        hist([2, 4, 6, 7], total=3.0),
        hist([3, 8, 10, 12], total=6.5),
    ]
    inc = histogram_increase(window)
    assert inc.counts == (2, 6, 7, 9)
    assert inc.count == 9 and inc.sum == pytest.approx(5.5)


def test_a_reset_mid_window_counts_the_part_after_it_from_zero() -> None:
    window = [
        hist([5, 10, 12, 12], total=4.0),
        hist([6, 12, 15, 16], total=6.0),  # +4 observations
        hist([1, 1, 2, 2], total=0.5),  # restarted: 2 since the restart
        hist([2, 3, 5, 6], total=2.5),  # +4 more
    ]
    inc = histogram_increase(window)
    assert inc.counts == (1 + 2, 2 + 3, 3 + 5, 4 + 6)
    assert inc.count == 10 and inc.sum == pytest.approx(2.0 + 2.5)


def test_a_bucket_going_down_is_a_reset_even_when_the_count_grew() -> None:
    # after a restart the server saw more slow requests than before in total,
    # but fewer fast ones: subtracting would give a negative bucket
    older = hist([8, 9, 10, 10])
    newer = hist([2, 3, 12, 14])
    inc = histogram_increase([older, newer])
    assert inc.counts == (2, 3, 12, 14)
    assert all(c >= 0 for c in inc.bucket_counts())


def test_a_histogram_created_inside_the_window_counts_from_zero() -> None:
    inc = histogram_increase([None, None, hist([1, 2, 3, 3]), hist([2, 4, 6, 7])])
    assert inc.counts == (2, 4, 6, 7) and inc.count == 7
    # absent in the middle (a scrape that missed it) is not a restart
    assert histogram_increase([hist([1, 1, 1, 1]), None, hist([3, 3, 3, 3])]).count == 2


def test_a_layout_change_that_leaves_observations_on_both_sides_cannot_be_added() -> None:
    other = (0.2, 2.0, INF)
    before = [hist([1, 2, 3, 3]), hist([2, 4, 6, 6])]
    after = [
        Histogram(other, (1.0, 2.0, 2.0), 1.0, 2.0),
        Histogram(other, (2.0, 3.0, 5.0), 2.0, 5.0),
    ]
    assert histogram_increase(before + after) is None
    # the new layout alone, from a restart at the start of the window, adds up
    assert histogram_increase([hist([2, 4, 6, 6])] + after).counts == (2.0, 3.0, 5.0)


def test_fewer_than_two_scrapes_or_none_at_all_say_nothing() -> None:
    assert histogram_increase([hist([1, 2, 3, 3])]) is None
    assert histogram_increase([None, None]) is None
    assert histogram_increase([]) is None


def test_the_increase_feeds_a_promql_like_quantile() -> None:
    inc = histogram_increase([hist([10, 20, 30, 30]), hist([10, 60, 100, 100])])
    # rank 0.99*70 = 69.3 in (0.5, 1.0]: 0.5 + 0.5 * (69.3 - 40) / 30
    assert histogram_quantile(0.99, inc) == pytest.approx(0.98833333)
