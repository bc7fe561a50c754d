"""The generation scheduler: static or continuous batching of requests over `TinyDecoder`.

As vLLM's scheduler does, each step it decides which requests share the next forward
(`step_plan.plan_step`, pure: preemptions and admissions) and hands that plan to the
runner that executes it (`batch_runner.BatchRunner`: the batch, its KV cache, the
forward); this module holds the queue, carries the plan out on it, counts the step and
tells the listeners (`listeners`).

One scheduler *step* gives every running request one new token, in one forward. A
request admitted in a step is prefilled in that same forward, so it produces its first
token in the step it is admitted. That makes the slot accounting exact: a request of n
output tokens occupies its slot for n steps, and a static group of lengths L runs max(L)
steps, as "Continuous Batching: Why Your GPU Waits for the Slowest Request" (DEV
Community) counts them.

- `static`: admit up to `max_num_seqs` waiting requests as one group and step it until
  its longest request finishes. A finished request keeps its row in the batch (computed
  and discarded, as a padded batch would be) and its slot, producing nothing.
- `continuous` (Orca, and that article's loop): every step drops finished requests and
  admits waiting ones into free slots.

The KV cache has a token capacity. When the running requests' next step does not fit,
the most recently admitted request is preempted: its cache is freed and it goes back to
the front of the queue, to be recomputed (prefilled again) when readmitted, as vLLM does.

With a per-step token budget (`max_num_batched_tokens`, vLLM's --max-num-batched-tokens
with chunked prefill, as V1 runs it) a step carries at most that many tokens: each decoding
row one, then each prefill what it needs or what is left (`plan_step`'s rules). A prefill
that gets less is chunked over the next steps: its row is running but produces no token
until its last chunk, and the step's cost on a simulated device counts the chunk's tokens.
Each step's `StepRecord` says what it carried and which limit kept the batch from growing.

The scheduler runs in its own thread, so torch work never blocks an asyncio loop.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

import torch

from batchscope.demo_server.devices import Device
from batchscope.demo_server.generation.batch_runner import BatchRunner, StepRun, uses_cuda_graphs
from batchscope.demo_server.generation.decoder import CudaGraphDecode, TinyDecoder
from batchscope.demo_server.generation.listeners import SchedulerListener, StepRecord
from batchscope.demo_server.generation.ragged import RaggedAttention, try_load
from batchscope.demo_server.generation.requests import (
    CompletionResult,
    Finished,
    FinishReason,
    RequestHandle,
    RequestState,
    TokenCallback,
    check_request,
    completion_result,
)
from batchscope.demo_server.generation.step_plan import (
    Row,
    StepLimits,
    StepPlan,
    Waiting,
    plan_step,
)
from batchscope.demo_server.queueing import QueueFull, QueueStopping

log = logging.getLogger(__name__)

# Weight of a new observation in the running means behind Retry-After.
SMOOTHING = 0.05

BATCHING_MODES = ("static", "continuous")
Batching = Literal["static", "continuous"]
ATTENTION_CHOICES = ("auto", "ragged", "padded")
Attention = Literal["auto", "ragged", "padded"]


class SimulatedClock:
    """A scheduler listener adding up what each step costs on a simulated device: the wall
    time an unloaded machine would show (real compute always below the curve). Drivers
    that step the scheduler themselves stamp time with it."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.seconds = 0.0

    def on_step(self, step: StepRecord) -> None:
        self.seconds += self.device.decode_step_ms(step.forward_rows, step.prefill_tokens) / 1000

    def on_finished(self, result: CompletionResult) -> None:
        """Requests are not timed here."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler settings; `max_num_seqs` can change at run time (`Scheduler.configure`)."""

    batching: Batching = "continuous"
    max_num_seqs: int = 16
    kv_cache_tokens: int = 65536
    max_queue: int = 1024
    # Decode attention: ragged (each row reads its own length, the C kernel, CPU only),
    # padded (to the batch's longest row), or auto (ragged where it builds, else padded).
    attention: Attention = "auto"
    # Tokens one step may carry, chunking prefills (vLLM's --max-num-batched-tokens with
    # chunked prefill); None: a whole prompt prefills in the step it is admitted.
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}"
            )
        for name in ("max_num_seqs", "kv_cache_tokens", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        budget = self.max_num_batched_tokens
        if budget is not None and budget < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): every running request decodes one token a step"
            )


