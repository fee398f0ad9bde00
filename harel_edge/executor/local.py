"""A file on this machine: units of work queued together share one commit, so one fsync.

Each unit has a savepoint of its own, so one that fails is undone alone, even one that rolls
back the whole transaction (the others commit without it: docs/executor.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harel_edge.connection import EdgeConnection
from harel_edge.executor.base import (
    CONSTRAINT,
    Coalescing,
    Result,
    StatementError,
    Stmt,
    Unit,
    built,
    waiting,
    with_one_tail,
)
from harel_edge.settings import EdgeSettings

# A lone unit of more statements than this (a large publish) goes to the thread, so that the
# event loop runs between them; a unit of a few short statements is faster without the hand-off.
INLINE_STATEMENTS = 16
_SAVEPOINT = "harel_edge_unit"  # a name a unit's own savepoints are unlikely to take

# One commit at a time per file in this process. libsql holds the GIL while it waits for the
# file's write lock, so a second connection of this process waiting for it would stop the thread
# that holds it from finishing its transaction, and fail with "database is locked" at its busy
# timeout (two executors: the sync faces apart, in two threads). Another process is not stopped.
_FILE_TURNS: dict[str, threading.RLock] = {}
_FILE_TURNS_GUARD = threading.Lock()


def file_turn(path: str) -> threading.RLock:
    """The lock that orders this process's writes to the file at `path` (re-entrant: the durable
    `Database` holds it around work that runs this executor's commits)."""
    if path == ":memory:":
        return threading.RLock()  # a database of its own
    key = os.path.realpath(path)
    with _FILE_TURNS_GUARD:
        return _FILE_TURNS.setdefault(key, threading.RLock())


