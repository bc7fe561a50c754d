"""What a bounded queue raises when it cannot take more: one type for both of the demo
server's queues (the generation scheduler's and the embedding batcher's), which the app
answers with 429 and `Retry-After`."""

from __future__ import annotations


class QueueFull(Exception):
    """The queue holds its `max_queue` entries; retry after `retry_after_seconds` (whole
    seconds, at least 1, as the `Retry-After` header carries them)."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class QueueStopping(QueueFull):
    """The queue is draining or stopped and takes nothing new; like a full queue, retry later."""


class OverBudget(QueueFull):
    """The queue ahead would keep the request past its latency budget: it is refused at
    once rather than served late; like a full queue, retry later."""
