"""A trio event loop on a thread of its own, driven from synchronous code: the lifecycle that
the gossip host (`host.GossipNode`) and the file-only data peer (`dataserve.DataPeer`) share.

A subclass implements `_run()`: set the host up, call `self._ready.set()`, then
`await self._stop.wait()` (and tear down). Synchronous methods reach the loop through
`_call(async_fn, ...)` and `_call_sync(fn, ...)`, which fail with GossipError when it is not
running.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, Self

import trio

from dtrain_node.errors import GossipError

log = logging.getLogger(__name__)


class Looper:
    """start()/stop() of a trio loop on a daemon thread named `thread_name`."""

    thread_name = "trio"

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: trio.Event | None = None

    def start(self, timeout: float = 30.0) -> Self:
        if self._thread is not None:
            raise GossipError("start() called twice")
        self._thread = threading.Thread(
            target=self._thread_main, name=self.thread_name, daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise GossipError(f"libp2p host not ready after {timeout} s")
        if self._error is not None:
            raise GossipError(f"libp2p host failed to start: {self._error!r}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        t = self._thread
        if t is None or not t.is_alive():
            return
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        t.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # reported by start(); a crashed host must not hang callers
            self._error = e
            log.exception("%s host crashed", self.thread_name)
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        await self._run()

    async def _run(self) -> None:
        raise NotImplementedError

    def _running_token(self) -> trio.lowlevel.TrioToken:
        if self._token is None or self._thread is None or not self._thread.is_alive():
            raise GossipError(f"{self.thread_name} host is not running")
        return self._token

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return trio.from_thread.run(
            functools.partial(fn, *args, **kw), trio_token=self._running_token()
        )

    def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._running_token())
