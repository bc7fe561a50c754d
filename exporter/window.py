"""A per-target ring buffer of snapshots covering the last `seconds`."""

from __future__ import annotations

from collections import deque

from exporter.snapshot import Snapshot


class Window:
    """Snapshots of one target, oldest first, none older than `seconds` before the newest."""

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"window must be positive, got {seconds}")
        self.seconds = seconds
        self._snapshots: deque[Snapshot] = deque()

    def add(self, snapshot: Snapshot) -> None:
        """Append a snapshot and drop those that fell out of the window."""
        self._snapshots.append(snapshot)
        horizon = snapshot.t - self.seconds
        while self._snapshots and self._snapshots[0].t < horizon:
            self._snapshots.popleft()

    def snapshots(self) -> list[Snapshot]:
        return list(self._snapshots)

    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None
