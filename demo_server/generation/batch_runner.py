"""The batch and the forward that runs it: the step that executes a scheduler's plan.

As vLLM's model runner executes the `SchedulerOutput` its scheduler returns, `BatchRunner`
holds the running requests (row i of the batch in KV cache slot i) and runs one step for
them: the prefills the plan gives tokens to, one forward with every row's decode token,
sampling, the simulated device's pace, and each new token handed to its request. Which
requests are in the batch is the scheduler's decision (`plan_step`); the runner keeps the
cache's accounting in step with it.

Each admitted request is prefilled (its KV cache filled with all but its last token) in
the step that gives its prefill its last tokens, its context riding along with every
row's decode token as one flat token batch (chunked-prefill style, as vLLM runs a step).
The decoder has no offset prefill, so a chunked context is computed whole in the step of
its last chunk, which changes no output token. A static group's finished rows stay in the
forward as padding, as a padded batch would compute them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
from batchscope.demo_server.generation.requests import FinishReason, RequestState

log = logging.getLogger(__name__)


def uses_cuda_graphs(device: Device) -> bool:
    """Whether decode runs as a CUDA graph on `device` (padded to the cache's slots)."""
    return device.torch_device.type == "cuda"


@dataclass(slots=True)
class _Prefills:
    """What a step prefills: the contexts computed whole (and their slots), the rows still
    prefilling after it (no token), and the tokens counted."""

    contexts: list[list[int]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    still_prefilling: set[int] = field(default_factory=set)
    # Context tokens computed this step, chunks included.
    tokens: int = 0
    # Every token of the requests whose prefill finished, their last (decode) token too.
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepRun:
    """What one executed step did: tokens produced, context tokens computed, the whole
    prompts of the prefills it finished, the rows the forward computed, the requests that
    finished and why, and when it started and ended (perf_counter seconds)."""

    produced: int
    prefill_tokens: int
    prompt_tokens: int
    forward_rows: int
    finished: list[tuple[RequestState, FinishReason]]
    started: float
    ended: float


class BatchRunner:
    """The batch on `device`: its rows, their KV cache, and the step that runs them."""

    def __init__(self, model: TinyDecoder, device: Device, slots: int, seed: int) -> None:
        self.model = model
        self.device = device
        self.generator = torch.Generator(device=device.torch_device).manual_seed(seed)
        self.cache = KVCache(model.config, slots, device.torch_device)
        self.graph_decode = CudaGraphDecode(model, self.cache) if uses_cuda_graphs(device) else None
        self.rows: list[RequestState] = []  # row i of the batch lives in cache slot i
        self.kv_used = 0

    def ensure_slots(self, slots: int) -> None:
        """Grow the cache to `slots` (a raised batch cap); a CUDA graph is captured anew."""
        if self.cache.ensure_slots(slots) and self.graph_decode:
            self.graph_decode.invalidate()

    def active(self) -> list[RequestState]:
        return [r for r in self.rows if not r.finished]

    def add(self, row: RequestState) -> None:
        self.rows.append(row)

    def remove(self, row: RequestState) -> None:
        """Take `row` out of the batch and free its cache; the last row moves into its slot
        so that rows stay contiguous."""
        index = self.rows.index(row)
        last = self.rows.pop()
        if last is not row:
            self.cache.move(len(self.rows), index, last.kv_tokens)
            self.rows[index] = last
        self.kv_used -= row.kv_tokens
        row.kv_tokens = 0

    def run(self, chunks: Mapping[str, int] | None, cancel: Callable[[str], None]) -> StepRun:
        """One step of every row: `chunks` gives each prefilling row its tokens (a token
        budget's plan; None: every prefill finishes in the step). A request whose token
        callback raises is passed to `cancel`."""
        started = time.perf_counter()
        prefills = self._prefill(chunks)
        new_tokens = self._forward(prefills)
        # A static group's finished rows are computed as padding and cost their share.
        forward_rows = len(self.rows) - len(prefills.still_prefilling)
        self.device.pace_decode(forward_rows, prefills.tokens, started)
        ended = time.perf_counter()
        produced, finished = self._hand_out(new_tokens, prefills.still_prefilling, ended, cancel)
        return StepRun(
            produced,
            prefills.tokens,
            prefills.prompt_tokens,
            forward_rows,
            finished,
            started,
            ended,
        )

    def _prefill(self, chunks: Mapping[str, int] | None) -> _Prefills:
        """Give each prefilling row its tokens: a chunk of its context, or its last tokens,
        when its whole context joins this step's forward and its last token decodes."""
        prefills = _Prefills()
        for slot, row in enumerate(self.rows):
            if not row.needs_prefill:
                continue
            context = (row.prompt + row.output)[:-1]
            if row.kv_tokens == 0 and row.prefilled == 0:
                # The cache the whole context will hold is reserved at its first chunk.
                self.kv_used += len(context)
                row.kv_tokens = len(context)
            needed = row.pending_prefill
            given = needed if chunks is None else chunks.get(row.request_id, 0)
            if given < needed:  # a chunk of its context
                row.prefilled += given
                prefills.tokens += given
                prefills.still_prefilling.add(slot)
                continue
            prefills.tokens += needed - 1
            if context:
                prefills.contexts.append(context)
                prefills.slots.append(slot)
            prefills.prompt_tokens += len(context) + 1
            row.needs_prefill = False
            row.prefilled = 0
        return prefills

    def _forward(self, prefills: _Prefills) -> list[int]:
        """One forward of the prefilled contexts and every row's decode token; the sampled
        next token of each row."""
        torch_device = self.device.torch_device
        prefill = (
            PrefillBatch.of(prefills.contexts, prefills.slots, torch_device)
            if prefills.contexts
            else None
        )
        last_positions = [r.length - 1 for r in self.rows]
        tokens = torch.tensor([r.last_token for r in self.rows], device=torch_device)
        positions = torch.tensor(last_positions, device=torch_device)
        if self.graph_decode is not None:
            # A graph's shapes are fixed: the admitted contexts go in one eager forward first.
            if prefill is not None:
                self.model.prefill_batch(prefill, self.cache)
            logits = self.graph_decode(tokens, positions)
        else:
            span = max(last_positions) + 1
            # A static group's finished row is a padded row: computed over the group's
            # span and discarded, so the group's steps cost what a padded batch's do.
            lengths = torch.tensor(
                [
                    span if r.finished else p + 1
                    for r, p in zip(self.rows, last_positions, strict=True)
                ]
            )
            logits = self.model.decode(
                tokens, positions, span, self.cache, prefill=prefill, lengths=lengths
            )
        return sample(logits, self.generator)

    def _hand_out(
        self,
        new_tokens: list[int],
        still_prefilling: set[int],
        now: float,
        cancel: Callable[[str], None],
    ) -> tuple[int, list[tuple[RequestState, FinishReason]]]:
        """Give each producing row its token; the tokens produced and the requests that
        finished (at EOS unless ignored, or at `max_tokens`), marked finished and their
        cache freed: the scheduler announces them."""
        produced = 0
        finished: list[tuple[RequestState, FinishReason]] = []
        for slot, (row, token) in enumerate(zip(list(self.rows), new_tokens, strict=True)):
            if row.finished or slot in still_prefilling:
                continue  # a static group's finished row, or a prefill chunk: discarded
            row.kv_tokens += 1
            self.kv_used += 1
            row.output.append(token)
            row.token_times.append(now)
            produced += 1
            if row.on_token is not None:
                try:
                    row.on_token(token)
                except Exception:  # its consumer is gone: that request alone ends
                    log.exception("token callback of %s failed; cancelling it", row.request_id)
                    cancel(row.request_id)
            if token == EOS and not row.ignore_eos:
                row.finish_reason = "stop"
            elif len(row.output) >= row.max_tokens:
                row.finish_reason = "length"
            if row.finished:
                # The slot stays taken until the row leaves the batch; the cache is free now.
                self.kv_used -= row.kv_tokens
                row.kv_tokens = 0
                finished.append((row, row.finish_reason))
        return produced, finished
