"""One scheduler step's decisions as plain data: which running requests to preempt, which
waiting ones to admit.

As vLLM's `schedule()` returns a `SchedulerOutput` that a model runner executes,
`plan_step` decides and `Scheduler._step` (batchscope.demo_server.generation.scheduler) carries the
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
- With a per-step token budget (vLLM's --max-num-batched-tokens, chunked prefill as V1
  runs it): every decoding row takes one token of it, then each row still prefilling
  takes what it needs to produce its first token (`pending_prefill`), or what is left,
  oldest admission first; then requests are admitted while a token of the budget is
  left, each taking what it needs or what is left. A prefill that gets less than it
  needs is a chunk: the row runs its prefill over the next steps and produces no token
  until its last chunk. A static group is admitted whole on slots and cache alone, and
  its prefills are chunked over the steps that follow.
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
    # Tokens it still needs to produce its first token (0 for a decoding row): the rest of
    # its context and the token itself.
    pending_prefill: int = 0


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
    # Tokens one step may carry (None: no budget, a whole prompt prefills in one step).
    token_budget: int | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """`preempt`: rows to take out, in that order (each goes to the front of the queue, so
    the last one preempted is first in it). `admit`: how many requests to take from the
    front of the queue after that. `requests_wait`: requests still wait after it."""

    preempt: tuple[str, ...]
    admit: tuple[str, ...]
    requests_wait: bool
    # What stopped admission while requests wait: "requests" (no free slot), "kv_cache"
    # (the next does not fit), "token_budget" (no token of the budget left); None when the
    # queue emptied.
    stopped_by: str | None = None
    # With a token budget: each prefilling row's (kept or admitted) tokens this step, in
    # the order they were given; a row that gets less than it needs is a chunk.
    chunks: tuple[tuple[str, int], ...] = ()


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
    left = limits.token_budget
    chunks: list[tuple[str, int]] = []
    if left is not None:
        left -= sum(1 for row in kept if row.active and row.pending_prefill == 0)
        for row in sorted((r for r in kept if r.active and r.pending_prefill), key=_admitted):
            take = max(0, min(row.pending_prefill, left))
            chunks.append((row.request_id, take))
            left -= take
    admitted: list[str] = []
    admitted_tokens = 0
    stopped_by = None
    for candidate in queue:
        fits = kv_used + active + admitted_tokens + candidate.length <= limits.kv_cache_tokens
        out_of_budget = left is not None and left <= 0 and not limits.static
        if len(admitted) >= room or not fits or out_of_budget:
            stopped_by = (
                "requests" if len(admitted) >= room else "kv_cache" if not fits else "token_budget"
            )
            break
        admitted.append(candidate.request_id)
        admitted_tokens += candidate.length
        if left is not None:
            take = max(0, min(candidate.length, left))  # its context and its first token
            chunks.append((candidate.request_id, take))
            left -= take
    return StepPlan(
        tuple(r.request_id for r in preempted),
        tuple(admitted),
        stopped_by is not None,
        stopped_by,
        tuple(chunks),
    )


def _admitted(row: Row) -> int:
    return row.admission
