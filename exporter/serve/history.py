"""A target's history: the rows of its last evaluations, packed into bounded memory.

A row (`api_json.HistoryRow`) is kept in two parts:
- what changes at every evaluation: its time, up flag, the total's packed numbers, and
  the numbers said in its diagnosis reason, as one record; records go 32 to a block,
  and a full block is compressed (zlib): a target's numbers repeat from one
  evaluation to the next (its cap, its flags, the NaNs of what it does not expose), so
  a block compresses several fold;
- what changes when the diagnosis changes: its state, its reason's words (the reason
  with each number taken out, `_wording`) and, for a target with several series, the
  per-series part. Those are kept once per change, with the index of the first row
  that has them.

Reading a row puts the reason back together, number by number, exactly as it was.
`Histories` keeps one History a monitored target, fed by the Exporter's evaluations.
"""

from __future__ import annotations

import itertools
import re
import struct
import sys
import weakref
import zlib
from collections import deque
from collections.abc import Iterator

from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.loop import Exporter, TargetState
from batchscope.exporter.serve import api_json as api

BLOCK_ROWS = 32
# A number said in a reason: kept with the row's numbers, not in the reason's words.
# Captured, so that one split cuts a reason into its words and its numbers in turn.
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")
_GAP = "\x00"  # where a number was taken out of a reason's words
# (t, up, length of the reason's numbers as text) before the packed numbers.
_HEAD = struct.Struct("<d?H")
_PACKED = api.PACKED_NUMBERS.size

# (state, the reason's words, the per-series part): what a run of rows shares.
_Change = tuple[str, str, tuple]


def _wording(reason: str) -> tuple[str, str]:
    """(the reason's words with a _GAP for each number, its numbers joined by _GAP);
    a reason that holds _GAP itself is kept whole, with no numbers."""
    if _GAP in reason:
        return reason, ""
    # One pass of the regex (a sub and a findall took two, the most of an append): the
    # words are the even parts, the numbers the odd ones.
    parts = _NUMBER.split(reason)
    return _GAP.join(parts[0::2]), _GAP.join(parts[1::2])


def _reason(words: str, numbers: str) -> str:
    """The reason `_wording` took apart."""
    if not numbers:
        return words
    parts = words.split(_GAP)
    said = zip(parts[:-1], numbers.split(_GAP), strict=True)
    return "".join(itertools.chain.from_iterable(said)) + parts[-1]


class History:
    """The last `maxlen` rows of one target, oldest first; `append` adds the newest."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._blocks: deque[bytes] = deque()  # full blocks, compressed, oldest first
        self._first_block = 0  # the index of _blocks[0] among all blocks ever filled
        self._open = bytearray()  # the records of the block being filled
        self._open_count = 0
        self._next = 0  # index of the next row, counted since the first
        # Changes, oldest first: (index of the first row with it, the change).
        self._changes: deque[tuple[int, _Change]] = deque()

    def __len__(self) -> int:
        return self._next - self._first()

    def changes_kept(self) -> int:
        """How many diagnosis changes the kept rows span: what, besides the blocks,
        the history holds."""
        return len(self._changes)

    def _first(self) -> int:
        return max(0, self._next - self.maxlen)

    def append(self, row: api.HistoryRow) -> None:
        """Keep `row` as the newest, and forget the oldest past `maxlen`."""
        if self.maxlen <= 0:
            return
        t, up, packed, state, reason, series = row
        words, numbers = _wording(reason)
        said = numbers.encode()
        self._open += _HEAD.pack(t, up, len(said))
        self._open += packed
        self._open += said
        change = (state, words, series)
        if not self._changes or self._changes[-1][1] != change:
            self._changes.append((self._next, (state, sys.intern(words), series)))
        self._next += 1
        self._open_count += 1
        if self._open_count == BLOCK_ROWS:
            self._blocks.append(zlib.compress(bytes(self._open)))
            self._open = bytearray()
            self._open_count = 0
        self._forget()

    def _forget(self) -> None:
        """Drop the blocks and changes no kept row needs."""
        first = self._first()
        while self._blocks and (self._first_block + 1) * BLOCK_ROWS <= first:
            self._blocks.popleft()
            self._first_block += 1
        while len(self._changes) > 1 and self._changes[1][0] <= first:
            self._changes.popleft()

    def __iter__(self) -> Iterator[api.HistoryRow]:
        return iter(self.last(len(self)))

    def last(self, n: int) -> list[api.HistoryRow]:
        """The newest `n` rows (all when fewer are kept), oldest first."""
        start = max(self._first(), self._next - max(0, n))
        rows: list[api.HistoryRow] = []
        changes = iter(self._changes)
        upcoming = next(changes, None)
        current: _Change | None = None
        for index, record in self._records(start):
            while upcoming is not None and upcoming[0] <= index:
                current = upcoming[1]
                upcoming = next(changes, None)
            t, up, packed, numbers = record
            state, words, series = current  # type: ignore[misc]  # a change starts at row 0
            rows.append((t, up, packed, state, _reason(words, numbers), series))
        return rows

    def _records(self, start: int) -> Iterator[tuple[int, tuple[float, bool, bytes, str]]]:
        """(index, (t, up, packed numbers, the reason's numbers)) of each row from `start`."""
        first_block = start // BLOCK_ROWS
        for block_index in range(first_block, self._first_block + len(self._blocks) + 1):
            kept = block_index - self._first_block
            data = zlib.decompress(self._blocks[kept]) if kept < len(self._blocks) else self._open
            offset = 0
            index = block_index * BLOCK_ROWS
            while offset < len(data):
                t, up, said = _HEAD.unpack_from(data, offset)
                offset += _HEAD.size
                packed = bytes(data[offset : offset + _PACKED])
                offset += _PACKED
                numbers = bytes(data[offset : offset + said]).decode()
                offset += said
                if index >= start:
                    yield index, (t, up, packed, numbers)
                index += 1


class Histories:
    """Every monitored target's history, fed by `exporter`'s evaluations from now on.

    A history lives as long as its target's state in the exporter: a target it forgets,
    or starts again (its settings changed), takes its history with it.
    """

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self._kept: weakref.WeakKeyDictionary[TargetState, History] = weakref.WeakKeyDictionary()
        exporter.listeners.append(self.record)

    def record(self, state: TargetState, signals: TargetSignals) -> None:
        """Keep one evaluation of a target as its history's newest row."""
        history = self._kept.get(state)
        if history is None:
            history = self._kept[state] = History(self.exporter.settings.history_points)
        history.append(api.history_row(signals))

    def rows(self, name: str) -> list[api.HistoryRow] | None:
        """A target's history rows (`api.history_point` reads each), oldest first; None for
        a name not monitored."""
        return self._last(name, None)

    def page(self, page: int, page_size: int, points: int) -> dict[str, list[api.HistoryRow]]:
        """One page of targets (by name) with the last `points` history rows of each.

        Unpacks at most `points` rows a target (a compressed block per 32): bounded by the
        page, whatever the fleet size.
        """
        names = sorted(self.exporter.states)[page * page_size : (page + 1) * page_size]
        return {name: self._last(name, points) or [] for name in names}

    def _last(self, name: str, points: int | None) -> list[api.HistoryRow] | None:
        state = self.exporter.states.get(name)
        if state is None:
            return None
        history = self._kept.get(state)
        if history is None:
            return []
        return list(history) if points is None else history.last(points)
