"""Run blocking driver calls on a thread, one at a time, safely under cancellation.

The libsql driver is synchronous, so the async classes reach it through a thread. One
connection admits one caller at a time, because a transaction belongs to the connection: a
statement from a second caller arriving mid-`BEGIN IMMEDIATE` would be committed or rolled
back with somebody else's transaction.

The subtle part is cancellation. A thread cannot be cancelled: when the awaiting coroutine is
cancelled, it unwinds at once while its statement runs on. If the lock were released by the
coroutine (`async with lock:`), the next caller would enter the connection while the last
statement is still in it. So the work runs as a task, the caller awaits a *shield* of it, and
the lock is released by the task's done-callback: when the thread has really finished. A
failure that nobody is left to receive is handed to the loop's exception handler by the
shield, so it reaches the log instead of vanishing.

`close` takes the same lock, so closing waits for the statement in flight: closing a libsql
connection under a running statement is a use-after-free in the driver.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class OneAtATime:
    """A lock around a blocking resource, released by the work finishing, not by its caller."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `work(*args, **kwargs)` on a thread with nobody else inside the resource."""
        await self._lock.acquire()
        try:
            task = asyncio.ensure_future(asyncio.to_thread(functools.partial(work, *args, **kwargs)))
        except BaseException:
            self._lock.release()
            raise
        task.add_done_callback(lambda _: self._lock.release())
        return await asyncio.shield(task)

    async def close(self, closer: Callable[[], Any]) -> None:
        """Run `closer` once nobody is inside; a later `run` then fails on the closed resource."""
        async with self._lock:
            await asyncio.to_thread(closer)
