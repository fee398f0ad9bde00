"""An event loop on a thread of its own, so sync code (the CLI, a user's script) can use the
async event path, whose statements go through the profile's executor, one call at a time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop; `call` runs a coroutine there and waits for it."""

    def __init__(self, name: str = "harel-edge-loop") -> None:
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """The coroutine's result. If the wait is interrupted (Ctrl-C), the call still runs to
        its end before this returns, so the caller never shares a connection with it."""
        if os.getpid() != self._pid:
            coro.close()
            raise RuntimeError("this store was opened in another process (before a fork): open a new one here")
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("this store was closed: open a new one")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                concurrent.futures.wait([future])
            raise

    def stop(self) -> None:
        if self._loop.is_closed() or os.getpid() != self._pid:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        if not self._thread.is_alive():
            self._loop.close()
