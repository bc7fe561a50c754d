"""One scheduler step's decisions as plain data: which running requests to preempt, which
waiting ones to admit.

As vLLM's `schedule()` returns a `SchedulerOutput` that a model runner executes,
`plan_step` decides and `Scheduler._step` (demo_server.generation.scheduler) carries the
plan out on the batch, the cache and the queue. Pure: no torch, no clock, no lock, so
admission and preemption are tested on their own.

The rules, vLLM's for a paged KV cache without swapping:
- Every running row writes one more KV position this step; an admitted request writes
  its whole sequence (its prefill, and this step's token).
- While the running rows need more than the cache holds and more than one runs, the one
  admitted last is preempted (recompute: its cache is freed, and it goes back to the
  front of the queue to be prefilled again). A lone request always fits (submit checks).
- Then requests are admitted from the front of the queue, in order, while a slot is free
  and the cache holds them; the first that does not fit stops admission (no overtaking).
  A static batch admits a new group only once the previous one has left the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain


@dataclass(frozen=True, slots=True)
class Row:
    """A request in the batch: its latest admission order (the preemption victim is the
    largest), the KV positions it has written, its prompt plus output tokens (what
    re-admitting it writes), and whether it still runs (a finished row keeps its slot
    until the step frees it)."""

    request_id: str
    admission: int
    kv_tokens: int
    length: int
    active: bool = True


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the queue and its prompt plus output tokens."""

    request_id: str
    length: int


@dataclass(frozen=True, slots=True)
class StepLimits:
    max_num_seqs: int
    kv_cache_tokens: int
    static: bool = False


@dataclass(frozen=True, slots=True)
class StepPlan:
    """`preempt`: rows to take out, in that order (each goes to the front of the queue, so
    the last one preempted is first in it). `admit`: how many requests to take from the
    front of the queue after that. `requests_wait`: requests still wait after it."""

    preempt: tuple[str, ...]
    admit: tuple[str, ...]
    requests_wait: bool


def plan_step(rows: Sequence[Row], waiting: Iterable[Waiting], limits: StepLimits) -> StepPlan:
    """The step's preemptions and admissions (the rules in the module docstring).
    `waiting` is read from its front only as far as admission goes."""
    kept = list(rows)
    kv_used = sum(row.kv_tokens for row in kept)
    active = sum(row.active for row in kept)
    preempted: list[Row] = []
    while kv_used + active > limits.kv_cache_tokens and active > 1:
        victim = max((row for row in kept if row.active), key=lambda row: row.admission)
        kept.remove(victim)
        kv_used -= victim.kv_tokens
        active -= 1
        preempted.append(victim)
    queue = chain((Waiting(r.request_id, r.length) for r in reversed(preempted)), waiting)
    room = 0 if limits.static and kept else limits.max_num_seqs - len(kept)
    admitted: list[str] = []
    admitted_tokens = 0
    requests_wait = False
    for candidate in queue:
        fits = kv_used + active + admitted_tokens + candidate.length <= limits.kv_cache_tokens
        if len(admitted) >= room or not fits:
            requests_wait = True
            break
        admitted.append(candidate.request_id)
        admitted_tokens += candidate.length
    return StepPlan(tuple(r.request_id for r in preempted), tuple(admitted), requests_wait)
