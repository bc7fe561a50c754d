"""The demo server's HTTP face: OpenAI-style completions and embeddings, health, metrics, admin.

`create_app(config)` builds one independent server (own model, scheduler, embedding
service and Prometheus registry), so tests can run several in one process.

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

import asyncio
import codecs
import contextlib
import gc
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchscope.demo_server.devices import select_device
from batchscope.demo_server.embedding.batcher import ItemError
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.embedding.service import EmbeddingService
from batchscope.demo_server.generation.decoder import TinyDecoder, encode_prompt, token_bytes
from batchscope.demo_server.generation.listeners import RequestLog, SchedulerListener
from batchscope.demo_server.generation.requests import (
    CompletionResult,
    InvalidRequest,
    RequestHandle,
)
from batchscope.demo_server.generation.scheduler import (
    Attention,
    Batching,
    Scheduler,
    SchedulerConfig,
)
from batchscope.demo_server.generation.vllm_metrics import SchedulerCollector, VllmRequestMetrics
from batchscope.demo_server.names import MODEL_NAME
from batchscope.demo_server.queueing import QueueFull

log = logging.getLogger(__name__)

LOCAL_HOSTS = frozenset({"127.0.0.1", "::1"})
# Host names a local admin request may carry (without the port).
LOCAL_HOST_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
# The largest request body read: a prompt or a list of inputs fits many times over.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_NUM_SEQS_LIMIT = 256  # each slot holds a full-length KV cache (1 MiB at this model size)
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request


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


# --- request bodies (pydantic validates; errors name the field) -------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """OpenAI's completion request, the fields this server implements; others are ignored."""

    prompt: str
    max_tokens: int = Field(16, ge=1)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    model: str | None = None


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


# --- errors, OpenAI's shape (as vLLM answers them) ---------------------------------------


