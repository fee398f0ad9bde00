"""The one sync bridge: an event loop on a thread of its own, so sync code (harel's sync worker,
the CLI, a user's script) runs the async core, whose statements go through the profile's executor."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from harel_edge.executor.base import Executor, ExecutorClosedError, Stmt

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
            raise RuntimeError("this object was opened in another process (before a fork): open a new one here")
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("this object was closed: open a new one")
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


class SyncFace:
    """What every sync face shares: an async core opened on a loop thread of its own, each call
    run there (so one face is safe from many threads), and a close that a dropped face still gets."""

    _core: Any = None

    def _start(self, name: str, opener: Coroutine[Any, Any, Any]) -> Any:
        self._loop = LoopThread(name)
        self._finalizer = weakref.finalize(self, self._loop.stop)
        try:
            self._core = self._loop.call(opener)
        except BaseException:
            self._finalizer()
            raise
        return self._core

    def _start_beside(self, owner: SyncFace, opener: Coroutine[Any, Any, Any]) -> Any:
        """Open this face's core on `owner`'s loop thread, to share its executor and leases."""
        self._loop, self._owner = owner._loop, owner  # the owner's loop lives while this face does
        self._core = self._loop.call(opener)
        return self._core

    @property
    def core(self) -> Any:
        """The async object this face runs, for code that mixes sync and async callers."""
        if self._core is None:
            raise ExecutorClosedError(f"this {type(self).__name__} was closed: open a new one to go on")
        return self._core

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    def close(self) -> None:
        """Send what is queued, close the connections and stop the loop thread; idempotent."""
        core, self._core = self._core, None
        try:
            if core is not None:
                self._loop.call(core.close())
        finally:
            if hasattr(self, "_finalizer"):
                self._finalizer()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def run_main(main: Coroutine[Any, Any, T]) -> T:
    """A program's async main from its sync entry point (a command, a worker process), on this
    thread, so its signal handlers are the process's."""
    return asyncio.run(main)


def wait_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """From a thread, the result of `coro` run on `loop`, a running loop of another thread."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def blocking_execute(executor: Executor, loop: Any) -> Any:
    """A sync `execute(sql, params) -> rows` for code running on a thread (schema steps, status
    queries) whose statements go through `executor` on `loop`, which keeps running meanwhile."""
    def execute(sql: str, params: tuple | list = ()) -> list[tuple]:
        return wait_on(loop, executor.execute(Stmt(sql, tuple(params)))).rows

    return execute