class LocalExecutor(Coalescing):
    """Units of work for a local file; safe to use from many coroutines of one event loop."""

    commits_share_fsync = True

    def __init__(
        self,
        settings: EdgeSettings,
        *,
        max_units: int = 256,
        linger: float | None = None,
        runner: Any = None,
        connection: EdgeConnection | None = None,
    ) -> None:
        """`runner`: an object whose `async run(work)` (on a thread) and `async run_inline(work)`
        call `work(connection)` with nobody else in that connection (the durable `Database`);
        else `connection` (its owner closes it), else a connection of its own."""
        self.settings = settings
        self._runner = runner
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harel-edge-local")
        self._connection: EdgeConnection | None = connection
        self._owns_connection = connection is None
        self._max_units = max_units
        self._linger = settings.commit_linger if linger is None else linger
        self._start_queue()
        self._on_thread: asyncio.Future | None = None  # the commit running on the thread, if any
        self._turn = file_turn(settings.db_path)
        self.exchanges = 0  # commits made, for benchmarks and tests

    def __repr__(self) -> str:
        return f"<LocalExecutor {self.settings.db_path}>"

    async def execute(self, stmt: Stmt, *, volatile: bool = False) -> Result:
        return await self._submit([stmt], single=True, volatile=volatile)

    async def transaction(self, stmts: list[Stmt]) -> list[Result]:
        if not stmts:
            return []
        return await self._submit(list(stmts), single=False)

    def make_room(self, events: int) -> None:
        """Nothing to do: units queued while a commit runs share the next one, however many."""

    def deferred(self, build: Callable[[], list[Stmt]]) -> asyncio.Future:
        """Volatile alone: what defers its statements is a claim (a lease), as `claim_many`'s are."""
        return self._submit([], single=False, volatile=True, build=build)

    async def _close(self) -> None:
        while self._drain_task is not None and not self._drain_task.done():
            await asyncio.gather(self._drain_task, return_exceptions=True)
        if self._connection is not None and self._owns_connection:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._connection.close)
        self._thread.shutdown(wait=True)

    async def _drain(self) -> None:
        """Commit what is queued until nothing is. Cancelled, it still answers the units it took,
        sends those queued behind them, then ends cancelled: no caller is left waiting."""
        loop = asyncio.get_running_loop()
        cancelled = False
        while self._queue:
            try:
                if self._linger > 0 and waiting(self._queue) > 1:  # under load only: see HranaExecutor
                    await asyncio.sleep(self._linger)
            except asyncio.CancelledError:
                cancelled = True
            units = self._queue[: self._max_units]
            del self._queue[: len(units)]
            units = built(units)
            if not units:
                continue
            try:
                await self._send(loop, units)
            except asyncio.CancelledError:
                cancelled = True  # `_send` saw to these units' answers, or queued them again
            except Exception as exc:  # noqa: BLE001 - the shared commit failed: every unit did
                _settle(units, [exc] * len(units))
        if cancelled:
            raise asyncio.CancelledError

    async def _send(self, loop: asyncio.AbstractEventLoop, units: list[Unit]) -> None:
        """Commit `units` and answer them. A lone, short unit runs on the loop's thread: libsql holds
        the GIL for all of a call, so a thread would only add a hand-off; anything more on a thread
        (docs/executor.md, "A local file: which units go to a thread"). The commit answers its
        units itself, so a cancelled drain strands none; cancelled before it starts, they are queued again."""
        lone = len(units) == 1 or (with_one_tail(units) and not units[0].single)
        inline = lone and sum(len(unit.stmts) for unit in units) <= INLINE_STATEMENTS
        taken = _Once()
        loop_thread = threading.get_ident()

        def work(connection: EdgeConnection) -> None:
            if not taken.take():
                return  # given back to the queue by a cancelled drain
            try:
                outcomes = self._run(connection, units)
            except Exception as exc:  # noqa: BLE001 - the shared commit failed: every unit did
                outcomes = [exc] * len(units)
            if threading.get_ident() == loop_thread:
                _settle(units, outcomes)
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle, units, outcomes)

        try:
            if self._runner is not None:
                await (self._runner.run_inline(work) if inline else self._runner.run(work))
                return
            if self._on_thread is not None and not self._on_thread.done():
                # A commit that a cancelled drain left running on the thread: nothing runs beside it.
                await asyncio.wait([self._on_thread])
            if inline and self._connection is not None:  # opening (with its retries) is for the thread
                work(self._connection)
                return
            self._on_thread = loop.run_in_executor(self._thread, self._run_here, work)
            await asyncio.shield(self._on_thread)
        except asyncio.CancelledError:
            if taken.take():  # the commit never started: its units go first in the next one
                self._queue[:0] = units
            raise

    def _run_here(self, work: Any) -> None:
        if self._connection is None:
            self._connection = EdgeConnection(self.settings)
        work(self._connection)

    def _run(self, connection: EdgeConnection, units: list[Unit]) -> list[Any]:
        """One commit of `units` on `connection`, skipping its fsync when every unit in it is
        volatile (see `EdgeConnection.skip_fsync`)."""
        raw = connection.raw
        self.exchanges += 1
        with self._turn:  # waiting for it releases the GIL; SQLite's busy wait does not
            if raw.in_transaction:  # left open by a failure that could not roll back
                raw.execute("ROLLBACK")
            volatile = all(unit.volatile for unit in units)
            with connection.skip_fsync() if volatile else contextlib.nullcontext():
                return self._commit(raw, units)

    def _commit(self, raw: Any, units: list[Unit]) -> list[Any]:
        """One transaction, a savepoint a unit (a lone unit needs none, and a lone statement is
        its own transaction: fewer statements, same commit). A unit that ends the transaction
        itself (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`) gets its error; the others go again without it."""
        if len(units) == 1:
            return [_run_alone(raw, units[0])]
        if with_one_tail(units) and not units[0].single:
            return _run_with_tail(raw, *units)
        ended: dict[int, StatementError] = {}  # units that rolled back the whole transaction
        while True:
            outcomes = self._try_commit(raw, units, ended)
            if outcomes is not None:
                return [o if isinstance(o, Exception) or not u.single else o[0] for o, u in zip(outcomes, units, strict=True)]

    def _try_commit(self, raw: Any, units: list[Unit], ended: dict[int, StatementError]) -> list[Any] | None:
        """The units not in `ended`, committed together; None (with `ended` grown by one) when a
        unit rolled the transaction back, undoing the units before it."""
        raw.execute("BEGIN IMMEDIATE")
        outcomes: list[Any] = []
        try:
            for index, unit in enumerate(units):
                if index in ended:
                    outcomes.append(ended[index])
                    continue
                raw.execute(f"SAVEPOINT {_SAVEPOINT}")
                try:
                    results = [_run_one(raw, stmt, step) for step, stmt in enumerate(unit.stmts)]
                except _RolledBack as exc:
                    ended[index] = exc.error
                    return None
                except StatementError as exc:
                    raw.execute(f"ROLLBACK TO {_SAVEPOINT}")
                    raw.execute(f"RELEASE {_SAVEPOINT}")
                    outcomes.append(exc)
                    continue
                raw.execute(f"RELEASE {_SAVEPOINT}")
                outcomes.append(results)
            raw.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            raise
        return outcomes


