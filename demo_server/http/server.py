"""One demo server's parts and settings: the model, its scheduler, the embedding service
and their Prometheus registry, built from a `ServerConfig`; `CurrentServer` hands them to
a route.

Each `create_app` builds its own `DemoServer`, so tests can run several in one process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from batchscope.demo_server.devices import select_device
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.embedding.service import EmbeddingService
from batchscope.demo_server.generation.decoder import TinyDecoder
from batchscope.demo_server.generation.listeners import RequestLog, SchedulerListener
from batchscope.demo_server.generation.scheduler import (
    Attention,
    Batching,
    Scheduler,
    SchedulerConfig,
)
from batchscope.demo_server.generation.vllm_metrics import SchedulerCollector, VllmRequestMetrics
from batchscope.demo_server.http.errors import error_response
from batchscope.demo_server.names import MODEL_NAME

log = logging.getLogger(__name__)

MAX_NUM_SEQS_LIMIT = 256  # each slot holds a full-length KV cache (1 MiB at this model size)


@dataclass(frozen=True)
class ServerConfig:
    """Everything `batchscope-demo-server` takes on its command line."""

    host: str = "127.0.0.1"
    port: int = 8000
    batching: Batching = "continuous"
    attention: Attention = "auto"
    max_num_seqs: int = 16
    kv_cache_tokens: int = 65536
    max_queue: int = 1024
    # Tokens one step may carry, chunking prefills (vLLM's --max-num-batched-tokens).
    max_num_batched_tokens: int | None = None
    device: str = "auto"
    # A simulated device this many times slower than the one measured (devices.py).
    sim_slowdown: float = 1.0
    embedding: BatcherSettings = BatcherSettings()
    request_log: str | None = None
    model_name: str = MODEL_NAME
    seed: int = 0
    # Required as a bearer token on /admin/config when set; never shown.
    admin_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_num_seqs <= MAX_NUM_SEQS_LIMIT:
            raise ValueError(f"max_num_seqs must be within 1..{MAX_NUM_SEQS_LIMIT}")


class DemoServer:
    """One server's parts, shared by its routes."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        # The Authorization header an admin request must carry, when there is a token.
        self.admin_authorization = (
            f"Bearer {config.admin_token}".encode() if config.admin_token is not None else None
        )
        self.device = select_device(config.device, config.sim_slowdown)
        self.registry = CollectorRegistry()
        # The process series a vLLM payload carries too; per registry, so per app.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        model = TinyDecoder(seed=config.seed)
        listeners: list[SchedulerListener] = [
            VllmRequestMetrics(self.registry, config.model_name, model.config.max_model_len)
        ]
        self.request_log = RequestLog(config.request_log) if config.request_log else None
        if self.request_log is not None:
            listeners.append(self.request_log)
        self.scheduler = Scheduler(
            model,
            self.device,
            SchedulerConfig(
                batching=config.batching,
                max_num_seqs=config.max_num_seqs,
                kv_cache_tokens=config.kv_cache_tokens,
                max_queue=config.max_queue,
                attention=config.attention,
                max_num_batched_tokens=config.max_num_batched_tokens,
            ),
            seed=config.seed,
            listeners=listeners,
        )
        self.registry.register(SchedulerCollector(self.scheduler, self.device, config.model_name))
        self.embeddings = EmbeddingService(
            settings=config.embedding,
            device=self.device,
            registry=self.registry,
            max_queue=config.max_queue,
            seed=config.seed,
        )
        self.started = int(time.time())

    async def start(self) -> None:
        self.scheduler.start()
        await self.embeddings.start()
        # The models and torch's own objects live as long as the server: out of the
        # collector's sight, a full collection walks only what requests leave behind
        # (without this, its pauses reach 100 ms and more and set the p99).
        gc.freeze()
        slower = self.device.slowdown
        pace = "the measured H200 curve" + (f" x {slower:g}" if slower != 1 else "")
        simulated = f" (SIMULATED: CPU paced to {pace})" if self.device.simulated else ""
        log.info(
            "serving %s: generation %s (%s attention), max_num_seqs=%d, kv_cache_tokens=%d; "
            "embeddings %s; device %s%s",
            self.config.model_name,
            self.config.batching,
            self.scheduler.attention,
            self.config.max_num_seqs,
            self.config.kv_cache_tokens,
            self.config.embedding.mode,
            self.device.name,
            simulated,
        )

    async def stop(self) -> None:
        # uvicorn has already waited for in-flight HTTP requests; drain whatever is left.
        await self.embeddings.stop(drain=True)
        await asyncio.to_thread(self.scheduler.stop, True)
        if self.request_log is not None:
            self.request_log.close()
        log.info("stopped: %d generation requests finished", self.scheduler.stats().finished)

    def admin_view(self) -> dict[str, Any]:
        stats = self.scheduler.stats()
        return {
            "generation": {
                "batching": stats.batching,
                "max_num_seqs": self.scheduler.max_num_seqs,
                "kv_cache_tokens": stats.kv_cache_tokens,
                "max_queue": stats.max_queue,
                "running": stats.running,
                "waiting": stats.waiting,
            },
            "embedding": self.embeddings.snapshot(),
        }

    def check_model(self, model: str | None) -> JSONResponse | None:
        if model is None or model == self.config.model_name:
            return None
        return error_response(404, f"The model `{model}` does not exist.", param="model")


def current_server(request: Request) -> DemoServer:
    return request.app.state.server


CurrentServer = Annotated[DemoServer, Depends(current_server)]
