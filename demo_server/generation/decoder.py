"""The generation model: a tiny byte-level decoder with a KV cache.

The decoder is a decoder-only transformer with random weights (drawn from `seed`, nothing
downloaded). Its outputs are noise; what matters is that it runs real forwards whose cost
depends on the batch, so the scheduler's batching
(`batchscope.demo_server.generation.scheduler`) is the real thing.

This module holds what one forward needs: the vocabulary (`encode_prompt`,
`token_bytes`), `ModelConfig`, `KVCache` (one slot per batch row), `TinyDecoder`,
`PrefillBatch` (admitted contexts riding along with the decode tokens in one forward),
`sample`, and `CudaGraphDecode` (the decode step captured as CUDA graphs by batch size).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from batchscope.demo_server.generation.ragged import RaggedAttention

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
    """A byte-level decoder-only transformer with random weights drawn from `seed`."""

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

    # The ragged decode attention kernel (`batchscope.demo_server.generation.ragged`); None:
    # padded attention.
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
