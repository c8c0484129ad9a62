"""One generation at a time, on one thread off the event loop: calls queue up behind it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_END = object()


class Worker:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dtrain-serve")

    async def run(self, fn: Callable[[threading.Event], T]) -> T:
        """`fn(cancelled)`'s result, once the calls before it are done. The event is never
        set: a call whose client left is finished anyway (its answer is small)."""
        return await asyncio.wrap_future(self._pool.submit(fn, threading.Event()))

    async def stream(self, fn: Callable[[threading.Event], Iterator[T]]) -> AsyncIterator[T]:
        """The items of `fn(cancelled)` as the worker makes them. When the consumer stops early
        (the client disconnected), `cancelled` is set, which `fn` checks between items."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancelled = threading.Event()

        def put(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens anymore
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                for item in fn(cancelled):
                    put(item)
            except BaseException as exc:
                put(exc)
            finally:
                put(_END)

        self._pool.submit(work)
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            cancelled.set()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