class _Once:
    """Who takes a commit, decided once across threads: its work, or the cancelled drain that
    gives its units back to the queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> bool:
        with self._lock:
            if self._taken:
                return False
            self._taken = True
            return True


def _settle(units: list[Unit], outcomes: list[Any]) -> None:
    for unit, outcome in zip(units, outcomes, strict=True):
        if unit.future.done():
            continue
        if isinstance(outcome, Exception):
            unit.future.set_exception(outcome)
        else:
            unit.future.set_result(outcome)


def _run_alone(raw: Any, unit: Unit) -> Any:
    if unit.single:
        try:
            return _run_one(raw, unit.stmts[0], 0)
        except StatementError as exc:
            return exc
    raw.execute("BEGIN IMMEDIATE")
    try:
        results = [_run_one(raw, stmt, step) for step, stmt in enumerate(unit.stmts)]
        raw.execute("COMMIT")
    except _RolledBack as exc:
        return exc.error
    except StatementError as exc:
        raw.execute("ROLLBACK")
        return exc
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    return results


def _run_with_tail(raw: Any, unit: Unit, tail: Unit) -> list[Any]:
    """`unit` and the one statement of the deferred `tail` in one transaction: a tail that fails
    undoes only itself (a statement's own atomicity), a unit that fails undoes both."""
    raw.execute("BEGIN IMMEDIATE")
    try:
        results = [_run_one(raw, stmt, step) for step, stmt in enumerate(unit.stmts)]
    except _RolledBack as exc:
        return [exc.error, []]
    except StatementError as exc:
        raw.execute("ROLLBACK")
        return [exc, []]
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    try:
        tail_outcome: Any = [_run_one(raw, tail.stmts[0], 0)]
    except _RolledBack as exc:  # the tail took the unit with it: the unit goes again alone
        return [_run_alone(raw, unit), exc.error]
    except StatementError as exc:
        tail_outcome = exc
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    try:
        raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    return [results, tail_outcome]


def _run_one(raw: Any, stmt: Stmt, step: int) -> Result:
    was_in_transaction = raw.in_transaction
    try:
        cursor = raw.execute(stmt.sql, stmt.args)
        rows = cursor.fetchall() if cursor.description else []
    except Exception as exc:  # noqa: BLE001 - the database's own error, for this unit alone
        if _locked(exc):
            raise  # the commit as a whole is retried
        error = StatementError(str(exc), step=step, code=_code(exc))
        if was_in_transaction and not raw.in_transaction:
            raise _RolledBack(error) from None
        raise error from None
    return Result(rows=[tuple(r) for r in rows], affected=max(cursor.rowcount, 0), last_rowid=cursor.lastrowid)


class _RolledBack(Exception):  # noqa: N818 - a signal inside this module, never seen outside
    """A statement failed and SQLite rolled back the whole transaction with it (decided by the
    connection's state, never by words a statement's own error may contain)."""

    def __init__(self, error: StatementError) -> None:
        super().__init__(str(error))
        self.error = error


def _code(exc: Exception) -> str | None:
    """The result code the primary would send. The libsql driver raises a bare ValueError holding
    only SQLite's message, whose constraint form ("UNIQUE constraint failed: ...") is fixed."""
    return CONSTRAINT if " constraint failed" in str(exc) else None


def _locked(exc: Exception) -> bool:
    """The file is locked by another connection: every unit of the commit is retried."""
    return str(exc).lower().startswith(("database is locked", "database table is locked"))
