"""One libSQL connection shared by the durable stores, and the lock that keeps one caller in it.

Why a lock when asyncio already runs one coroutine at a time: every driver call runs somewhere
else (a thread, or a worker process), so a coroutine awaiting its statement lets others run,
and they would reach the same connection. A transaction belongs to the connection, not to the
caller that opened it: a statement from a second caller arriving while the first is between
BEGIN IMMEDIATE and COMMIT would be committed or rolled back with somebody else's work. The
guard keeps a single caller inside.

Where the connection lives depends on the profile (`connect` decides):

- `local`: in this process, reached on a thread. A local statement is file I/O, short, and
  releases the GIL; a thread is the cheapest way to it.
- `sqld` and `replica`: in a worker process (`harel_edge.procpool.ProcessPool` of size 1). The
  driver holds the GIL for the whole of a network round trip (docs/executor.md), so on a thread every
  statement would freeze the event loop for a round trip to the primary. In another process
  it costs the loop nothing. A work function that can be pickled (every operation of the
  stores is one: a module-level function and plain arguments) is sent whole, retries
  included, so one operation is one request and a `BEGIN IMMEDIATE ... COMMIT` runs start to
  end inside the worker. One that cannot (a lambda, a closure) runs here on a thread, and
  each of its statements is a request to the same worker; the guard still keeps every other
  caller out of the connection until it returns.
- On sqld, operations that need no transaction (every operation of the stores except
  `transact`: each is one statement decided by the primary) may also run on spare worker
  processes, each with its own connection, when the main one is busy: that is what lets
  several operations of one `Database` be in flight at once. A replica does not do this,
  since each spare would need its own replica file, and a `Database` would then stop reading
  its own writes from its file.

Why it is not simply `async with guard`: see `Database.run`. Cancellation is the hard part.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harel_edge import retry, schema
from harel_edge.connection import EdgeConnection
from harel_edge.connection import connect as open_connection
from harel_edge.durable.types import DatabaseClosedError
from harel_edge.procpool import PoolClosedError, ProcessPool, WorkerProcessError, execute
from harel_edge.procpool import open_connection as open_in_worker
from harel_edge.settings import EdgeSettings, ExplicitSettings

T = TypeVar("T")

log = logging.getLogger(__name__)

_CLOSED = "this durable Database was closed: open a new one with harel_edge.durable.connect"


@dataclass(eq=False)
class Database:
    """The connection the checkpoint store and the scheduler share, used one caller at a time.

    Share one `Database` between `LibsqlCheckpointer` and `LibsqlScheduler`: `LibsqlDurable`
    checks it, because its one-commit operations are only one commit on one connection.
    Close it with `aclose`, never with `connection.close()` (see there).

    `Database(connection)` runs the connection on a thread of this process (the local design;
    any profile). `connect(settings)` builds the one the profile calls for.
    """

    connection: EdgeConnection | RemoteConnection
    guard: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    closed: bool = field(default=False, init=False)
    _home: ProcessPool | None = field(default=None, init=False, repr=False)
    _spare: ProcessPool | None = field(default=None, init=False, repr=False)

    @classmethod
    def in_process(cls, settings: EdgeSettings, *, spares: int = 0) -> Database:
        """A Database whose connection lives in a worker process, started at the first call.

        `spares` more processes (each its own connection) take operations that need no
        transaction while the main one is busy; only on the sqld profile (see the module doc).
        """
        if spares < 0:
            raise ValueError(f"spares must be 0 or more, got {spares!r}")
        database = cls(RemoteConnection(settings))
        database._home = ProcessPool(
            functools.partial(open_in_worker, settings), size=1, name="harel-edge-durable"
        )
        if spares and settings.profile == "sqld":
            database._spare = ProcessPool(
                functools.partial(open_in_worker, settings), size=spares, name="harel-edge-durable-spare"
            )
        return database

    @property
    def profile(self) -> str:
        return self.connection.profile

    @property
    def is_remote(self) -> bool:
        return self.connection.is_remote

    @property
    def processes(self) -> int:
        """Worker processes running now (0 when the connection is on a thread)."""
        return sum(pool.live for pool in (self._home, self._spare) if pool is not None)

    async def start(self) -> None:
        """Open the connection now (in its worker process), so bad settings fail here rather
        than at the first operation. Nothing to do when the connection is on a thread."""
        if self._home is not None:
            await self._home.start()

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(connection, *args)` with no other caller inside the connection.

        Neither a thread nor a worker's statement can be cancelled. If the guard were released
        when this coroutine unwinds, cancelling a caller would hand the connection to the next
        caller while the cancelled one's statement (perhaps a BEGIN IMMEDIATE transaction) is
        still running, and the next caller's write would land inside that transaction and
        share its fate: reported as written, then rolled back. So the work runs as a task of
        its own; the caller awaits a shield of it, which lets the caller be cancelled at once
        without touching the task; and the guard is let go by the task's done-callback, when
        the work has returned.

        The shield also keeps a failure visible: if the work fails after its caller left, the
        task's exception goes to the event loop's exception handler instead of nowhere.
        """
        await self.guard.acquire()
        try:
            if self.closed:
                raise DatabaseClosedError(_CLOSED)
            if self._home is None:
                task = asyncio.ensure_future(asyncio.to_thread(work, self.connection, *args))
            else:
                task = asyncio.ensure_future(self._in_worker(work, args))
        except BaseException:
            self.guard.release()
            raise
        task.add_done_callback(self._let_go)
        return await asyncio.shield(task)

    async def _in_worker(self, work: Callable[..., T], args: tuple) -> T:
        """The work whole in the worker if it travels; else here, statements sent one by one."""
        assert self._home is not None
        blob = _pickled(work, args)
        if blob is not None:
            result = await self._home.run(_load_and_run, blob)
            if not isinstance(result, _Unloadable):
                return result
        remote = self.connection.bound(self._home, asyncio.get_running_loop())
        return await asyncio.to_thread(work, remote, *args)

    async def aclose(self) -> None:
        """Close the connection once the caller inside it (if any) has finished.

        Never call `connection.close()` directly: a cancelled caller's statement may still be
        running on its thread (that is what `run` allows), and closing the driver's connection
        under it frees memory the statement is using, which can crash the process instead of
        raising. Taking the guard waits for that statement, since `run` lets go of the guard
        only when its work returns. The wait is as long as the statement: a hung effect
        holds it. If this coroutine is cancelled while waiting, the connection stays open.

        The close runs off the loop like any other driver call (on the local profile it
        checkpoints the WAL and fsyncs; in a worker process it waits for the spares' calls in
        flight, then closes each connection and reaps each process), with the same handshake
        as `run`, so cancelling the caller mid-close does not let a `run` in before the close
        is done; a `run` after it raises `DatabaseClosedError`.
        """
        await self.guard.acquire()
        try:
            if self.closed:
                self.guard.release()
                return
            self.closed = True
            if self._home is None:
                task = asyncio.ensure_future(asyncio.to_thread(self.connection.close))
            else:
                pools = [pool for pool in (self._home, self._spare) if pool is not None]
                task = asyncio.ensure_future(asyncio.gather(*(pool.close() for pool in pools)))
        except BaseException:
            self.guard.release()
            raise
        task.add_done_callback(self._let_go)
        await asyncio.shield(task)

    def _let_go(self, _task: asyncio.Future[Any]) -> None:
        self.guard.release()

    async def call(
        self,
        operation: str,
        work: Callable[..., T],
        *args: Any,
        resolve: Callable[..., T | None] | None = None,
        any_connection: bool = False,
    ) -> T:
        """`run(work, *args)` under the retry policy of `harel_edge.retry`, as one call.

        A transient failure (the link to the primary, sqld's expiries, a busy file) is retried
        after repairing the connection: a dead remote stream is reopened, a transaction left
        open is rolled back, a replica is synced. When an attempt may have reached the primary
        before failing, `resolve(connection, *args)` is asked first whether it took effect (its
        result then is the operation's). The attempts run where the connection is (in its
        worker process, when `work` can be pickled), and the guard stays held across them:
        nothing else could use the connection meanwhile anyway.

        `any_connection=True` says the work opens no transaction and needs no particular
        connection (one statement, or reads): on sqld it then runs on a spare worker process
        when the main connection is busy, so such operations overlap.
        """
        if any_connection and self._spare is not None and self.guard.locked():
            if self.closed:
                raise DatabaseClosedError(_CLOSED)
            blob = _pickled(_attempts, (operation, work, args, resolve))
            if blob is not None:
                try:
                    result = await self._spare.run(_load_and_run, blob)
                except PoolClosedError:
                    raise DatabaseClosedError(_CLOSED) from None
                if not isinstance(result, _Unloadable):
                    return result
        return await self.run(_attempts, operation, work, args, resolve)


