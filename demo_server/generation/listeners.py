"""What a generation scheduler tells whoever listens, and two that listen.

After each step a `StepRecord`: what the step carried and produced, and the limit that
kept the batch from growing (the truth `batchscope_demo_*` exposes beside vLLM's
names). When a request ends, its `CompletionResult`. `RequestLog` writes the results
as JSON lines that batchscope-static-util reads; the /metrics listener lives in
`vllm_metrics`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from batchscope.demo_server.generation.requests import CompletionResult


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step as vLLM would count it, and the truth vLLM cannot say.

    `rows`: requests that produced a token (decode rows, and prefills that finished);
    `forward_rows`: rows the forward computed (a static group's finished rows too);
    `prefill_tokens`: context tokens computed (chunks included); `generated`: tokens
    produced; `prompt_tokens_finished`: the whole prompts (context and last token) of the
    requests whose prefill finished in this step, which vLLM's iteration_tokens credits
    to this step; `bound_by`: the limit that kept the batch from growing this step
    (`requests`, `kv_cache`, `token_budget`), or `arrivals` when nothing waited.
    """

    rows: int
    prefill_tokens: int
    generated: int
    prompt_tokens_finished: int
    bound_by: str
    # Rows the forward computed, a static group's finished ones included: the device's cost.
    forward_rows: int = 0

    @property
    def scheduled_tokens(self) -> int:
        """Tokens the step carried: one per producing row, plus the context computed."""
        return self.rows + self.prefill_tokens


class SchedulerListener(Protocol):
    """Observes the scheduler; called on the scheduler thread, so it must be quick."""

    def on_step(self, step: StepRecord) -> None:
        """A step ran (what it scheduled, produced and what bound it: `StepRecord`)."""

    def on_finished(self, result: CompletionResult) -> None:
        """A request finished (any reason)."""


class RequestLog:
    """Appends one JSON line per finished request to `path` (a SchedulerListener)."""

    def __init__(self, path: str | Path) -> None:
        # Kept open for the scheduler's life: close() closes it.
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()

    def on_step(self, step: StepRecord) -> None:
        """Steps are not logged."""

    def on_finished(self, result: CompletionResult) -> None:
        with self._lock:
            self._file.write(json.dumps(result.log_record()) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()
