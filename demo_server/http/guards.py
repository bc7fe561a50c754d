"""What the demo server refuses before any work: a body over the size limit (`BodyLimit`,
413 before it is read whole) and an admin request that is not local, names a foreign
`Host` (DNS rebinding) or lacks the admin token (`local_only`, 403 or 401)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from batchscope.demo_server.http.errors import error_response

LOCAL_HOSTS = frozenset({"127.0.0.1", "::1"})
# Host names a local admin request may carry (without the port).
LOCAL_HOST_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})


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


class Forbidden(Exception):
    """A request the admin endpoint refuses: not local, a foreign Host, no token."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def local_only(request: Request) -> None:
    """Admits only a local client naming a local Host, with the admin token when set;
    raises Forbidden otherwise."""
    host = request.client.host if request.client else None
    if host not in LOCAL_HOSTS:
        raise Forbidden("the admin endpoint answers only 127.0.0.1 and ::1")
    # A DNS-rebinding page reaches 127.0.0.1 under its own name: refuse that Host.
    if _host_name(request.headers.get("host", "")) not in LOCAL_HOST_NAMES:
        raise Forbidden("the admin endpoint answers only requests for a local Host")
    expected = request.app.state.server.admin_authorization
    if expected is not None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Forbidden("the admin endpoint needs the admin token", status=401)


async def forbidden(_: Request, refusal: Forbidden) -> JSONResponse:
    return error_response(refusal.status, str(refusal))