class RemoteConnection:
    """The connection of a `Database` whose driver connection lives in a worker process.

    Outside `run` it only carries the settings (and `profile`, `is_remote`). Inside a `run`
    whose work could not be pickled, the work gets one bound to the worker: it runs on a thread
    here, and each `execute`, `sync`, ... is a request to the worker, waited for on that thread
    while the event loop does the talking. Every request of one `run` must reach the same
    worker process: if it was replaced (the first one died), the transaction it held is gone,
    and the call fails instead of sending the rest of the transaction to a fresh connection.
    """

    def __init__(
        self,
        settings: EdgeSettings,
        pool: ProcessPool | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.settings = settings
        self.profile: str = settings.profile or "local"
        self._pool = pool
        self._loop = loop
        self._pid: int | None = None

    def __repr__(self) -> str:  # never the token
        where = self.settings.server or self.settings.db_path
        return f"<RemoteConnection profile={self.profile} at {where}>"

    def bound(self, pool: ProcessPool, loop: asyncio.AbstractEventLoop) -> RemoteConnection:
        return RemoteConnection(self.settings, pool, loop)

    @property
    def is_remote(self) -> bool:
        return self.profile in ("sqld", "replica")

    def ask(self, work: Callable[..., T], *args: Any) -> T:
        """`work(connection, *args)` in the worker, from a thread of this process."""
        if self._pool is None or self._loop is None:
            raise RuntimeError(
                "this connection lives in a worker process: reach it through Database.run(work)"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("a RemoteConnection call would block the event loop: use Database.run")
        request = self._pool.run(_pinned, self._pid, work, args)
        pid, value = asyncio.run_coroutine_threadsafe(request, self._loop).result()
        self._pid = pid
        return value

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        return self.ask(execute, sql, params)

    def executemany(self, sql: str, rows: Iterable[tuple | list]) -> None:
        """All the rows in one request to the worker, each one statement there."""
        self.ask(execute_many, sql, [tuple(row) for row in rows])

    def sync(self) -> None:
        self.ask(_sync)

    def reopen(self) -> None:
        self.ask(_reopen)

    @property
    def in_transaction(self) -> bool:
        return self.ask(_in_transaction)

    @property
    def raw(self) -> Any:
        raise AttributeError(
            "the driver's connection lives in a worker process; pass Database.run a module-level "
            "function (picklable) to run next to it"
        )

    def close(self) -> None:
        raise RuntimeError("close the Database with `await database.aclose()`")


# ---- what runs next to the connection (in its worker process, or on the thread) ------------


class _Unloadable:
    """The worker could not unpickle the work (pickled by reference to a module it cannot
    import, such as a test module loaded by path): nothing ran, so it runs here instead."""


def _pickled(work: Callable[..., Any], args: tuple) -> bytes | None:
    try:
        return pickle.dumps((work, args))
    except Exception:  # noqa: BLE001 - a lambda, a closure, an open resource: it stays here
        return None


def _load_and_run(connection: EdgeConnection, blob: bytes) -> Any:
    try:
        work, args = pickle.loads(blob)
    except Exception:  # noqa: BLE001
        return _Unloadable()
    return work(connection, *args)


def _pinned(
    connection: EdgeConnection, pid: int | None, work: Callable[..., T], args: tuple
) -> tuple[int, T]:
    if pid is not None and pid != os.getpid():
        raise WorkerProcessError(
            f"the durable Database's worker process {pid} exited in the middle of a call; what it "
            "had sent (an open transaction included) may or may not have taken effect"
        )
    return os.getpid(), work(connection, *args)


def execute_many(
    connection: EdgeConnection | RemoteConnection, sql: str, rows: Iterable[tuple | list]
) -> None:
    """`executemany` for connections that have only `execute` (EdgeConnection does not wrap the
    driver's): one statement per row, committed with the caller's transaction if one is open."""
    for row in rows:
        connection.execute(sql, row)


def _sync(connection: EdgeConnection) -> None:
    connection.sync()


def _reopen(connection: EdgeConnection) -> None:
    connection.reopen()


def _in_transaction(connection: EdgeConnection) -> bool:
    return connection.in_transaction


def _attempts(
    connection: EdgeConnection | RemoteConnection,
    operation: str,
    work: Callable[..., T],
    args: tuple,
    resolve: Callable[..., T | None] | None,
) -> T:
    return retry.call_with_retry(
        connection.settings,
        operation,
        lambda: work(connection, *args),
        recover=lambda error: _recover(connection, error),
        resolve=None if resolve is None else lambda: resolve(connection, *args),
    )


def _recover(connection: EdgeConnection | RemoteConnection, error: BaseException) -> None:
    """Make the connection usable again after `error`, before anything else is sent."""
    if isinstance(connection, RemoteConnection):
        connection.ask(_recover, error)
        return
    if connection.raw is None or retry.needs_reopen(error):
        connection.reopen()
        return
    if connection.raw.in_transaction:
        try:
            connection.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - a stream that cannot roll back is replaced
            connection.reopen()
            return
    connection.sync()


def _migrate(connection: EdgeConnection, prefix: str) -> int:
    return schema.migrate(connection.execute, prefix)


def connect(settings: EdgeSettings | str | os.PathLike[str] | None = None, **overrides: Any) -> Database:
    """Open the Database the durable stores run on, for the profile the settings name.

    The connection comes from `harel_edge.connection`, so the stores and the transport agree
    on what each profile promises. On the local profile that is WAL (a status query does not
    block a pass mid-transaction), `synchronous=FULL` by default (a record that returned
    survives power loss, which every exactly-once argument here assumes) and a busy timeout
    (a second process waits for the write lock instead of failing). On sqld and replica the
    durability is the primary's: a write is acknowledged once the primary committed it to its
    own WAL, and a replica's writes are all delegated to the primary.

    Where the connection lives: on the local profile, in this process (opened now, used on a
    thread). On sqld and replica, in a worker process started at the first call (or by
    `await database.start()`), so round trips never freeze the event loop; on sqld up to
    `async_processes - 1` spare processes take operations that need no transaction while the
    main one is busy. `async_processes=0` keeps the connection in this process on those
    profiles too (the thread design), and so does a daemonic process (`Process(daemon=True)`),
    which multiprocessing does not let start children. A worker process is spawned, so a program that uses
    this needs the usual `if __name__ == "__main__":` guard around its start.

    `connect()` reads the environment; keywords override single settings. `connect(path)` (a str
    or a Path) is the local profile on that file, and reads nothing from the environment.
    """
    if isinstance(settings, str | os.PathLike):
        settings = ExplicitSettings.load(profile="local", db_path=os.fspath(settings), **overrides)
    elif settings is None:
        settings = EdgeSettings.load(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    if settings.profile in ("sqld", "replica") and settings.async_processes > 0:
        if not multiprocessing.current_process().daemon:
            return Database.in_process(settings, spares=settings.async_processes - 1)
        # A daemonic process may not have children (multiprocessing refuses to start them).
        log.warning(
            "durable Database in a daemonic process: its connection stays on a thread here, "
            "and each round trip to the primary pauses the event loop"
        )
    return Database(open_connection(settings))


async def migrate(database: Database) -> int:
    """Create or upgrade every harel_edge table in this database; returns the version it had.

    Safe from every process at every start: each statement is idempotent, and a database
    written by a newer harel_edge is refused with `SchemaTooNewError` before anything changes.
    """
    prefix = database.connection.settings.prefix
    return await database.call("durable.migrate", _migrate, prefix)
