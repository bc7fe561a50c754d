"""Errors in OpenAI's shape, as vLLM answers them: `{"error": {"message", "type", "param",
"code"}}`, with the field at fault named, and the handlers that turn FastAPI's own errors
into that shape."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchscope.demo_server.queueing import QueueFull


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


def queue_full(error: QueueFull) -> JSONResponse:
    """A 429 that says when to retry."""
    return error_response(429, str(error), headers={"Retry-After": str(error.retry_after_seconds)})


async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
    message, field = validation_message(error)
    return error_response(400, message, param=field)


async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
    # e.g. a body that is not UTF-8 JSON at all: the same error shape as every other
    return error_response(error.status_code, str(error.detail), headers=error.headers)
