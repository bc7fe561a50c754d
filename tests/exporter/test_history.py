"""A target's packed history: the rows it answers are the rows it was given, in bounded
memory, each diagnosis change kept once."""

from __future__ import annotations

import gc
import math
import random

import pytest

from batchscope.exporter.serve.api_json import PACKED_NUMBERS, POINT_NUMBERS, HistoryRow
from batchscope.exporter.serve.history import BLOCK_ROWS, History

STEADY = "running {} of cap 256 with {} waiting: continuous batching is doing its job"
QUEUED = "running {} while {} wait, with 11% of the KV cache used: something else limits it"


def _row(i: int, rng: random.Random, wording: str = STEADY, series: tuple = ()) -> HistoryRow:
    numbers = [rng.uniform(0, 300) if k % 3 else math.nan for k in range(len(POINT_NUMBERS))]
    reason = wording.format(rng.randint(0, 256), rng.uniform(0, 64))
    return (1000.0 + 5 * i, i % 11 != 0, PACKED_NUMBERS.pack(*numbers), "healthy", reason, series)


def _same(rows: list[HistoryRow], expected: list[HistoryRow]) -> bool:
    """Equal rows, NaNs included (packed bytes compare as bytes)."""
    return rows == expected


def test_rows_come_back_exactly_the_newest_maxlen_in_order() -> None:
    rng = random.Random(1)
    wordings = [STEADY, QUEUED, "no numbers here", "a \x00 in a reason, 3 of it"]
    series = ((("model", "a"), (b"x", "healthy", "a 1")),)
    rows = [_row(i, rng, wordings[(i // 40) % 4], series if i % 70 < 5 else ()) for i in range(250)]
    history = History(100)
    for n, row in enumerate(rows, 1):
        history.append(row)
        assert len(history) == min(n, 100)
    assert _same(list(history), rows[-100:])
    assert _same(history.last(7), rows[-7:])
    assert _same(history.last(1000), rows[-100:])
    assert history.last(0) == []


@pytest.mark.parametrize("maxlen", [1, BLOCK_ROWS - 1, BLOCK_ROWS, BLOCK_ROWS + 1, 720])
def test_every_bound_keeps_exactly_its_last_rows(maxlen: int) -> None:
    rng = random.Random(maxlen)
    rows = [_row(i, rng) for i in range(3 * maxlen + 5)]
    history = History(maxlen)
    for row in rows:
        history.append(row)
    assert _same(list(history), rows[-maxlen:])


def test_a_reason_is_kept_once_per_change_of_its_words_not_per_point() -> None:
    rng = random.Random(2)
    history = History(720)
    for i in range(720):  # the numbers in the reason move at every point
        history.append(_row(i, rng, STEADY if (i // 100) % 2 == 0 else QUEUED))
    assert len({row[4] for row in history}) > 700
    assert history.changes_kept() == 8  # 0-99, 100-199, ..., 700-719
    for i in range(720, 1440):
        history.append(_row(i, rng, QUEUED))
    # the rows before the last change are gone: the one change covering them all is left
    assert history.changes_kept() == 1


def test_an_hour_of_one_series_rows_holds_no_object_per_row() -> None:
    rng = random.Random(3)
    history = History(720)
    for i in range(2000):
        history.append(_row(i, rng))
    reachable, tracked = _objects(history)
    # 23 or 24 compressed blocks, the open one, one change and a dozen objects of its own
    # (its dict, deques, counters, the change's strings): not an object per row
    assert reachable <= 720 // BLOCK_ROWS + 16
    assert tracked <= 6


def _objects(root: object) -> tuple[int, int]:
    """(objects reachable from `root`, of them those the collector walks)."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
    return len(seen), sum(gc.is_tracked(o) for o in seen.values())
