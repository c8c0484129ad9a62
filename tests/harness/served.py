"""Our HTTP apps in this process: uvicorn on a thread, on a free loopback port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from dtrain_node.serve.app import create_app
from dtrain_node.serve.config import ServeConfig
from dtrain_node.serve.payment import Payment


@contextmanager
def served(engine: Any, cfg: ServeConfig, payment: Payment | None = None) -> Iterator[str]:
    """The app over `engine`, listening until the block ends; its base URL (…/v1)."""
    with listening(create_app(engine, cfg, payment)) as url:
        yield url + "/v1"


@contextmanager
def listening(app: Any) -> Iterator[str]:
    """An ASGI app listening until the block ends; its base URL (http://127.0.0.1:PORT)."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    started = threading.Event()

    async def startup_then_flag(*args: Any, **kw: Any) -> None:
        await original_startup(*args, **kw)
        started.set()

    original_startup = server.startup
    server.startup = startup_then_flag  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
