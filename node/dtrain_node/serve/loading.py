"""The server listens before its model is loaded. `Loading` is the ASGI app it serves at once:
until the loader hands it the real app (`ready`), every call is answered HTTP 503 with an
OpenAI-shaped error saying the model is loading and a `Retry-After` header, and `GET /health`
answers 503 `{"status": "loading"}`; then every request goes to the real app (whose `/health`
answers 200 `{"status": "ready"}`). A loader that fails (`failed`) leaves each call a 503 naming
the load error until the server stops.

Only the standard library here: nothing heavy is imported before the port listens."""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from dtrain.errors import DtrainError

RETRY_AFTER_S = 5  # what a call answered 503 while loading is told to wait
HEALTH_PATH = "/health"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ModelLoadFailed(DtrainError):
    """The model to serve could not be loaded (one line: why); the server stops."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Loading:
    """The app while `model_id` loads: 503s, then the loaded app's answers."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self._app: ASGIApp | None = None
        self._failure: str | None = None
        self._settled = threading.Event()

    @property
    def state(self) -> str:
        """ "loading", "ready" or "failed"."""
        if self._app is not None:
            return "ready"
        return "failed" if self._failure is not None else "loading"

    @property
    def failure(self) -> str | None:
        return self._failure

    def ready(self, app: ASGIApp) -> None:
        """From now on `app` answers every request."""
        self._app = app
        self._settled.set()

    def failed(self, message: str) -> None:
        """The model will not load: calls are answered 503 with `message`."""
        self._failure = message
        self._settled.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether loading ended (ready or failed) within `timeout` seconds."""
        return self._settled.wait(timeout)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        app = self._app
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: nothing to serve it yet
            await send({"type": "websocket.close", "code": 1013})
            return
        await _respond(send, *self._unavailable(scope.get("path", "")))

    def _unavailable(self, path: str) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
        if self._failure is not None:
            headers: list[tuple[bytes, bytes]] = []
            message = f"The model {self.model_id} failed to load: {self._failure}"
        else:
            headers = [(b"retry-after", str(RETRY_AFTER_S).encode())]
            message = f"The model {self.model_id} is loading; try again in {RETRY_AFTER_S} s."
        if path == HEALTH_PATH:
            body: dict[str, Any] = {"status": self.state, "model": self.model_id}
            if self._failure is not None:
                body["error"] = self._failure
            return body, headers
        code = "model_load_failed" if self._failure is not None else "model_loading"
        error = {"message": message, "type": "server_error", "param": None, "code": code}
        return {"error": error}, headers

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Up at once; on shutdown, the loaded app's own lifespan runs (its cleanup)."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._app is not None:
                    await _run_lifespan(self._app)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _respond(send: Send, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _run_lifespan(app: ASGIApp) -> None:
    """`app`'s lifespan start to end: it started after the server did, so its startup and its
    shutdown both run now."""
    messages = iter(({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}))

    async def receive() -> Message:
        return next(messages)

    async def send(message: Message) -> None:
        return None

    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    await app(scope, receive, send)
