"""The embedding batcher's settings: one object from the command line to the metrics.

Units. Durations are seconds in the code, as in Prometheus and the exporter
(`max_wait_seconds`, `latency_budget_seconds`). The places a person types a value use
milliseconds, because batching waits are a few milliseconds and `--max-wait-ms 5` reads
better than `--max-wait-seconds 0.005`: the flags `--max-wait-ms` and
`--latency-budget-ms`, the admin API's `max_wait_ms` and `latency_budget_ms` (what
`POST /admin/config` takes and what it, `GET /admin/config` and `/health` show under
`embedding.config`), and `batchscope-loadgen --set max_wait_ms=...`, which drives that
API. They convert here (`BatcherSettings.with_ms`, `BatcherSettings.as_ms`) and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MODES = ("fixed", "adaptive")


@dataclass(frozen=True, slots=True)
class BatcherSettings:
    """How the embedding batcher forms batches. Everything but `mode` can change at run
    time (`Batcher.configure`); a value out of range raises ValueError naming the field.

    - `mode`: `fixed` ("Batching Requests to a Model Server") fires at `max_batch_size`
      items or once the oldest has waited `max_wait_seconds`; `adaptive` (Terrane's
      "Dynamic batching: more throughput without wrecking the tail") fires the smallest
      batch that keeps up with arrivals, within the oldest item's
      `latency_budget_seconds`.
    - `max_batch_size`: the most items one batch holds, in either mode.
    """

    mode: str = "fixed"
    max_batch_size: int = 32
    max_wait_seconds: float = 0.005
    latency_budget_seconds: float = 0.050

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.max_wait_seconds < 0:
            raise ValueError(f"max_wait_seconds must be at least 0, got {self.max_wait_seconds}")
        if self.latency_budget_seconds <= 0:
            raise ValueError(
                f"latency_budget_seconds must be above 0, got {self.latency_budget_seconds}"
            )

    def with_ms(
        self,
        *,
        max_batch_size: int | None = None,
        max_wait_ms: float | None = None,
        latency_budget_ms: float | None = None,
    ) -> BatcherSettings:
        """These settings with the given ones changed, durations in milliseconds as a person
        types them; None keeps a setting as it is."""
        changes: dict[str, float] = {}
        if max_batch_size is not None:
            changes["max_batch_size"] = int(max_batch_size)
        if max_wait_ms is not None:
            changes["max_wait_seconds"] = max_wait_ms / 1000.0
        if latency_budget_ms is not None:
            changes["latency_budget_seconds"] = latency_budget_ms / 1000.0
        return dataclasses.replace(self, **changes)

    def as_ms(self) -> dict[str, float]:
        """The run-time settings as the admin API shows them, durations in milliseconds
        (rounded to the nanosecond, so 63.7 ms set is 63.7 ms shown, not 63.699999...)."""
        return {
            "max_batch_size": self.max_batch_size,
            "max_wait_ms": round(self.max_wait_seconds * 1000.0, 6),
            "latency_budget_ms": round(self.latency_budget_seconds * 1000.0, 6),
        }
