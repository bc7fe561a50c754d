"""`POST /v1/completions`: OpenAI's completion request on the generation scheduler, the
whole answer or (with `stream`) OpenAI's SSE chunks as they are produced. A client that
disconnects has its request cancelled, which frees its batch slot.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from batchscope.demo_server.generation.decoder import encode_prompt, token_bytes
from batchscope.demo_server.generation.requests import (
    CompletionResult,
    InvalidRequest,
    RequestHandle,
)
from batchscope.demo_server.http.errors import error_response, queue_full
from batchscope.demo_server.http.server import CurrentServer, DemoServer
from batchscope.demo_server.queueing import QueueFull


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


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so `receive` now waits
    for the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
        return queue_full(error)
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


def _usage(result: CompletionResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.prompt_tokens + result.output_tokens,
    }


async def _until_done(
    server: DemoServer, handle: RequestHandle, request: Request
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
    server: DemoServer,
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
    server: DemoServer,
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
