"""The database the durable stores share: one executor for their statements, and `run` for
work that needs a connection of its own, one caller at a time (docs/executor.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from harel_edge import retry
from harel_edge.connection import EdgeConnection
from harel_edge.connection import connect as open_connection
from harel_edge.durable.types import DatabaseClosedError
from harel_edge.executor import Executor, ExecutorClosedError, Result, Stmt, open_executor
from harel_edge.executor.local import file_turn
from harel_edge.loop_thread import wait_on
from harel_edge.schema_step import prepare
from harel_edge.settings import EdgeSettings, ExplicitSettings

T = TypeVar("T")

_CLOSED = "this durable Database was closed: open a new one with harel_edge.durable.connect"


class Database:
    """What `LibsqlCheckpointer` and `LibsqlScheduler` share: one executor, and `run` for connection work.

    `Database(connection)` is a local file (its work on a thread, or inline when short);
    `Database(settings=...)` speaks Hrana.
    """

    def __init__(self, connection: EdgeConnection | None = None, *, settings: EdgeSettings | None = None) -> None:
        if connection is not None and connection.is_remote:  # the caller's; the executor speaks for it
            settings, connection = connection.settings, None
        if connection is None and settings is None:
            raise ValueError("Database needs a local connection or the settings of a remote primary")
        self.connection = connection
        self.settings: EdgeSettings = connection.settings if connection is not None else settings  # type: ignore[union-attr]
        self.guard = asyncio.Lock()  # one caller inside the local connection
        self._turn = file_turn(self.settings.db_path) if connection is not None else None
        self._working: set[asyncio.Future] = set()  # remote work still running, for aclose
        self._closing: asyncio.Future | None = None
        self.closed = False
        self.executor: Executor = open_executor(self.settings, local_runner=self if connection is not None else None)

    def __repr__(self) -> str:  # never the token
        return f"<Database profile={self.profile} executor={self.executor!r}>"

    @property
    def profile(self) -> str:
        return self.settings.profile

    @property
    def is_remote(self) -> bool:
        return self.connection is None

    # ---- statements --------------------------------------------------------------------------

    async def execute(
        self,
        operation: str,
        sql: str,
        args: tuple = (),
        *,
        resolve: Callable[[], Any] | None = None,
    ) -> list[tuple]:
        """One statement as one unit of work, under the retry policy; its rows. A cancelled caller
        cannot know whether it committed (it may still): docs/executor.md, "Cancellation"."""
        if self.closed:
            raise DatabaseClosedError(_CLOSED)

        async def attempt() -> list[tuple]:
            return (await self._unit(self.executor.execute(Stmt(sql, tuple(args))))).rows

        return await retry.acall_with_retry(self.settings, operation, attempt, resolve=resolve)

    async def transaction(
        self, operation: str, stmts: list[Stmt], *, resolve: Callable[[], Any] | None = None
    ) -> list[Result]:
        """Statements as one atomic unit (one request to a remote primary), under the retry
        policy; `resolve` looks up whether an attempt whose outcome is unknown applied. A cancelled
        caller cannot know whether the unit committed (it may still)."""
        if self.closed:
            raise DatabaseClosedError(_CLOSED)

        async def attempt() -> list[Result]:
            return await self._unit(self.executor.transaction(stmts))

        return await retry.acall_with_retry(self.settings, operation, attempt, resolve=resolve)

    async def _unit(self, unit: Any) -> Any:
        try:
            return await unit
        except ExecutorClosedError:
            raise DatabaseClosedError(_CLOSED) from None

    # ---- work with a connection -----------------------------------------------------------------

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(connection, *args)` on a thread, with no other caller inside its connection.

        A cancelled caller unwinds at once; its work still runs to its end (and may commit) before
        the connection is reused, so the caller cannot know what it did: look it up.
        """
        if self.connection is None:
            if self.closed:
                raise DatabaseClosedError(_CLOSED)
            task = asyncio.ensure_future(self._on_stream(work, args))
            self._working.add(task)
            task.add_done_callback(self._working.discard)
            return await asyncio.shield(task)
        await self.guard.acquire()
        try:
            if self.closed:
                raise DatabaseClosedError(_CLOSED)
            task = _on_thread(_in_turn, self._turn, work, self.connection, *args)
        except BaseException:
            self.guard.release()
            raise
        task.add_done_callback(self._let_go)
        return await asyncio.shield(task)

    async def run_inline(self, work: Callable[..., T]) -> T:
        """`run` on the loop's thread, for work that never waits (the executor's lone unit):
        libsql holds the GIL for all of a call, so a thread would only add a hand-off."""
        async with self.guard:
            if self.closed:
                raise DatabaseClosedError(_CLOSED)
            return work(self.connection)

    async def _on_stream(self, work: Callable[..., T], args: tuple) -> T:
        connection = StreamConnection(self.settings, self.executor, asyncio.get_running_loop())
        try:
            return await asyncio.to_thread(work, connection, *args)
        finally:
            await connection.aclose()

    async def _close_remote(self) -> None:
        while self._working:  # a cancelled caller's work runs to its end first
            await asyncio.gather(*self._working, return_exceptions=True)
        await self.executor.aclose()

    def _let_go(self, _task: asyncio.Future[Any]) -> None:
        self.guard.release()

    async def call(
        self,
        operation: str,
        work: Callable[..., T],
        *args: Any,
        resolve: Callable[..., T | None] | None = None,
    ) -> T:
        """`run(work, *args)` under the retry policy: a transient failure repairs the connection
        (a new stream, a rollback) and, if the attempt may have applied, asks `resolve(connection,
        *args)` first whether it did."""
        return await self.run(_attempts, operation, work, args, resolve)

    async def aclose(self) -> None:
        """Send what is queued, wait for the work inside the connection, then close it.

        Never call `connection.close()` yourself: closing the driver under a running statement can crash.
        """
        if self.connection is None:
            if self._closing is None:
                self.closed = True
                self._closing = asyncio.ensure_future(self._close_remote())
            await asyncio.shield(self._closing)
            return
        if self.closed:
            return
        await self.executor.aclose()  # what is queued still commits, through `run`
        await self.guard.acquire()
        try:
            if self.closed:
                self.guard.release()
                return
            self.closed = True
            task = _on_thread(self.connection.close)
        except BaseException:
            self.guard.release()
            raise
        task.add_done_callback(self._let_go)
        await asyncio.shield(task)