def error_response(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    kinds = {
        400: "BadRequestError",
        401: "AuthenticationError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        413: "RequestTooLargeError",
        429: "RateLimitError",
        503: "ServiceUnavailableError",
    }
    body = {
        "error": {
            "message": message,
            "type": kinds.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def validation_message(error: RequestValidationError) -> tuple[str, str]:
    """('field: problem; ...', first field) from pydantic's errors, `body` for the whole body."""
    parts = []
    fields = []
    for item in error.errors():
        # A body that is not JSON at all is located at a character offset: name the body.
        location = [] if item.get("type") == "json_invalid" else item.get("loc", ())
        field = ".".join(str(p) for p in location if p != "body") or "body"
        fields.append(field)
        parts.append(f"{field}: {item.get('msg', 'invalid')}")
    return "; ".join(parts), (fields[0] if fields else "body")


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so `receive` now waits
    for the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` is answered 413 and never read whole.

    Content-Length over the limit is refused at once; a body without one is counted as
    it arrives and refused when it passes the limit. The body read is replayed to the app.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message], receive), send)
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        response = error_response(413, f"the request body is over {self.max_bytes} bytes")
        await response(scope, receive, send)


def _replay(messages: list[dict], receive: Any) -> Any:
    """A `receive` that gives `messages` first, then the connection's own."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed


def _host_name(host_header: str) -> str:
    """The Host header without its port (an IPv6 literal keeps its brackets)."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0]


class _Server:
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


class _Forbidden(Exception):
    """A request the admin endpoint refuses: not local, a foreign Host, no token."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


# --- shared by the routes ----------------------------------------------------------------


def _current_server(request: Request) -> _Server:
    return request.app.state.server


CurrentServer = Annotated[_Server, Depends(_current_server)]


def local_only(request: Request) -> None:
    """Admits only a local client naming a local Host, with the admin token when set;
    raises _Forbidden otherwise."""
    host = request.client.host if request.client else None
    if host not in LOCAL_HOSTS:
        raise _Forbidden("the admin endpoint answers only 127.0.0.1 and ::1")
    # A DNS-rebinding page reaches 127.0.0.1 under its own name: refuse that Host.
    if _host_name(request.headers.get("host", "")) not in LOCAL_HOST_NAMES:
        raise _Forbidden("the admin endpoint answers only requests for a local Host")
    expected = request.app.state.server.admin_authorization
    if expected is not None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise _Forbidden("the admin endpoint needs the admin token", status=401)


def _queue_full(error: QueueFull) -> JSONResponse:
    """A 429 that says when to retry."""
    return error_response(429, str(error), headers={"Retry-After": str(error.retry_after_seconds)})


def _text_completion(
    request_id: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """OpenAI's text_completion object: a whole answer, or one chunk of a stream."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


# --- error handlers ----------------------------------------------------------------------


async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
    message, field = validation_message(error)
    return error_response(400, message, param=field)


async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
    # e.g. a body that is not UTF-8 JSON at all: the same error shape as every other
    return error_response(error.status_code, str(error.detail), headers=error.headers)


async def forbidden(_: Request, refusal: _Forbidden) -> JSONResponse:
    return error_response(refusal.status, str(refusal))


# --- routes ------------------------------------------------------------------------------


async def completions(body: CompletionRequest, request: Request, server: CurrentServer) -> Response:
    """The whole answer, or with `stream` OpenAI's SSE chunks; 499 when the client left."""
    if (wrong_model := server.check_model(body.model)) is not None:
        return wrong_model
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[int | None] = asyncio.Queue()

    def on_token(token: int) -> None:
        loop.call_soon_threadsafe(tokens.put_nowait, token)

    try:
        handle = server.scheduler.submit(
            encode_prompt(body.prompt),
            body.max_tokens,
            ignore_eos=body.ignore_eos,
            on_token=on_token if body.stream else None,
        )
    except InvalidRequest as error:
        return error_response(400, str(error), param=error.param)
    except QueueFull as error:
        return _queue_full(error)
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _streaming_response(server, handle, tokens, created, include_usage)
    result = await _until_done(server, handle, request)
    if result is None:
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"
    text = token_bytes(result.output).decode("utf-8", errors="replace")
    return JSONResponse(
        _text_completion(
            result.request_id,
            created,
            server.config.model_name,
            [_choice(text, result.finish_reason)],
            usage=_usage(result),
        )
    )


async def embeddings(body: EmbeddingRequest, server: CurrentServer) -> Response:
    """One vector per input; a failing embedding answers 500 without its exception's text."""
    if (wrong_model := server.check_model(body.model)) is not None:
        return wrong_model
    texts = [body.input] if isinstance(body.input, str) else body.input
    try:
        vectors = await server.embeddings.embed(texts)
    except QueueFull as error:
        return _queue_full(error)
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
    (_Forbidden, forbidden),
)


def create_app(config: ServerConfig) -> FastAPI:
    """A FastAPI app serving one demo server built from `config`; started by its lifespan."""
    server = _Server(config)

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


def _usage(result: CompletionResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.prompt_tokens + result.output_tokens,
    }


async def _until_done(
    server: _Server, handle: RequestHandle, request: Request
) -> CompletionResult | None:
    """The request's result, or None when the client went away first (then the request
    is cancelled, freeing its slot)."""
    result: Awaitable[CompletionResult] = asyncio.wrap_future(handle.future)
    done = asyncio.ensure_future(result)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            server.scheduler.cancel(handle.request_id)
    return done.result() if done.done() else None


def _streaming_response(
    server: _Server,
    handle: RequestHandle,
    tokens: asyncio.Queue[int | None],
    created: int,
    include_usage: bool,
) -> StreamingResponse:
    """`_stream` as the response; a None queued once the request is done ends it."""
    loop = asyncio.get_running_loop()
    handle.future.add_done_callback(lambda _: loop.call_soon_threadsafe(tokens.put_nowait, None))
    return StreamingResponse(
        _stream(server, handle, tokens, created, include_usage), media_type="text/event-stream"
    )


async def _stream(
    server: _Server,
    handle: RequestHandle,
    tokens: asyncio.Queue[int | None],
    created: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    """OpenAI's completion stream: one chunk per token, the last with its finish_reason,
    then a usage chunk when asked, then [DONE]. Cancelling it (the client disconnected)
    cancels the request."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    model = server.config.model_name

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        body = _text_completion(handle.request_id, created, model, choices, **extra)
        return f"data: {json.dumps(body)}\n\n"

    try:
        while (token := await tokens.get()) is not None:
            yield event([_choice(decoder.decode(token_bytes([token])), None)])
        result = handle.future.result()
        yield event([_choice(decoder.decode(b"", final=True), result.finish_reason)])
        if include_usage:
            yield event([], usage=_usage(result))
        yield "data: [DONE]\n\n"
    finally:
        if not handle.future.done():
            server.scheduler.cancel(handle.request_id)
