"""`Statements`: SQL from sync code (the commands, tools) on any profile, one statement or one
transaction at a time, through the profile's executor on the one sync bridge."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from harel_edge import retry
from harel_edge.executor import Executor, Stmt, open_executor
from harel_edge.loop_thread import SyncFace

T = TypeVar("T")


class _Statements:
    """An executor as an object with `close`, so a `SyncFace` can own it."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    async def close(self) -> None:
        await self.executor.aclose()


async def _open_statements(settings: Any) -> _Statements:
    return _Statements(open_executor(settings))


class Statements(SyncFace):
    """The profile's executor for sync code (the CLI's commands, tools): one statement or one
    transaction at a time, each one unit of work (one Hrana request to a remote primary) under
    the retry policy: a command meets the primary's write lock held by a busy worker."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._start("harel-edge-statements", _open_statements(settings))

    def __repr__(self) -> str:  # never the token
        return f"<Statements profile={self.settings.profile}>"

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        stmt = Stmt(sql, tuple(params))
        return self._call(self._retried("statement", lambda: self.core.executor.execute(stmt))).rows

    def execute_once(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        """`execute` without the retry policy: a probe that must answer at once whether the primary is there."""
        return self._call(self.core.executor.execute(Stmt(sql, tuple(params)))).rows

    def run(self, work: Callable[[Executor], Awaitable[T]]) -> T:
        """`work(executor)`, a coroutine of the caller's on this face's executor (the schema step)."""
        return self._call(work(self.core.executor))

    def transaction(self, statements: list[tuple[str, tuple]]) -> list[list[tuple]]:
        units = [Stmt(sql, tuple(params)) for sql, params in statements]
        results = self._call(self._retried("transaction", lambda: self.core.executor.transaction(units)))
        return [result.rows for result in results]

    def _retried(self, operation: str, attempt: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        return retry.acall_with_retry(self.settings, operation, attempt)