@dataclass
class SchedulerStats:
    """Counters and state of the scheduler.

    The scheduler keeps one instance and updates it under its lock; `Scheduler.stats`
    hands out a copy, so a reader sees one moment.

    Slot utilisation counts busy steps only (steps with at least one request in the
    batch): useful slot-steps (a request produced a token) over `max_num_seqs` slots per
    step. `idle_slot_steps_while_waiting` counts free or finished-but-held slots in steps
    that ran while requests waited: 0 for continuous batching unless the KV cache limits it.
    """

    batching: Batching
    max_num_seqs: int
    kv_cache_tokens: int
    max_queue: int
    running: int = 0
    waiting: int = 0
    kv_tokens_used: int = 0
    steps: int = 0
    useful_slot_steps: int = 0
    slot_steps: int = 0
    idle_slot_steps_while_waiting: int = 0
    generation_tokens: int = 0
    prompt_tokens_computed: int = 0
    preemptions: int = 0
    finished: int = 0
    max_waiting_seen: int = 0
    max_num_batched_tokens: int | None = None
    # Tokens steps carried, and steps by the limit that bound them (StepRecord.bound_by).
    scheduled_tokens: int = 0
    steps_bound_by: dict[str, int] = field(default_factory=dict)

    @property
    def slot_utilization(self) -> float | None:
        """useful / total slot-steps over busy steps; None before the first step."""
        return self.useful_slot_steps / self.slot_steps if self.slot_steps else None

    @property
    def kv_cache_usage(self) -> float:
        """Share of the KV cache's token capacity in use, 0..1."""
        return self.kv_tokens_used / self.kv_cache_tokens


