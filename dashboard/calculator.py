"""The static batching calculator's model: lengths in, utilisation and slot pictures out.

Lengths are read by the same reader as `batchscope-static-util`, chunk by chunk, so a
ten-million-line upload streams through in bounded memory and reports its progress.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from batchscope.exporter.core.static_util import StaticBatchingAccumulator, StaticBatchingResult
from batchscope.exporter.length_log import FileReport, Progress, read_lengths

# The two batches of eight answers in "Continuous Batching: Why Your GPU Waits for the
# Slowest Request" (DEV Community): 67/128 and 32/128 of the slot-steps at B=8.
MIXED_LENGTHS = "mixed lengths, 3 to 16 tokens"
ONE_LONG_ANSWER = "one long answer among short ones"
TOY_EXAMPLES: dict[str, list[int]] = {
    MIXED_LENGTHS: [3, 5, 8, 11, 4, 14, 6, 16],
    ONE_LONG_ANSWER: [1, 1, 2, 2, 3, 3, 4, 16],
}
EXAMPLES_SOURCE = (
    'The two examples are the batches of eight answers in "Continuous Batching: Why Your '
    'GPU Waits for the Slowest Request" (DEV Community).'
)
# The slots-over-steps picture draws at most this many requests (the first ones).
PICTURE_REQUESTS = 64
IDLE = -1


@dataclass
class LengthsSummary:
    """What a stream of lengths gave: per batch size results, a sample and a histogram."""

    report: FileReport
    results: dict[int, StaticBatchingResult] = field(default_factory=dict)
    first: list[int] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def summarize_lengths(
    stream: TextIO,
    name: str,
    batch_sizes: Sequence[int],
    field_name: str | None = None,
    progress: Progress | None = None,
) -> LengthsSummary:
    """Static batching of every length in `stream` at each batch size, streamed.

    `progress(lines_read)` is called after each chunk (by the reader). Raises its InputError
    for a file that cannot hold lengths; `results` stays empty when no length produced
    a token.
    """
    report = FileReport(name)
    accumulators = {b: StaticBatchingAccumulator(b) for b in batch_sizes}
    summary = LengthsSummary(report)
    for chunk in read_lengths(stream, report, field_name, progress):
        for accumulator in accumulators.values():
            accumulator.add_many(chunk)
        summary.counts.update(chunk)
        if len(summary.first) < PICTURE_REQUESTS:
            summary.first.extend(chunk[: PICTURE_REQUESTS - len(summary.first)])
    for size, accumulator in accumulators.items():
        try:
            summary.results[size] = accumulator.result()
        except ValueError:
            return summary
    return summary


@dataclass(frozen=True, slots=True)
class SlotPicture:
    """Which request each slot holds at each step (IDLE: a paid slot doing nothing)."""

    grid: np.ndarray  # shape (slots, steps)
    useful_slot_steps: int

    @property
    def total_slot_steps(self) -> int:
        return int(self.grid.size)

    @property
    def utilization(self) -> float:
        return self.useful_slot_steps / self.total_slot_steps if self.grid.size else 0.0


def static_picture(lengths: Sequence[int], batch_size: int) -> SlotPicture:
    """Static batching: consecutive groups of `batch_size`, each running until its
    longest request ends; a short last group still holds (and pays) every slot."""
    groups = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    steps = sum(max(g) for g in groups)
    grid = np.full((batch_size, steps), IDLE, dtype=np.int64)
    offset = 0
    for g, group in enumerate(groups):
        for slot, length in enumerate(group):
            grid[slot, offset : offset + length] = g * batch_size + slot
        offset += max(group)
    return SlotPicture(grid, int(sum(lengths)))


def continuous_picture(lengths: Sequence[int], batch_size: int, steps: int) -> SlotPicture:
    """Continuous batching over `steps` steps with a queue that never empties: requests of
    these lengths, cycled, and a slot that frees takes the next one on the next step
    (the article's loop). Request numbers keep counting through the cycles."""
    grid = np.full((batch_size, steps), IDLE, dtype=np.int64)
    if steps == 0 or not any(lengths):
        return SlotPicture(grid, 0)
    free_at = [0] * batch_size
    request = 0
    while min(free_at) < steps:
        slot = min(range(batch_size), key=lambda s: (free_at[s], s))
        length = lengths[request % len(lengths)]
        grid[slot, free_at[slot] : free_at[slot] + length] = request
        free_at[slot] += length
        request += 1
    return SlotPicture(grid, int((grid != IDLE).sum()))
