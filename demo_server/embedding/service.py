"""Embeddings: a small random-weight encoder behind the dynamic batcher
(`batchscope.demo_server.embedding.batcher`).

`EmbeddingService` is what the app calls: the `Encoder` on a device (paced to a measured
cost curve on a simulated one), behind a `Batcher` registered as batcher `embeddings`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from batchscope.demo_server.devices import Device
from batchscope.demo_server.embedding.batcher import Batcher, ItemError
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.exporter.instrumentation import BatcherMetrics

BATCHER_NAME = "embeddings"

# A text containing this marker fails inside the model's preprocessing: a runtime
# failure the app's input validation cannot see, for tests and demos of isolation.
FAIL_MARKER = "\x00fail"

WARMUP_TEXT = "the quick brown fox jumps over the lazy dog"


class Encoder(torch.nn.Module):
    """A small byte-level transformer encoder with random weights drawn from `seed`.

    Texts become UTF-8 bytes after a start token (truncated to `max_tokens`); two
    layers of self-attention, mean-pooled over the real tokens and L2-normalised, give
    one `dim`-sized unit vector per text. The same `seed` gives the same weights.
    """

    PAD = 0
    START = 1
    VOCAB = 258  # pad, start, then the 256 byte values

    def __init__(
        self, seed: int, *, dim: int = 64, layers: int = 2, heads: int = 4, max_tokens: int = 128
    ) -> None:
        super().__init__()
        self.dim = dim
        self.max_tokens = max_tokens
        # A local random state: building the model leaves the process's own alone.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tokens = torch.nn.Embedding(self.VOCAB, dim, padding_idx=self.PAD)
            self.positions = torch.nn.Embedding(max_tokens, dim)
            layer = torch.nn.TransformerEncoderLayer(
                dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True
            )
            self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` becomes (its row's length before padding)."""
        return 1 + min(len(text.encode("utf-8")), self.max_tokens - 1)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids, one padded row per text; raises ItemError(index) for a text that
        carries FAIL_MARKER."""
        rows = []
        for index, text in enumerate(texts):
            if FAIL_MARKER in text:
                raise ItemError(f"input {index} failed in preprocessing (injected)", index)
            data = text.encode("utf-8")[: self.max_tokens - 1]
            rows.append([self.START] + [byte + 2 for byte in data])
        width = max(len(row) for row in rows)
        return torch.tensor([row + [self.PAD] * (width - len(row)) for row in rows])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        padding = ids == self.PAD
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.encoder(
            self.tokens(ids) + self.positions(positions), src_key_padding_mask=padding
        )
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def embed(self, texts: Sequence[str], device: torch.device | str = "cpu") -> list[list[float]]:
        """One unit vector per text, as plain floats."""
        ids = self.tokenize(texts).to(device)
        with torch.inference_mode():
            return self(ids).float().cpu().tolist()


class EmbeddingService:
    """The demo server's embeddings engine: the random-weight `Encoder` on `device`, behind
    a `Batcher` whose counters are registered in `registry` as batcher `embeddings`.

    On a simulated device each batch is paced to the device's measured cost curve.
    """

    def __init__(
        self,
        *,
        settings: BatcherSettings,
        device: Device,
        registry: CollectorRegistry,
        max_queue: int,
        seed: int,
    ) -> None:
        self.device = device
        self._encoder = Encoder(seed).to(device.torch_device).eval()
        # The batcher publishes the rest of its configuration as it applies it.
        metrics = BatcherMetrics(
            BATCHER_NAME, max_batch_size=settings.max_batch_size, registry=registry
        )
        self._batcher = Batcher(
            self._encode,
            settings=settings,
            max_queue=max_queue,
            metrics=metrics,
            count_tokens=self._encoder.count_tokens,
        )

    async def start(self) -> None:
        """Measure the cost curve at a few batch sizes (also warming the model), then
        accept requests."""
        await asyncio.to_thread(self._measure_cost)
        await self._batcher.start()

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting; with `drain`, finish every queued and running item first."""
        await self._batcher.stop(drain)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One unit vector per text; each text is one item in the batcher. Raises
        QueueFull (with `retry_after_seconds`) or ItemError."""
        return await self._batcher.submit(texts)

    @property
    def settings(self) -> BatcherSettings:
        return self._batcher.settings

    def configure(self, settings: BatcherSettings) -> None:
        """Change batching settings for the next batch, without a restart."""
        self._batcher.configure(settings)

    def snapshot(self) -> dict[str, Any]:
        """The batcher's snapshot plus the device's description (and whether it is simulated)."""
        return {**self._batcher.snapshot(), **self.device.describe()}

    def _encode(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = self._encoder.embed(texts, self.device.torch_device)
        self.device.pace("encoder", len(texts), started)
        return vectors

    def _measure_cost(self) -> None:
        self._encode([WARMUP_TEXT])  # the first call pays one-off setup, not batch cost
        size = 1
        while True:
            started = time.perf_counter()
            self._encode([WARMUP_TEXT] * size)
            self._batcher.cost_curve.observe(size, time.perf_counter() - started)
            max_batch_size = self._batcher.settings.max_batch_size
            if size >= max_batch_size:
                return
            size = min(size * 2, max_batch_size)
