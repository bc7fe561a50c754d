"""Shared by the tests: moved out of tests/demo_server/test_demo_server.py so no test imports
another."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn

from demo_server.http.app import ServerConfig, create_app


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
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def completion(url: str, max_tokens: int, **extra: object) -> httpx.Response:
    body = {"prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)
