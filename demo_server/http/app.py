"""The demo server's HTTP face: OpenAI-style completions and embeddings, health, metrics, admin.

`create_app(config)` builds one independent server (`server.DemoServer`: own model,
scheduler, embedding service and Prometheus registry), so tests can run several in one
process, and routes to it: completions (`completions`), and here embeddings, models,
health, metrics and admin, behind the size limit and the admin guard (`guards`), every
error in OpenAI's shape (`errors`).

- `POST /v1/completions`: `prompt`, `max_tokens`, `ignore_eos`, optional `stream` (SSE
  chunks as OpenAI sends them) and `model`; the answer carries `usage.completion_tokens`.
- `POST /v1/embeddings`: `input`, a string or a list of strings.
- `GET /v1/models`: the one model served, as OpenAI and vLLM list it (many clients,
  `vllm bench serve` among them, ask for it first).
- `GET /health`, `GET /metrics` (vLLM's names, see `vllm_metrics`).
- `GET|POST /admin/config`: batch cap and embedding batch settings at run time; answers
  only requests from 127.0.0.1 or ::1 that name a local `Host` (a DNS-rebinding page
  names its own), and, when the server has an admin token, carry it as a bearer token.

A request body over MAX_REQUEST_BYTES gets a 413 before it is read further, with or
without Content-Length. A failing embedding answers 500 without the exception's text
(the server log has it).

A malformed request gets a 400 whose message names the field, before anything is queued.
A full queue answers 429 with Retry-After. A client that disconnects has its request
cancelled, which frees its batch slot. On shutdown (uvicorn's, on SIGTERM) in-flight
requests finish first; then the scheduler and the batcher drain and stop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchscope.demo_server.embedding.batcher import ItemError
from batchscope.demo_server.generation.decoder import encode_prompt
from batchscope.demo_server.http.completions import completions
from batchscope.demo_server.http.errors import (
    error_response,
    http_error,
    invalid_request,
    queue_full,
)
from batchscope.demo_server.http.guards import BodyLimit, Forbidden, forbidden, local_only
from batchscope.demo_server.http.server import (
    MAX_NUM_SEQS_LIMIT,
    CurrentServer,
    DemoServer,
    ServerConfig,
)
from batchscope.demo_server.queueing import QueueFull

log = logging.getLogger(__name__)

# The largest request body read: a prompt or a list of inputs fits many times over.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request


NonEmptyText = Annotated[str, Field(min_length=1)]


class EmbeddingRequest(BaseModel):
    """OpenAI's embedding request: `input` is one string or a list of them."""

    input: (
        NonEmptyText
        | Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    )
    model: str | None = None


class AdminSettings(BaseModel):
    """Run-time settings; a field left out keeps its value. Durations are milliseconds, as
    a person types them (see `batchscope.demo_server.embedding.batcher_settings`)."""

    model_config = ConfigDict(extra="forbid")

    max_num_seqs: int | None = Field(None, ge=1, le=MAX_NUM_SEQS_LIMIT)
    max_batch_size: int | None = Field(None, ge=1, le=4096)
    max_wait_ms: float | None = Field(None, ge=0, le=60_000)
    latency_budget_ms: float | None = Field(None, gt=0, le=600_000)


async def embeddings(body: EmbeddingRequest, server: CurrentServer) -> Response:
    """One vector per input; a failing embedding answers 500 without its exception's text."""
    if (wrong_model := server.check_model(body.model)) is not None:
        return wrong_model
    texts = [body.input] if isinstance(body.input, str) else body.input
    try:
        vectors = await server.embeddings.embed(texts)
    except QueueFull as error:
        return queue_full(error)
    except ItemError as error:
        # The exception's text may name paths and internals: it stays in the log.
        log.warning("embedding failed: %s", error.message)
        return error_response(
            500, "input: the embedding failed; the server log has the details", param="input"
        )
    prompt_tokens = sum(len(encode_prompt(t)) for t in texts)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": vector}
                for i, vector in enumerate(vectors)
            ],
            "model": server.config.model_name,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )


async def models(server: CurrentServer) -> dict[str, Any]:
    """The one model served, as OpenAI and vLLM list it."""
    name = server.config.model_name
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": server.started,
                "owned_by": "batchscope",
                "root": name,
                "parent": None,
            }
        ],
    }


async def health(server: CurrentServer) -> dict[str, Any]:
    stats = server.scheduler.stats()
    return {
        "status": "ok",
        "model": server.config.model_name,
        "device": server.device.describe(),
        "generation": {
            **asdict(stats),
            "attention": server.scheduler.attention,
            "slot_utilization": stats.slot_utilization,
            "kv_cache_usage": stats.kv_cache_usage,
        },
        "embedding": server.embeddings.snapshot(),
    }


async def metrics(server: CurrentServer) -> Response:
    return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)


async def admin_config(server: CurrentServer) -> dict[str, Any]:
    return server.admin_view()


async def admin_update(settings: AdminSettings, server: CurrentServer) -> Any:  # view, or 400
    try:
        server.scheduler.configure(max_num_seqs=settings.max_num_seqs)
    except ValueError as error:  # a cap past the token budget: nothing is changed
        return error_response(400, str(error), param="max_num_seqs")
    server.embeddings.configure(
        server.embeddings.settings.with_ms(
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            latency_budget_ms=settings.latency_budget_ms,
        )
    )
    log.info("admin: %s", settings.model_dump(exclude_none=True))
    return server.admin_view()


@dataclass(frozen=True)
class Route:
    """One endpoint: `admin` ones answer only what `local_only` admits."""

    method: str
    path: str
    handler: Callable[..., Awaitable[Any]]
    admin: bool = False


ROUTES = (
    Route("POST", "/v1/completions", completions),
    Route("POST", "/v1/embeddings", embeddings),
    Route("GET", "/v1/models", models),
    Route("GET", "/health", health),
    Route("GET", "/metrics", metrics),
    Route("GET", "/admin/config", admin_config, admin=True),
    Route("POST", "/admin/config", admin_update, admin=True),
)
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable[..., Awaitable[JSONResponse]]], ...] = (
    (RequestValidationError, invalid_request),
    (StarletteHTTPException, http_error),
    (Forbidden, forbidden),
)


def create_app(config: ServerConfig) -> FastAPI:
    """A FastAPI app serving one demo server built from `config`; started by its lifespan."""
    server = DemoServer(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="batchscope demo server", lifespan=lifespan)
    app.state.server = server
    for error, handler in ERROR_HANDLERS:
        app.add_exception_handler(error, handler)
    app.add_middleware(BodyLimit, max_bytes=MAX_REQUEST_BYTES)
    for route in ROUTES:
        admin = [Depends(local_only)] if route.admin else None
        app.add_api_route(route.path, route.handler, methods=[route.method], dependencies=admin)
    return app