class Scheduler:
    """Schedules generation requests over `model` on `device`; see the module docstring.

    `submit` and `cancel` are thread-safe; the loop runs on its own thread after `start`.
    """

    def __init__(
        self,
        model: TinyDecoder,
        device: Device,
        config: SchedulerConfig,
        *,
        seed: int = 0,
        listeners: Sequence[SchedulerListener] = (),
    ) -> None:
        self.model = model.to(device.torch_device).eval()
        self.device = device
        self.batching: Batching = config.batching
        self.kv_cache_tokens = config.kv_cache_tokens
        self.max_queue = config.max_queue
        self.max_model_len = model.config.max_model_len
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self._max_num_seqs = config.max_num_seqs
        self._listeners = list(listeners)
        self._use_graphs = uses_cuda_graphs(device)
        self.model.ragged = self._ragged_kernel(config.attention)
        self.attention: Literal["ragged", "padded"] = (
            "ragged" if self.model.ragged is not None else "padded"
        )
        # The batch, its cache and its forward; the scheduler thread's alone.
        self._runner = BatchRunner(
            self.model, device, self._physical_slots(config.max_num_seqs), seed
        )

        self._lock = threading.Condition()
        self._waiting: collections.deque[RequestState] = collections.deque()
        self._cancelled: set[str] = set()
        self._pending_max_num_seqs: int | None = None
        self._accepting = True
        self._stop = False
        self._drain = True
        self._thread: threading.Thread | None = None

        # Scheduler-thread state: the order of the latest admission.
        self._admissions = 0
        # Updated under the lock: `running` and `kv_tokens_used` at the end of each step,
        # `waiting` only in the copies `stats` hands out (the queue is its truth).
        self._stats = SchedulerStats(
            batching=config.batching,
            max_num_seqs=config.max_num_seqs,
            kv_cache_tokens=config.kv_cache_tokens,
            max_queue=config.max_queue,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        # Running means (exponential, weight SMOOTHING) for Retry-After.
        self._mean_step_seconds = 0.0
        self._mean_output_tokens = 0.0

    # --- public API -------------------------------------------------------------------

    def submit(
        self,
        prompt_tokens: list[int],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        on_token: TokenCallback | None = None,
    ) -> RequestHandle:
        """Queue a request; its future resolves with a CompletionResult when it finishes.

        `on_token(token)` is called on the scheduler thread for each new token. Raises
        InvalidRequest when the request can never fit (model length, KV capacity), QueueFull
        when `max_queue` requests already wait, QueueStopping when draining.
        """
        check_request(len(prompt_tokens), max_tokens, self.max_model_len, self.kv_cache_tokens)
        seq = RequestState(
            request_id=f"cmpl-{uuid.uuid4().hex}",
            prompt=list(prompt_tokens),
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            on_token=on_token,
            future=Future(),
        )
        with self._lock:
            if not self._accepting:
                raise QueueStopping("the server is shutting down", retry_after_seconds=5)
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"{len(self._waiting)} requests are waiting (--max-queue {self.max_queue})",
                    retry_after_seconds=self._retry_after_seconds(),
                )
            self._waiting.append(seq)
            self._stats.max_waiting_seen = max(self._stats.max_waiting_seen, len(self._waiting))
            self._lock.notify()
        return RequestHandle(seq.request_id, seq.future)

    def cancel(self, request_id: str) -> None:
        """Abort a request (a client that went away): at the next step it leaves the queue or
        its slot, and its future resolves with finish_reason `abort`."""
        with self._lock:
            self._cancelled.add(request_id)
            self._lock.notify()

    def configure(self, *, max_num_seqs: int | None = None) -> None:
        """Change the batch cap from the next step on (never past the token budget: every
        running request decodes one token a step)."""
        if max_num_seqs is not None:
            if max_num_seqs < 1:
                raise ValueError("max_num_seqs must be at least 1")
            budget = self.max_num_batched_tokens
            if budget is not None and max_num_seqs > budget:
                raise ValueError(
                    f"max_num_seqs ({max_num_seqs}) must be at most max_num_batched_tokens "
                    f"({budget})"
                )
            with self._lock:
                self._pending_max_num_seqs = max_num_seqs
                self._lock.notify()

    @property
    def max_num_seqs(self) -> int:
        with self._lock:
            return self._pending_max_num_seqs or self._max_num_seqs

    def start(self) -> None:
        """Start the scheduler thread."""
        self._thread = threading.Thread(target=self._run, name="generation-scheduler", daemon=True)
        self._thread.start()

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Admit nothing new; with `drain` finish every queued and running request, else
        abort them; then end the thread (waiting up to `timeout` seconds)."""
        with self._lock:
            self._accepting = False
            self._stop = True
            self._drain = drain
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> SchedulerStats:
        """A consistent snapshot of the counters and state."""
        with self._lock:
            return dataclasses.replace(
                self._stats,
                waiting=len(self._waiting),
                steps_bound_by=dict(self._stats.steps_bound_by),
            )

    def step_here(self) -> bool:
        """Run one scheduler step on the calling thread, if there is work; True when a step
        ran. For drivers that interleave schedulers step by step (the batching benchmark
        times two modes side by side this way); never while the scheduler thread runs."""
        if self._thread is not None:
            raise RuntimeError("step_here: the scheduler thread is running")
        with self._lock:
            if not self._has_work_locked():
                return False
        with torch.inference_mode():
            self._step()
        return True

    # --- the loop ---------------------------------------------------------------------

    def _retry_after_seconds(self) -> int:
        """Whole seconds until the queue is expected to have run, from recent step times and
        output lengths; at least 1."""
        steps = len(self._waiting) * self._mean_output_tokens / self._max_num_seqs
        return max(1, math.ceil(steps * self._mean_step_seconds))

    def _ragged_kernel(self, attention: Attention) -> RaggedAttention | None:
        """The kernel for `attention`, or None for padded attention. Raises ValueError when
        ragged is asked for and cannot run (on CUDA, or the kernel did not build)."""
        if attention == "padded":
            return None
        if self._use_graphs:  # a CUDA graph's decode is padded to the whole cache
            if attention == "ragged":
                raise ValueError("--attention ragged runs on the CPU only (CUDA uses graphs)")
            return None
        kernel, why = try_load()
        if kernel is None:
            if attention == "ragged":
                raise ValueError(f"--attention ragged: {why}")
            log.warning("ragged attention unavailable, decode attention is padded: %s", why)
        return kernel

    def _physical_slots(self, max_num_seqs: int) -> int:
        # CUDA graphs pad the batch, and padding rows need slots of their own.
        return CudaGraphDecode.padded(max_num_seqs) if self._use_graphs else max_num_seqs

    def _run(self) -> None:
        with torch.inference_mode():
            while self._wait_for_work():
                try:
                    self._step()
                except Exception as error:  # a bug in a step must not hang every client
                    log.exception("generation step failed; failing the running requests")
                    self._fail_rows(error)

    def _has_work_locked(self) -> bool:
        """Requests wait, run or are to be cancelled (call with the lock held)."""
        return bool(self._waiting or self._runner.rows or self._cancelled)

    def _wait_for_work(self) -> bool:
        """Block until there is something to do; False when the loop should end."""
        with self._lock:
            while True:
                if self._stop and not self._drain:
                    aborted = self._abort_all_locked()
                    break
                if self._has_work_locked():
                    return True
                if self._stop:
                    return False
                self._lock.wait()
        self._announce(aborted)
        return False

    def _step(self) -> None:
        """One step: take the cancellations and a new batch cap, free the slots the
        batching mode frees, carry out the step's plan, run the batch."""
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            if self._pending_max_num_seqs is not None:
                self._max_num_seqs, self._pending_max_num_seqs = self._pending_max_num_seqs, None
                self._stats.max_num_seqs = self._max_num_seqs
            aborted = []
            for seq in [s for s in self._waiting if s.request_id in cancelled]:
                self._waiting.remove(seq)
                aborted.append(self._close(seq, "abort"))
        self._announce(aborted)
        runner = self._runner
        runner.ensure_slots(self._physical_slots(self._max_num_seqs))
        for row in [r for r in runner.rows if r.request_id in cancelled]:
            runner.remove(row)
            if not row.finished:
                self._finish(row, "abort")
        if self.batching == "continuous" or all(r.finished for r in runner.rows):
            # Continuous frees finished slots every step; a static group frees them together.
            for row in [r for r in runner.rows if r.finished]:
                runner.remove(row)
        plan = self._preempt_and_admit()
        if runner.rows:
            chunks = dict(plan.chunks) if self.max_num_batched_tokens is not None else None
            step = runner.run(chunks, self.cancel)
            for row, reason in step.finished:
                self._finish(row, reason)
            self._count_step(plan, step)
        with self._lock:
            self._stats.running = len(runner.active())
            self._stats.kv_tokens_used = runner.kv_used

    def _preempt_and_admit(self) -> StepPlan:
        """Carry out this step's `plan_step`: preempt, then admit; returns the plan."""
        limits = StepLimits(
            self._max_num_seqs,
            self.kv_cache_tokens,
            self.batching == "static",
            self.max_num_batched_tokens,
        )
        rows = [
            Row(
                r.request_id,
                r.admission,
                r.kv_tokens,
                r.length,
                not r.finished,
                r.pending_prefill,
            )
            for r in self._runner.rows
        ]
        with self._lock:
            plan = plan_step(rows, (Waiting(s.request_id, s.length) for s in self._waiting), limits)
        by_id = {row.request_id: row for row in self._runner.rows}
        for request_id in plan.preempt:
            victim = by_id[request_id]
            self._runner.remove(victim)
            victim.needs_prefill = True
            victim.prefilled = 0
            victim.preemptions += 1
            with self._lock:
                self._stats.preemptions += 1
                self._waiting.appendleft(victim)
        with self._lock:
            admitted = [self._waiting.popleft() for _ in plan.admit]
        now = time.perf_counter()
        for seq in admitted:
            self._admissions += 1
            seq.admission = self._admissions
            if seq.first_admitted is None:
                seq.first_admitted = now
            self._runner.add(seq)
        return plan

    def _count_step(self, plan: StepPlan, step: StepRun) -> None:
        """Add the step to the counters and tell the listeners what it did."""
        with self._lock:
            stats = self._stats
            stats.steps += 1
            stats.useful_slot_steps += step.produced
            stats.slot_steps += self._max_num_seqs
            if plan.requests_wait:
                stats.idle_slot_steps_while_waiting += self._max_num_seqs - step.produced
            stats.generation_tokens += step.produced
            stats.prompt_tokens_computed += step.prompt_tokens
            record = StepRecord(
                step.produced,
                step.prefill_tokens,
                step.produced,
                step.prompt_tokens,
                self._bound_by(plan),
                step.forward_rows,
            )
            stats.scheduled_tokens += record.scheduled_tokens
            stats.steps_bound_by[record.bound_by] = stats.steps_bound_by.get(record.bound_by, 0) + 1
            seconds = step.ended - step.started
            self._mean_step_seconds += SMOOTHING * (seconds - self._mean_step_seconds)
        self._tell(lambda listener: listener.on_step(record))

    def _bound_by(self, plan: StepPlan) -> str:
        """The truth for one step: what kept the batch from growing. A preemption: the KV
        cache; requests that still wait: what stopped their admission; a prefill chunked
        with nothing waiting: the token budget; else the cap when every slot is taken, or
        the arrivals."""
        if plan.preempt:
            return "kv_cache"
        if plan.stopped_by is not None:
            return plan.stopped_by
        if any(r.needs_prefill for r in self._runner.rows):
            return "token_budget"
        return "requests" if len(self._runner.rows) >= self._max_num_seqs else "arrivals"

    def _finish(self, seq: RequestState, reason: FinishReason) -> None:
        """Finish `seq` and tell the listeners and its future (call without the lock)."""
        self._announce([self._close(seq, reason)])

    def _close(self, seq: RequestState, reason: FinishReason) -> Finished:
        """Finish `seq` in the scheduler's state and counters; what to announce once the
        lock is released (`_announce`)."""
        seq.finish_reason = reason
        result = completion_result(seq, reason, time.perf_counter())
        with self._lock:
            self._stats.finished += 1
            self._mean_output_tokens += SMOOTHING * (len(seq.output) - self._mean_output_tokens)
        return Finished(seq.future, result)

    def _announce(self, finished: Sequence[Finished]) -> None:
        """Tell the listeners, then resolve the futures (whose callbacks run here): never
        with the lock held, so neither can stall the scheduler or deadlock on it."""
        for done in finished:
            self._tell(lambda listener, result=done.result: listener.on_finished(result))
            done.future.set_result(done.result)

    def _tell(self, call: Callable[[SchedulerListener], None]) -> None:
        """`call` every listener; one that raises is logged and skipped, so it costs
        neither the other listeners their call nor a request its result."""
        for listener in self._listeners:
            try:
                call(listener)
            except Exception:
                log.exception("scheduler listener %s failed", type(listener).__name__)

    def _fail_rows(self, error: Exception) -> None:
        for row in list(self._runner.rows):
            self._runner.remove(row)
            if not row.finished:
                row.finish_reason = "abort"
                row.future.set_exception(error)

    def _abort_all_locked(self) -> list[Finished]:
        """Abort every waiting and running request (call with the lock held); returns
        what to `_announce` once it is released."""
        aborted = []
        while self._waiting:
            aborted.append(self._close(self._waiting.popleft(), "abort"))
        for row in list(self._runner.rows):
            self._runner.remove(row)
            if not row.finished:
                aborted.append(self._close(row, "abort"))
        return aborted