class StreamConnection:
    """The connection `Database.run` hands its work on sqld and replica: each statement goes
    over one Hrana stream, sent from the event loop while the work waits on its thread."""

    def __init__(self, settings: EdgeSettings, executor: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        self.profile = settings.profile
        self._executor = executor
        self._loop = loop
        self._session = executor.session()

    def __repr__(self) -> str:  # never the token
        return f"<StreamConnection to {self.settings.server}>"

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        """Once a transaction is open, a statement runs only while the primary keeps it open, so
        what follows a transaction sqld ended is refused instead of committed on its own."""
        return wait_on(self._loop, self._session.execute(Stmt(sql, tuple(params)))).rows

    @property
    def in_transaction(self) -> bool:
        return self._session.in_transaction

    def executemany(self, sql: str, rows: Iterable[tuple | list]) -> None:
        execute_many(self, sql, rows)

    def sync(self) -> None:
        """Nothing to do: every statement here is answered by the primary itself."""

    def recover(self, _error: BaseException) -> None:
        """After a transient error, a new stream: the old one and its transaction are given up."""
        self.reopen()

    def reopen(self) -> None:
        """A new stream (the old one, and any transaction it held, is given up)."""
        old, self._session = self._session, self._executor.session()
        wait_on(self._loop, old.aclose())

    async def aclose(self) -> None:
        await self._session.aclose()

    @property
    def raw(self) -> Any:
        raise AttributeError("a remote Database has no driver connection: use execute()")

    def close(self) -> None:
        raise RuntimeError("close the Database with `await database.aclose()`")


def _in_turn(turn: Any, work: Callable[..., T], *args: Any) -> T:
    """`work`, while no other connection of this process writes the file (`file_turn`)."""
    with turn:
        return work(*args)


def _on_thread(work: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`asyncio.to_thread` as a plain future, not a task: the loop's cancelling of every task
    at its end cannot mark it done (and let the connection go) while the thread still runs it."""
    call = functools.partial(contextvars.copy_context().run, work, *args)
    return asyncio.get_running_loop().run_in_executor(None, call)


def execute_many(connection: Any, sql: str, rows: Iterable[tuple | list]) -> None:
    """`executemany` for connections that have only `execute`: one statement per row, committed
    with the caller's transaction if one is open."""
    for row in rows:
        connection.execute(sql, row)


def _attempts(
    connection: EdgeConnection | StreamConnection,
    operation: str,
    work: Callable[..., T],
    args: tuple,
    resolve: Callable[..., T | None] | None,
) -> T:
    return retry.call_with_retry(
        connection.settings,
        operation,
        lambda: work(connection, *args),
        recover=connection.recover,
        resolve=None if resolve is None else lambda: resolve(connection, *args),
    )


def connect(settings: EdgeSettings | str | os.PathLike[str] | None = None, **overrides: Any) -> Database:
    """Open the Database the durable stores run on, for the profile the settings name.

    `connect(path)` is the local profile on that file and reads nothing from the environment.
    """
    if isinstance(settings, str | os.PathLike):
        settings = ExplicitSettings.load(profile="local", db_path=os.fspath(settings), **overrides)
    elif settings is None:
        settings = EdgeSettings.load(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    if settings.has_primary:
        return Database(settings=settings)
    return Database(open_connection(settings))


async def migrate(database: Database) -> int:
    """Create or upgrade every harel_edge table in this database; returns the version it had.

    Each missing version once, as one unit of work; a newer database raises `SchemaTooNewError` untouched.
    """
    if database.closed:
        raise DatabaseClosedError(_CLOSED)

    # A library face opens the database it is pointed at (`adopt`), as the transport does.
    done = await database._unit(prepare(database.executor, database.settings, adopt=True))
    return done.found
