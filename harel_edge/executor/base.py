"""What every executor takes and gives (statements, results, their errors, the `Executor`
protocol) and the helpers their coalescing shares: the executors' lowest layer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from harel_edge.errors import HarelEdgeError

Value = None | int | float | str | bytes


@dataclass(frozen=True)
class Stmt:
    """One SQL statement and its positional arguments."""

    sql: str
    args: tuple[Value, ...] = ()


@dataclass
class Result:
    """What one statement returned: its rows, how many rows it changed, and, from a remote
    primary, the replication index a replica must reach to see this write."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    affected: int = 0
    last_rowid: int | None = None
    replication_index: int | None = None


CONSTRAINT = "SQLITE_CONSTRAINT"  # the primary's code for a constraint refused (UNIQUE, CHECK, NOT NULL, ...)


class StatementError(RuntimeError):
    """A statement of a unit failed (the database's own error): the unit changed nothing. `code`
    is SQLite's primary result code by name (`SQLITE_CONSTRAINT`), where it is known."""

    def __init__(self, message: str, *, step: int = 0, code: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.code = code

    @property
    def refused_by_a_constraint(self) -> bool:
        return self.code is not None and self.code.startswith(CONSTRAINT)


class ClosesOnce:
    """`aclose` that a cancelled caller cannot leave half done: one closing task (`_close`),
    which every caller waits for."""

    closed = False
    _closing: Any = None

    async def aclose(self) -> None:
        if self._closing is None:
            self.closed = True
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        raise NotImplementedError


class ExecutorClosedError(HarelEdgeError):
    """A unit of work was given to an executor after it was closed."""


@dataclass
class Unit:
    """One caller's work in an executor's queue: one statement alone (`single`) or a transaction."""

    future: asyncio.Future
    single: bool
    stmts: list[Stmt]
    volatile: bool = False  # a claim's lease: a local commit of it alone need not wait for its fsync
    build: Callable[[], list[Stmt]] | None = None  # a deferred unit's statements, made when it is sent
    tail: bool = False  # a deferred unit, made: it runs after the others
    alone: bool = False  # sent as its own request, never in a shared transaction
    refused: int = 0  # shared transactions that could not begin: the primary's write lock was held

    @property
    def statements(self) -> int:
        """0 for a single execute, else the transaction's statement count."""
        return 0 if self.single else len(self.stmts)


class Coalescing(ClosesOnce):
    """What both executors share: callers' units queued while others are on their way, and one
    drain at a time (`_drain`, each executor's own) taking them off in batches."""

    def _start_queue(self) -> None:
        self._queue: list[Unit] = []
        self._draining = False
        self._drain_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    def _submit(
        self, stmts: list[Stmt], *, single: bool = False, volatile: bool = False, build: Callable[[], list[Stmt]] | None = None
    ) -> asyncio.Future:
        if self.closed:
            raise ExecutorClosedError(f"{self!r} was closed: open a new transport or store to go on")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(Unit(future, single, stmts, volatile, build))
        if not self._draining:
            self._start_drain()
        return future

    def _start_drain(self) -> None:
        self._draining = True
        self._drain_task = self._spawn(self._drain())
        self._drain_task.add_done_callback(self._drained)

    def _drained(self, _task: asyncio.Task) -> None:
        """A drain cancelled before it began leaves its units queued: another one sends them."""
        self._draining = False
        if self._queue:
            self._start_drain()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _drain(self) -> None:
        raise NotImplementedError


class Executor(Protocol):
    """Runs units of work for one profile's database.

    A unit once given is sent even if its caller is cancelled, and a cancelled caller cannot know
    whether it committed: look it up (nothing is applied twice). docs/executor.md, "Cancellation".
    """

    closed: bool
    # Units queued together share one fsync (a local file): callers gain by queueing at once.
    commits_share_fsync: bool

    async def execute(self, stmt: Stmt, *, volatile: bool = False) -> Result:
        """One statement, committed on its own; `volatile`: a power cut may undo it harmlessly
        (a lease), so a local file need not fsync it."""

    async def transaction(self, stmts: list[Stmt]) -> list[Result]:
        """All statements or none; a failing one raises `StatementError` naming its index.
        Cancelled, the caller cannot know which: the unit may still commit."""

    def deferred(self, build: Callable[[], list[Stmt]]) -> asyncio.Future:
        """A transaction whose statements `build` makes (on the loop) when the commit or exchange
        that carries it is put together, run after every other unit in it; the future's result
        is its statements' results, or [] when `build` made none (then nothing is sent)."""

    def make_room(self, events: int) -> None:
        """A worker keeps `events` in flight: a primary's executor keeps enough exchanges in
        flight to carry them (never fewer than before); a local file needs nothing."""

    async def aclose(self) -> None:
        """Send what is queued, then release connections."""


def built(units: list[Any]) -> list[Any]:
    """The units of one commit or exchange, the deferred ones (`Executor.deferred`) made now and
    put last; one that makes no statement is answered [] and left out, one whose `build` raised
    gets the error."""
    ready, last = [], []
    for unit in units:
        build, unit.build = unit.build, None
        if build is None:
            ready.append(unit)
            continue
        try:
            stmts = build()
        except Exception as exc:  # noqa: BLE001 - handed to the unit's caller
            if not unit.future.done():
                unit.future.set_exception(exc)
            continue
        if not stmts:
            if not unit.future.done():
                unit.future.set_result([])
            continue
        unit.stmts, unit.tail = stmts, True
        last.append(unit)
    return ready + last


def waiting(units: list[Any]) -> int:
    """Units queued by callers: a deferred unit goes with them, and is no reason to linger."""
    return sum(1 for unit in units if unit.build is None and not unit.tail)


def with_one_tail(units: list[Any]) -> bool:
    """A lone transaction and the one-statement deferred unit after it (a commit and its claim):
    one transaction with no savepoint, since a failing statement undoes only itself, and the
    unit's failure undoes both."""
    return len(units) == 2 and units[1].tail and len(units[1].stmts) == 1 and not units[0].tail
