"""The generation scheduler: static or continuous batching of requests over `TinyDecoder`.

The model and its forward live in `batchscope.demo_server.generation.decoder`; this module
decides which requests share each forward.

One scheduler *step* gives every running request one new token, in one forward. A
request admitted in a step is prefilled (its KV cache filled with all but its last token)
in that same forward, its context's tokens riding along with every row's decode token as
one flat token batch (chunked-prefill style, as vLLM runs a step), so it produces its
first token in the step it is admitted. That makes the slot accounting exact: a request
of n output tokens occupies its slot for n steps, and a static group of lengths L runs
max(L) steps, as "Continuous Batching: Why Your GPU Waits for the Slowest Request" (DEV
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
The decoder has no offset prefill, so a chunked context is computed whole in the step of
its last chunk, which changes no output token. Each step's `StepRecord` says what it
carried and which limit kept the batch from growing: the truth `batchscope_demo_*` exposes.

The scheduler runs in its own thread, so torch work never blocks an asyncio loop.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import torch

from batchscope.demo_server.devices import Device
from batchscope.demo_server.generation.decoder import (
    EOS,
    CudaGraphDecode,
    KVCache,
    PrefillBatch,
    TinyDecoder,
    sample,
)
from batchscope.demo_server.generation.ragged import RaggedAttention, try_load
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
FinishReason = Literal["stop", "length", "abort"]


class InvalidRequest(ValueError):
    """A request the scheduler can never serve; `param` names the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CompletionResult:
    """A finished request. Times are seconds; `arrival_unix` is wall-clock time.

    `queue_time`: arrival to first admission; `ttft`: arrival to first token; `latency`:
    arrival to finish; `token_gaps`: time between consecutive output tokens.
    """

    request_id: str
    prompt_tokens: int
    output: tuple[int, ...]
    max_tokens: int
    finish_reason: FinishReason
    arrival_unix: float
    queue_time: float
    ttft: float | None
    latency: float
    prefill_time: float | None
    decode_time: float | None
    preemptions: int
    token_gaps: tuple[float, ...]

    @property
    def output_tokens(self) -> int:
        return len(self.output)

    def log_record(self) -> dict[str, object]:
        """The request-log line (JSON-ready); `output_tokens` is what batchscope-static-util
        reads."""
        return {
            "id": self.request_id,
            "arrival": round(self.arrival_unix, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "finish_reason": self.finish_reason,
            "queue_time": round(self.queue_time, 6),
            "ttft": None if self.ttft is None else round(self.ttft, 6),
            "latency": round(self.latency, 6),
            "preemptions": self.preemptions,
        }


TokenCallback = Callable[[int], None]


@dataclass(eq=False)
class _Request:
    """A request's state in the scheduler."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    on_token: TokenCallback | None
    future: Future[CompletionResult]
    arrival: float = field(default_factory=time.perf_counter)
    arrival_unix: float = field(default_factory=time.time)
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    first_admitted: float | None = None
    admission: int = 0  # order of the latest admission: the preemption victim is the largest
    kv_tokens: int = 0  # positions of this request's cache written (or reserved, prefilling)
    needs_prefill: bool = True
    # Context tokens prefilled so far in chunks (a token budget): the context is computed
    # in the step of its last chunk, when the request produces its first token.
    prefilled: int = 0
    preemptions: int = 0
    finish_reason: FinishReason | None = None

    @property
    def length(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt) + len(self.output)

    @property
    def pending_prefill(self) -> int:
        """Tokens it still needs to produce its first token, the rest of its context and
        the token itself (0 once it decodes)."""
        return self.length - self.prefilled if self.needs_prefill else 0

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class _Finished:
    """A finished request's result and the future it resolves, to announce unlocked."""

    future: Future[CompletionResult]
    result: CompletionResult


@dataclass(frozen=True)
class RequestHandle:
    """What `Scheduler.submit` returns: the id (for `cancel`) and the result's future."""

    request_id: str
    future: Future[CompletionResult]


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
        self._generator = torch.Generator(device=device.torch_device).manual_seed(seed)
        self._use_graphs = device.torch_device.type == "cuda"
        self.model.ragged = self._ragged_kernel(config.attention)
        self.attention: Literal["ragged", "padded"] = (
            "ragged" if self.model.ragged is not None else "padded"
        )
        self._cache = KVCache(
            model.config, self._physical_slots(config.max_num_seqs), device.torch_device
        )
        self._graph_decode = CudaGraphDecode(self.model, self._cache) if self._use_graphs else None

        self._lock = threading.Condition()
        self._waiting: collections.deque[_Request] = collections.deque()
        self._cancelled: set[str] = set()
        self._pending_max_num_seqs: int | None = None
        self._accepting = True
        self._stop = False
        self._drain = True
        self._thread: threading.Thread | None = None

        # Scheduler-thread state.
        self._rows: list[_Request] = []  # row i of the batch lives in cache slot i
        self._admissions = 0
        self._kv_used = 0
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
        if not prompt_tokens:
            raise InvalidRequest("prompt", "prompt must hold at least one token")
        if max_tokens < 1:
            raise InvalidRequest("max_tokens", "max_tokens must be at least 1")
        if len(prompt_tokens) >= self.max_model_len:
            raise InvalidRequest(
                "prompt",
                f"prompt is {len(prompt_tokens)} tokens; the model's maximum length is "
                f"{self.max_model_len}, output included",
            )
        total = len(prompt_tokens) + max_tokens
        if total > self.max_model_len:
            raise InvalidRequest(
                "max_tokens",
                f"prompt ({len(prompt_tokens)} tokens) plus max_tokens ({max_tokens}) is "
                f"{total}, more than the model's maximum length {self.max_model_len}",
            )
        if total > self.kv_cache_tokens:
            raise InvalidRequest(
                "max_tokens",
                f"prompt ({len(prompt_tokens)} tokens) plus max_tokens ({max_tokens}) is "
                f"{total}, more than the KV cache holds ({self.kv_cache_tokens} tokens)",
            )
        seq = _Request(
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
        return bool(self._waiting or self._rows or self._cancelled)

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
        self._ensure_cache()
        for row in [r for r in self._rows if r.request_id in cancelled]:
            self._remove_row(row)
            if not row.finished:
                self._finish(row, "abort")
        if self.batching == "continuous" or all(r.finished for r in self._rows):
            # Continuous frees finished slots every step; a static group frees them together.
            for row in [r for r in self._rows if r.finished]:
                self._remove_row(row)
        plan = self._preempt_and_admit()
        if self._rows:
            self._run_batch(plan)
        with self._lock:
            self._stats.running = len(self._active())
            self._stats.kv_tokens_used = self._kv_used

    def _ensure_cache(self) -> None:
        if (
            self._cache.ensure_slots(self._physical_slots(self._max_num_seqs))
            and self._graph_decode
        ):
            self._graph_decode.invalidate()

    def _active(self) -> list[_Request]:
        return [r for r in self._rows if not r.finished]

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
            for r in self._rows
        ]
        with self._lock:
            plan = plan_step(rows, (Waiting(s.request_id, s.length) for s in self._waiting), limits)
        by_id = {row.request_id: row for row in self._rows}
        for request_id in plan.preempt:
            victim = by_id[request_id]
            self._remove_row(victim)
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
            self._rows.append(seq)
        return plan

    def _remove_row(self, row: _Request) -> None:
        """Take `row` out of the batch and free its cache; the last row moves into its slot
        so that rows stay contiguous."""
        index = self._rows.index(row)
        last = self._rows.pop()
        if last is not row:
            self._cache.move(len(self._rows), index, last.kv_tokens)
            self._rows[index] = last
        self._kv_used -= row.kv_tokens
        row.kv_tokens = 0

    def _run_batch(self, plan: StepPlan) -> None:
        started = time.perf_counter()
        prefill_tokens = 0  # context tokens computed this step, chunks included
        prompt_tokens = 0  # every token a request whose prefill finished brings, its last too
        contexts: list[list[int]] = []
        context_slots: list[int] = []
        # With a token budget the plan gives each prefilling row its tokens; without one
        # every prefill finishes in the step it is admitted.
        given = dict(plan.chunks) if self.max_num_batched_tokens is not None else None
        prefilling: set[int] = set()  # rows still prefilling after this step: no token
        for slot, row in enumerate(self._rows):
            if not row.needs_prefill:
                continue
            context = (row.prompt + row.output)[:-1]
            if row.kv_tokens == 0 and row.prefilled == 0:
                # The cache the whole context will hold is reserved at its first chunk.
                self._kv_used += len(context)
                row.kv_tokens = len(context)
            needed = row.pending_prefill
            tokens = needed if given is None else given.get(row.request_id, 0)
            if tokens < needed:  # a chunk of its context
                row.prefilled += tokens
                prefill_tokens += tokens
                prefilling.add(slot)
                continue
            # Its last chunk: the whole context is computed now (the decoder has no offset
            # prefill; which step computes it changes no output token). Its last token is
            # this step's decode token.
            prefill_tokens += needed - 1
            if context:
                contexts.append(context)
                context_slots.append(slot)
            prompt_tokens += len(context) + 1
            row.needs_prefill = False
            row.prefilled = 0
        torch_device = self.device.torch_device
        prefill = PrefillBatch.of(contexts, context_slots, torch_device) if contexts else None
        last_tokens = [r.last_token for r in self._rows]
        last_positions = [r.length - 1 for r in self._rows]
        tokens = torch.tensor(last_tokens, device=torch_device)
        positions = torch.tensor(last_positions, device=torch_device)
        rows = len(self._rows)
        if self._graph_decode is not None:
            # A graph's shapes are fixed: the admitted contexts go in one eager forward first.
            if prefill is not None:
                self.model.prefill_batch(prefill, self._cache)
            logits = self._graph_decode(tokens, positions)
        else:
            # One forward: the admitted contexts and every row's decode token together.
            span = max(last_positions) + 1
            # A static group's finished row is a padded row: computed over the group's
            # span and discarded, so the group's steps cost what a padded batch's do.
            lengths = torch.tensor(
                [
                    span if r.finished else p + 1
                    for r, p in zip(self._rows, last_positions, strict=True)
                ]
            )
            logits = self.model.decode(
                tokens, positions, span, self._cache, prefill=prefill, lengths=lengths
            )
        new_tokens = sample(logits, self._generator)
        # A static group's finished rows are computed as padding and cost their share.
        forward_rows = rows - len(prefilling)
        self.device.pace_decode(forward_rows, prefill_tokens, started)
        now = time.perf_counter()

        produced = 0
        for slot, (row, token) in enumerate(zip(list(self._rows), new_tokens, strict=True)):
            if row.finished or slot in prefilling:
                continue  # a static group's finished row, or a prefill chunk: discarded
            row.kv_tokens += 1
            self._kv_used += 1
            row.output.append(token)
            row.token_times.append(now)
            produced += 1
            if row.on_token is not None:
                try:
                    row.on_token(token)
                except Exception:  # its consumer is gone: that request alone ends
                    log.exception("token callback of %s failed; cancelling it", row.request_id)
                    self.cancel(row.request_id)
            if token == EOS and not row.ignore_eos:
                self._finish(row, "stop")
            elif len(row.output) >= row.max_tokens:
                self._finish(row, "length")
            if row.finished:
                # The slot stays taken until the row leaves the batch; the cache is free now.
                self._kv_used -= row.kv_tokens
                row.kv_tokens = 0
        with self._lock:
            stats = self._stats
            stats.steps += 1
            stats.useful_slot_steps += produced
            stats.slot_steps += self._max_num_seqs
            if plan.requests_wait:
                stats.idle_slot_steps_while_waiting += self._max_num_seqs - produced
            stats.generation_tokens += produced
            stats.prompt_tokens_computed += prompt_tokens
            record = StepRecord(
                produced,
                prefill_tokens,
                produced,
                prompt_tokens,
                self._bound_by(plan),
                forward_rows,
            )
            stats.scheduled_tokens += record.scheduled_tokens
            stats.steps_bound_by[record.bound_by] = stats.steps_bound_by.get(record.bound_by, 0) + 1
            self._mean_step_seconds += SMOOTHING * (now - started - self._mean_step_seconds)
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
        if any(r.needs_prefill for r in self._rows):
            return "token_budget"
        return "requests" if len(self._rows) >= self._max_num_seqs else "arrivals"

    def _finish(self, seq: _Request, reason: FinishReason) -> None:
        """Finish `seq` and tell the listeners and its future (call without the lock)."""
        self._announce([self._close(seq, reason)])

    def _close(self, seq: _Request, reason: FinishReason) -> _Finished:
        """Finish `seq` in the scheduler's state and counters; what to announce once the
        lock is released (`_announce`)."""
        seq.finish_reason = reason
        now = time.perf_counter()
        first_token = seq.token_times[0] if seq.token_times else None
        result = CompletionResult(
            request_id=seq.request_id,
            prompt_tokens=len(seq.prompt),
            output=tuple(seq.output),
            max_tokens=seq.max_tokens,
            finish_reason=reason,
            arrival_unix=seq.arrival_unix,
            queue_time=(seq.first_admitted or now) - seq.arrival,
            ttft=None if first_token is None else first_token - seq.arrival,
            latency=now - seq.arrival,
            prefill_time=None
            if first_token is None or seq.first_admitted is None
            else first_token - seq.first_admitted,
            decode_time=None if first_token is None else now - first_token,
            preemptions=seq.preemptions,
            token_gaps=tuple(b - a for a, b in itertools.pairwise(seq.token_times)),
        )
        with self._lock:
            self._stats.finished += 1
            self._mean_output_tokens += SMOOTHING * (len(seq.output) - self._mean_output_tokens)
        return _Finished(seq.future, result)

    def _announce(self, finished: Sequence[_Finished]) -> None:
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
        for row in list(self._rows):
            self._remove_row(row)
            if not row.finished:
                row.finish_reason = "abort"
                row.future.set_exception(error)

    def _abort_all_locked(self) -> list[_Finished]:
        """Abort every waiting and running request (call with the lock held); returns
        what to `_announce` once it is released."""
        aborted = []
        while self._waiting:
            aborted.append(self._close(self._waiting.popleft(), "abort"))
        for row in list(self._rows):
            self._remove_row(row)
            if not row.finished:
                aborted.append(self._close(row, "abort"))
        return aborted
