"""Text generation: a tiny seeded decoder with a KV cache, and a static or continuous scheduler.

The model is a byte-level decoder-only transformer with random weights (seeded, nothing
downloaded). Its outputs are noise; what matters is that it runs real forwards whose cost
depends on the batch, so the scheduler's batching behaviour is the real thing.

One scheduler *step* gives every running request one new token, in one forward. A
request admitted in a step is prefilled (its KV cache filled with all but its last token)
in that same forward, its context's tokens riding along with every row's decode token as
one flat token batch (chunked-prefill style, as vLLM runs a step), so it produces its
first token in the step it is admitted. That
makes the slot accounting exact: a request of n output tokens occupies its slot for n
steps, and a static group of lengths L runs max(L) steps, as in seed 003.

- `static`: admit up to `max_num_seqs` waiting requests as one group and step it until
  its longest request finishes. A finished request keeps its row in the batch (computed
  and discarded, as a padded batch would be) and its slot, producing nothing.
- `continuous` (Orca, seed 003's loop): every step drops finished requests and admits
  waiting ones into free slots.

The KV cache has a token capacity. When the running requests' next step does not fit,
the most recently admitted request is preempted: its cache is freed and it goes back to
the front of the queue, to be recomputed (prefilled again) when readmitted, as vLLM does.

The scheduler runs in its own thread, so torch work never blocks an asyncio loop.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from demo_server.devices import Device
from demo_server.ragged import RaggedAttention, try_load

log = logging.getLogger(__name__)

# Weight of a new observation in the running means behind Retry-After.
SMOOTHING = 0.05

BATCHING_MODES = ("static", "continuous")
Batching = Literal["static", "continuous"]
ATTENTION_CHOICES = ("auto", "ragged", "padded")
Attention = Literal["auto", "ragged", "padded"]
FinishReason = Literal["stop", "length", "abort"]

# Byte-level vocabulary: 256 byte values, then BOS and EOS.
BOS = 256
EOS = 257
VOCAB_SIZE = 258


def encode_prompt(text: str) -> list[int]:
    """BOS followed by the UTF-8 bytes of `text`."""
    return [BOS, *text.encode("utf-8")]


def token_bytes(tokens: Iterable[int]) -> bytes:
    """The bytes that `tokens` spell; BOS and EOS spell nothing."""
    return bytes(t for t in tokens if t < 256)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny decoder."""

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    max_model_len: int = 1024

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class KVCache:
    """Keys and values by slot: per layer a [slots, heads, max_model_len, head_dim] tensor.

    Slot i holds the cache of the batch's row i; rows are kept contiguous (see
    `Scheduler._remove_row`), so a step reads a view of the first rows, never a gather.
    """

    def __init__(self, config: ModelConfig, slots: int, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.slots = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.ensure_slots(slots)

    def ensure_slots(self, slots: int) -> bool:
        """Grow to at least `slots` slots, keeping contents; True when it reallocated."""
        if slots <= self.slots:
            return False
        c = self.config
        shape = (slots, c.n_heads, c.max_model_len, c.head_dim)

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = torch.zeros(shape, device=self.device)
            if old is not None:
                new[: self.slots] = old
            return new

        old_keys = self.keys or [None] * c.n_layers
        old_values = self.values or [None] * c.n_layers
        self.keys = [grown(k) for k in old_keys]
        self.values = [grown(v) for v in old_values]
        self.slots = slots
        return True

    def move(self, source: int, target: int, length: int) -> None:
        """Copy the first `length` positions of slot `source` into slot `target`."""
        for layer in (*self.keys, *self.values):
            layer[target, :, :length] = layer[source, :, :length]


class _Block(nn.Module):
    """One pre-norm transformer block. Its forward pieces call torch.nn.functional directly:
    at this size a step is bound by per-op overhead, and Module.__call__ adds to it."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.shape = (d,)
        self.heads = (config.n_heads, config.head_dim)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        # The parameters themselves (moving the module swaps their data, not the objects):
        # Module.__getattr__ on every use would cost a few percent of a step.
        self.params = tuple(
            p
            for layer in (self.ln1, self.qkv, self.proj, self.ln2, self.up, self.down)
            for p in (layer.weight, layer.bias)
        )

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v as [rows, heads, head_dim] from x [rows, d]."""
        ln1_w, ln1_b, qkv_w, qkv_b = self.params[:4]
        h = F.layer_norm(x, self.shape, ln1_w, ln1_b)
        return F.linear(h, qkv_w, qkv_b).view(-1, 3, *self.heads).unbind(1)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention output `attended` [rows, d] and the MLP."""
        proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b = self.params[4:]
        x = x + F.linear(attended, proj_w, proj_b)
        h = F.layer_norm(x, self.shape, ln2_w, ln2_b)
        return x + F.linear(F.gelu(F.linear(h, up_w, up_b)), down_w, down_b)


class TinyDecoder(nn.Module):
    """A byte-level decoder-only transformer with seeded random weights."""

    def __init__(self, config: ModelConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        self.config = config = config or ModelConfig()
        d = config.d_model
        self.tok = nn.Embedding(VOCAB_SIZE, d)
        self.pos = nn.Embedding(config.max_model_len, d)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB_SIZE)
        # Own generator: the weights depend on `seed` only, not on global RNG state.
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif ".ln" in name or name.startswith("ln_"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, 0.02, generator=generator)

    # The ragged decode attention kernel (`demo_server.ragged`); None: padded attention.
    ragged: RaggedAttention | None = None

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.tok.weight) + F.embedding(positions, self.pos.weight)

    def prefill(self, tokens: torch.Tensor, slot: int, cache: KVCache) -> None:
        """Write the keys and values of `tokens` (positions 0..T-1) into `slot`."""
        self.prefill_batch(PrefillBatch.of([tokens.tolist()], [slot], tokens.device), cache)

    def prefill_batch(self, batch: PrefillBatch, cache: KVCache) -> None:
        """Prefill every context of `batch` in one forward (no decode rows)."""
        x = self._embed(batch.tokens.reshape(-1), batch.positions.reshape(-1))
        for index, block in enumerate(self.blocks):
            q, k, v = block.qkv_heads(x)
            x = block.finish(x, self._prefill_attention(index, q, k, v, batch, cache))

    def _prefill_attention(
        self,
        index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: PrefillBatch,
        cache: KVCache,
    ) -> torch.Tensor:
        """Layer `index`'s causal attention over `batch`'s padded contexts (q, k, v as
        [contexts * T, heads, head_dim]); writes their keys and values into the cache.
        Padding sits after each context's tokens, so causal masking keeps it out of every
        real token's attention; its keys land beyond the context, where the row's decode
        overwrites or masks them."""
        contexts, length = batch.tokens.shape
        q, k, v = (t.view(contexts, length, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        cache.keys[index][batch.slots, :, :length] = k
        cache.values[index][batch.slots, :, :length] = v
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attended.transpose(1, 2).reshape(contexts * length, -1)

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        span: int,
        cache: KVCache,
        prefill: PrefillBatch | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decode step for rows 0..B-1 (row i in slot i): feed `tokens[i]` at
        `positions[i]`, write its key and value, and attend over the row's first
        `lengths[i]` cache positions (default `positions + 1`; none beyond `span`). Returns
        logits [B, vocab].

        With `self.ragged` (the C kernel, on the CPU) each row reads its own length only, as
        a paged attention kernel does; otherwise attention is padded to `span` and masked.

        With `prefill`, the same forward first prefills those contexts (chunked-prefill
        style: one flat token batch of decode rows and prefill tokens, as vLLM runs a step),
        so a request admitted this step is prefilled and decoded in one forward.

        Padded and without `prefill`, shapes depend on B and `span` only, so a fixed
        (B, span) can be captured as a CUDA graph."""
        if lengths is None:
            lengths = positions + 1
        if self.ragged is not None and tokens.device.type == "cpu":
            return self._decode_ragged(tokens, positions, lengths, cache, prefill)
        rows = tokens.shape[0]
        row_index = torch.arange(rows, device=tokens.device)
        if prefill is None:
            x = self._embed(tokens, positions)
        else:
            x = self._embed(
                torch.cat((tokens, prefill.tokens.reshape(-1))),
                torch.cat((positions, prefill.positions.reshape(-1))),
            )
        visible = torch.arange(span, device=tokens.device)[None, :] < lengths[:, None]
        mask = visible[:, None, None, :]
        for index, block in enumerate(self.blocks):
            q, k, v = block.qkv_heads(x)
            attended_prefill = None
            if prefill is not None:
                attended_prefill = self._prefill_attention(
                    index, q[rows:], k[rows:], v[rows:], prefill, cache
                )
                q, k, v = q[:rows], k[:rows], v[:rows]
            keys, values = cache.keys[index], cache.values[index]
            keys[row_index, :, positions] = k
            values[row_index, :, positions] = v
            attended = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys[:rows, :, :span], values[:rows, :, :span], attn_mask=mask
            ).reshape(rows, -1)
            if attended_prefill is not None:
                attended = torch.cat((attended, attended_prefill))
            x = block.finish(x, attended)
        return self._logits(x[:rows])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] from the residual stream of the decode rows."""
        x = F.layer_norm(x, (self.config.d_model,), self.ln_f.weight, self.ln_f.bias)
        return F.linear(x, self.head.weight, self.head.bias)

    def _decode_ragged(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        lengths: torch.Tensor,
        cache: KVCache,
        prefill: PrefillBatch | None,
    ) -> torch.Tensor:
        """`decode` as a paged-attention server runs a step: one flat batch of tokens (each
        row's decode token, then every prefill token), each with its cache slot and
        position; every layer writes all their keys and values, then each token attends
        over its own slot up to itself. No padding anywhere."""
        rows = tokens.shape[0]
        slots = torch.arange(rows)
        if prefill is not None:
            tokens = torch.cat((tokens, prefill.flat_tokens))
            positions = torch.cat((positions, prefill.flat_positions))
            slots = torch.cat((slots, prefill.flat_slots))
            lengths = torch.cat((lengths, prefill.flat_positions + 1))
        x = self._embed(tokens, positions)
        for index, block in enumerate(self.blocks):
            q, k, v = block.qkv_heads(x)
            keys, values = cache.keys[index], cache.values[index]
            keys[slots, :, positions] = k
            values[slots, :, positions] = v
            x = block.finish(x, self.ragged(q, keys, values, slots, lengths))
        return self._logits(x[:rows])


@dataclass(frozen=True)
class PrefillBatch:
    """Contexts to prefill in one forward: context i fills positions 0..len-1 of cache slot
    `context_slots[i]`. Each attention builds the layout it reads, once, on first use:
    `tokens`, `positions` and `slots` ([contexts, T], padded to the longest context;
    padding repeats the last position, so it stays inside the model's length) for padded
    attention, the `flat_` tensors (the real tokens only, one entry per token) for ragged
    attention."""

    contexts: tuple[tuple[int, ...], ...]
    context_slots: tuple[int, ...]
    device: torch.device

    @classmethod
    def of(
        cls, contexts: Sequence[Sequence[int]], slots: Sequence[int], device: torch.device
    ) -> PrefillBatch:
        return cls(tuple(tuple(c) for c in contexts), tuple(slots), device)

    @property
    def token_count(self) -> int:
        """Real tokens, padding excluded."""
        return sum(len(c) for c in self.contexts)

    @functools.cached_property
    def tokens(self) -> torch.Tensor:
        length = max(len(c) for c in self.contexts)
        return torch.tensor(
            [[*c, *[0] * (length - len(c))] for c in self.contexts], device=self.device
        )

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        length = max(len(c) for c in self.contexts)
        return torch.tensor(
            [[min(p, len(c) - 1) for p in range(length)] for c in self.contexts],
            device=self.device,
        )

    @functools.cached_property
    def slots(self) -> torch.Tensor:
        return torch.tensor(self.context_slots, device=self.device)

    @functools.cached_property
    def flat_tokens(self) -> torch.Tensor:
        return torch.tensor([t for c in self.contexts for t in c], device=self.device)

    @functools.cached_property
    def flat_positions(self) -> torch.Tensor:
        return torch.tensor([p for c in self.contexts for p in range(len(c))], device=self.device)

    @functools.cached_property
    def flat_slots(self) -> torch.Tensor:
        pairs = zip(self.contexts, self.context_slots, strict=True)
        return torch.tensor([slot for c, slot in pairs for _ in c], device=self.device)


def sample(logits: torch.Tensor, generator: torch.Generator) -> list[int]:
    """One token per row, drawn from softmax(logits) (temperature 1).

    Inverse transform: one uniform draw per row, located in the row's cumulative
    distribution. It needs a random number per row, not per vocabulary entry as the
    exponential race or torch.multinomial do (those cost a tenth of a decode step here).
    """
    cumulative = logits.float().softmax(-1).cumsum(-1)
    draws = (
        torch.rand((logits.shape[0], 1), generator=generator, device=logits.device)
        * cumulative[:, -1:]
    )
    picked = torch.searchsorted(cumulative, draws, right=True)
    return picked.clamp_(max=logits.shape[-1] - 1).squeeze(1).tolist()


class CudaGraphDecode:
    """The decode step replayed as CUDA graphs, one per padded batch size.

    Eager decode of a small model is launch-bound on a GPU (an H200 runs a ~1B decoder's
    step in 3.5 ms eager, 0.94 ms as a graph). A graph fixes shapes, so rows are padded to
    the next size in SIZES and attention spans the whole cache (masked). Padding rows, and
    the runs that warm up and capture a graph (which may happen mid-serving, over live
    slots), feed the cache's last position: no live request ever writes or reads it, since
    a request's last fed token sits at most at max_model_len - 2. The cache has a slot for
    every padding row (`Scheduler._physical_slots`). Untested in CI (no GPU there).
    """

    SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(self, model: TinyDecoder, cache: KVCache) -> None:
        self.model = model
        self.cache = cache
        self.scratch_position = model.config.max_model_len - 1
        self._graphs: dict[
            int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]
        ] = {}

    @classmethod
    def padded(cls, rows: int) -> int:
        """The captured batch size that holds `rows` rows."""
        return next((s for s in cls.SIZES if s >= rows), rows)

    def invalidate(self) -> None:
        """Forget captured graphs (the cache tensors they point at were reallocated)."""
        self._graphs.clear()

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`TinyDecoder.decode` over all positions for these rows, as a graph replay."""
        rows = tokens.shape[0]
        size = self.padded(rows)
        if size not in self._graphs:
            self._graphs[size] = self._capture(size)
        graph, static_tokens, static_positions, logits = self._graphs[size]
        static_tokens.zero_()
        static_positions.fill_(self.scratch_position)
        static_tokens[:rows].copy_(tokens)
        static_positions[:rows].copy_(positions)
        graph.replay()
        return logits[:rows]

    def _capture(
        self, size: int
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
        device = self.cache.device
        span = self.model.config.max_model_len
        tokens = torch.zeros(size, dtype=torch.long, device=device)
        positions = torch.full((size,), self.scratch_position, dtype=torch.long, device=device)
        # Warm up on a side stream before capture, as torch.cuda.graph requires.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.model.decode(tokens, positions, span, self.cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model.decode(tokens, positions, span, self.cache)
        return graph, tokens, positions, logits


# --- requests -------------------------------------------------------------------------


class QueueFull(Exception):
    """The waiting queue holds `max_queue` requests; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SchedulerStopping(QueueFull):
    """The scheduler is draining or stopped and admits nothing new."""


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
        """The request-log line (JSON-ready); `output_tokens` is what batchscope-static-util reads."""
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
class _Sequence:
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
    kv_tokens: int = 0  # positions of this request's cache written
    needs_prefill: bool = True
    preemptions: int = 0
    finish_reason: FinishReason | None = None

    @property
    def length(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestHandle:
    """What `Scheduler.submit` returns: the id (for `cancel`) and the result's future."""

    request_id: str
    future: Future[CompletionResult]


class SchedulerListener(Protocol):
    """Observes the scheduler; called on the scheduler thread, so it must be quick."""

    def on_step(self, rows: int, prefill_tokens: int) -> None:
        """A step ran `rows` decode rows and `prefill_tokens` prompt tokens in one forward."""

    def on_finished(self, result: CompletionResult) -> None:
        """A request finished (any reason)."""


class RequestLog:
    """Appends one JSON line per finished request to `path` (a SchedulerListener)."""

    def __init__(self, path: str | Path) -> None:
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()

    def on_step(self, rows: int, prefill_tokens: int) -> None:
        """Steps are not logged."""

    def on_finished(self, result: CompletionResult) -> None:
        with self._lock:
            self._file.write(json.dumps(result.log_record()) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


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


@dataclass(frozen=True)
class SchedulerStats:
    """Counters and state of the scheduler at one moment.

    Slot utilisation counts busy steps only (steps with at least one request in the
    batch): useful slot-steps (a request produced a token) over `max_num_seqs` slots per
    step. `idle_slot_steps_while_waiting` counts free or finished-but-held slots in steps
    that ran while requests waited: 0 for continuous batching unless the KV cache limits it.
    """

    batching: Batching
    max_num_seqs: int
    kv_cache_tokens: int
    max_queue: int
    running: int
    waiting: int
    kv_tokens_used: int
    steps: int
    useful_slot_steps: int
    slot_steps: int
    idle_slot_steps_while_waiting: int
    generation_tokens: int
    prompt_tokens_computed: int
    preemptions: int
    finished: int
    max_waiting_seen: int

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
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._cancelled: set[str] = set()
        self._pending_max_num_seqs: int | None = None
        self._accepting = True
        self._stop = False
        self._drain = True
        self._thread: threading.Thread | None = None

        # Scheduler-thread state.
        self._rows: list[_Sequence] = []  # row i of the batch lives in cache slot i
        self._admissions = 0
        self._kv_used = 0
        # Published under the lock at the end of each step, for `stats`.
        self._running = 0
        self._kv_used_published = 0
        self._steps = 0
        self._useful = 0
        self._slot_steps = 0
        self._idle_while_waiting = 0
        self._generated = 0
        self._prompt_computed = 0
        self._preemptions = 0
        self._finished = 0
        self._max_waiting_seen = 0
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
        when `max_queue` requests already wait, SchedulerStopping when draining.
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
        seq = _Sequence(
            request_id=f"cmpl-{uuid.uuid4().hex}",
            prompt=list(prompt_tokens),
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            on_token=on_token,
            future=Future(),
        )
        with self._lock:
            if not self._accepting:
                raise SchedulerStopping("the server is shutting down", retry_after_s=5)
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"{len(self._waiting)} requests are waiting (--max-queue {self.max_queue})",
                    retry_after_s=self._retry_after_s(),
                )
            self._waiting.append(seq)
            self._max_waiting_seen = max(self._max_waiting_seen, len(self._waiting))
            self._lock.notify()
        return RequestHandle(seq.request_id, seq.future)

    def cancel(self, request_id: str) -> None:
        """Abort a request (a client that went away): at the next step it leaves the queue or
        its slot, and its future resolves with finish_reason `abort`."""
        with self._lock:
            self._cancelled.add(request_id)
            self._lock.notify()

    def configure(self, *, max_num_seqs: int | None = None) -> None:
        """Change the batch cap from the next step on."""
        if max_num_seqs is not None:
            if max_num_seqs < 1:
                raise ValueError("max_num_seqs must be at least 1")
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
            return SchedulerStats(
                batching=self.batching,
                max_num_seqs=self._max_num_seqs,
                kv_cache_tokens=self.kv_cache_tokens,
                max_queue=self.max_queue,
                running=self._running,
                waiting=len(self._waiting),
                kv_tokens_used=self._kv_used_published,
                steps=self._steps,
                useful_slot_steps=self._useful,
                slot_steps=self._slot_steps,
                idle_slot_steps_while_waiting=self._idle_while_waiting,
                generation_tokens=self._generated,
                prompt_tokens_computed=self._prompt_computed,
                preemptions=self._preemptions,
                finished=self._finished,
                max_waiting_seen=self._max_waiting_seen,
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

    def _retry_after_s(self) -> int:
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
                    self._abort_all_locked()
                    return False
                if self._has_work_locked():
                    return True
                if self._stop:
                    return False
                self._lock.wait()

    def _step(self) -> None:
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            if self._pending_max_num_seqs is not None:
                self._max_num_seqs, self._pending_max_num_seqs = self._pending_max_num_seqs, None
            for seq in [s for s in self._waiting if s.request_id in cancelled]:
                self._waiting.remove(seq)
                self._finish(seq, "abort")
        self._ensure_cache()
        for row in [r for r in self._rows if r.request_id in cancelled]:
            self._remove_row(row)
            if not row.finished:
                self._finish(row, "abort")
        if self.batching == "continuous" or all(r.finished for r in self._rows):
            # Continuous frees finished slots every step; a static group frees them together.
            for row in [r for r in self._rows if r.finished]:
                self._remove_row(row)
        self._preempt_to_fit()
        requests_wait = self._admit()
        if self._rows:
            self._run_batch(requests_wait)
        with self._lock:
            self._running = len(self._active())
            self._kv_used_published = self._kv_used

    def _ensure_cache(self) -> None:
        if (
            self._cache.ensure_slots(self._physical_slots(self._max_num_seqs))
            and self._graph_decode
        ):
            self._graph_decode.invalidate()

    def _active(self) -> list[_Sequence]:
        return [r for r in self._rows if not r.finished]

    def _kv_needed(self, extra: Iterable[_Sequence] = ()) -> int:
        """KV tokens the next step needs: every active row writes one more position, and an
        admitted request needs its whole sequence (prefill plus this step's token)."""
        return self._kv_used + len(self._active()) + sum(s.length for s in extra)

    def _preempt_to_fit(self) -> None:
        # A lone request always fits (submit checks it), so this ends.
        while self._kv_needed() > self.kv_cache_tokens and len(self._active()) > 1:
            victim = max(self._active(), key=lambda s: s.admission)
            self._remove_row(victim)
            victim.needs_prefill = True
            victim.preemptions += 1
            with self._lock:
                self._preemptions += 1
                self._waiting.appendleft(victim)

    def _admit(self) -> bool:
        """Admit what fits; True when requests still wait after it."""
        admitted: list[_Sequence] = []
        with self._lock:
            # A static group forms only once the previous one has left the batch.
            static_busy = self.batching == "static" and bool(self._rows)
            room = 0 if static_busy else self._max_num_seqs - len(self._rows)
            while self._waiting and len(admitted) < room:
                candidate = self._waiting[0]
                if self._kv_needed([*admitted, candidate]) > self.kv_cache_tokens:
                    break
                admitted.append(self._waiting.popleft())
            requests_wait = bool(self._waiting)
        now = time.perf_counter()
        for seq in admitted:
            self._admissions += 1
            seq.admission = self._admissions
            if seq.first_admitted is None:
                seq.first_admitted = now
            self._rows.append(seq)
        return requests_wait

    def _remove_row(self, row: _Sequence) -> None:
        """Take `row` out of the batch and free its cache; the last row moves into its slot
        so that rows stay contiguous."""
        index = self._rows.index(row)
        last = self._rows.pop()
        if last is not row:
            self._cache.move(len(self._rows), index, last.kv_tokens)
            self._rows[index] = last
        self._kv_used -= row.kv_tokens
        row.kv_tokens = 0

    def _run_batch(self, requests_wait: bool) -> None:
        started = time.perf_counter()
        prefill_tokens = 0  # tokens before each admitted request's last one
        prompt_tokens = 0  # every token a (re)admitted request brings, the last one included
        contexts: list[list[int]] = []
        context_slots: list[int] = []
        for slot, row in enumerate(self._rows):
            if row.needs_prefill:
                context = (row.prompt + row.output)[:-1]
                if context:
                    contexts.append(context)
                    context_slots.append(slot)
                prefill_tokens += len(context)
                prompt_tokens += len(context) + 1
                self._kv_used += len(context)
                row.kv_tokens = len(context)
                row.needs_prefill = False
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
        self.device.pace_decode(rows, prefill_tokens, started)
        now = time.perf_counter()

        produced = 0
        for row, token in zip(list(self._rows), new_tokens, strict=True):
            if row.finished:
                continue  # a static group's finished row: computed, discarded
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
            self._steps += 1
            self._useful += produced
            self._slot_steps += self._max_num_seqs
            if requests_wait:
                self._idle_while_waiting += self._max_num_seqs - produced
            self._generated += produced
            self._prompt_computed += prompt_tokens
            self._mean_step_seconds += SMOOTHING * (now - started - self._mean_step_seconds)
        for listener in self._listeners:
            listener.on_step(rows, prefill_tokens)

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
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
            self._finished += 1
            self._mean_output_tokens += SMOOTHING * (len(seq.output) - self._mean_output_tokens)
        for listener in self._listeners:
            listener.on_finished(result)
        seq.future.set_result(result)

    def _fail_rows(self, error: Exception) -> None:
        for row in list(self._rows):
            self._remove_row(row)
            if not row.finished:
                row.finish_reason = "abort"
                row.future.set_exception(error)

    def _abort_all_locked(self) -> None:
        while self._waiting:
            self._finish(self._waiting.popleft(), "abort")
        for row in list(self._rows):
            self._remove_row(row)
            if not row.finished:
                self._finish(row, "abort")
