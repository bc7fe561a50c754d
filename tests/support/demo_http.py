"""Shared by the tests: moved out of tests/demo_server/test_demo_server.py so no test imports
another."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import uvicorn

from batchscope.demo_server.http.app import ServerConfig, create_app
from batchscope.demo_server.loadgen.workload import completion_body
from tests.support.network import wait_until


def bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serve(config: ServerConfig) -> Iterator[str]:
    """Run the app with uvicorn in a thread on a free port; yields its base URL."""
    sock = bound_socket()
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server's thread ended before it started"
        return server.started

    wait_until(started, 60, "uvicorn to start the demo server", interval=0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def completion(
    url: str, max_tokens: int, *, model: str | None = None, **extra: object
) -> httpx.Response:
    body = completion_body("hello", max_tokens, model=model, **extra)
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)
