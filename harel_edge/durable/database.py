"""One libSQL connection shared by the durable stores, and the lock that keeps one caller in it.

Why a lock when asyncio already runs one coroutine at a time: every driver call goes to a
thread (the driver blocks, and on the local profile a commit is an fsync), so a coroutine
awaiting its statement lets others run, and they would reach the same connection. A
transaction belongs to the connection, not to the caller that opened it: a statement from a
second caller arriving while the first is between BEGIN IMMEDIATE and COMMIT would be
committed or rolled back with somebody else's work. The guard keeps a single caller inside.

Why it is not simply `async with guard`: see `Database.run`. Cancellation is the hard part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harel_edge import retry, schema
from harel_edge.connection import EdgeConnection
from harel_edge.connection import connect as open_connection
from harel_edge.durable.types import DatabaseClosedError
from harel_edge.settings import EdgeSettings

T = TypeVar("T")


@dataclass(eq=False)
class Database:
    """The connection the checkpoint store and the scheduler share, used one caller at a time.

    Share one `Database` between `LibsqlCheckpointer` and `LibsqlScheduler`: `LibsqlDurable`
    checks it, because its one-commit operations are only one commit on one connection.
    Close it with `aclose`, never with `connection.close()` (see there).
    """

    connection: EdgeConnection
    guard: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    closed: bool = field(default=False, init=False)

    @property
    def profile(self) -> str:
        return self.connection.profile

    @property
    def is_remote(self) -> bool:
        return self.connection.is_remote

    async def run(self, work: Callable[[EdgeConnection], T]) -> T:
        """Run `work(connection)` on a thread, with no other caller inside the connection.

        A thread cannot be cancelled. If the guard were released when this coroutine unwinds,
        cancelling a caller would hand the connection to the next caller while the cancelled
        one's statement (perhaps a BEGIN IMMEDIATE transaction) is still running, and the next
        caller's write would land inside that transaction and share its fate: reported as
        written, then rolled back. So the work runs as a task of its own; the caller awaits a
        shield of it, which lets the caller be cancelled at once without touching the task;
        and the guard is let go by the task's done-callback, when the thread has returned.

        The shield also keeps a failure visible: if the work fails after its caller left, the
        task's exception goes to the event loop's exception handler instead of nowhere.
        """
        await self.guard.acquire()
        try:
            if self.closed:
                raise DatabaseClosedError(
                    "this durable Database was closed: open a new one with harel_edge.durable.connect"
                )
            task = asyncio.ensure_future(asyncio.to_thread(work, self.connection))
        except BaseException:
            self.guard.release()
            raise
        task.add_done_callback(self._let_go)
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        """Close the connection once the caller inside it (if any) has finished.

        Never call `connection.close()` directly: a cancelled caller's statement may still be
        running on its thread (that is what `run` allows), and closing the driver's connection
        under it frees memory the statement is using, which can crash the process instead of
        raising. Taking the guard waits for that statement, since `run` lets go of the guard
        only when its thread returns. The wait is as long as the statement: a hung effect
        holds it. If this coroutine is cancelled while waiting, the connection stays open.

        The close runs on a thread like any other driver call (on the local profile it
        checkpoints the WAL and fsyncs), with the same handshake as `run`, so cancelling the
        caller mid-close does not let a `run` in before the close is done; a `run` after it
        raises `DatabaseClosedError`.
        """
        await self.guard.acquire()
        try:
            if self.closed:
                self.guard.release()
                return
            self.closed = True
            task = asyncio.ensure_future(asyncio.to_thread(self.connection.close))
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
        work: Callable[[EdgeConnection], T],
        *,
        resolve: Callable[[EdgeConnection], T | None] | None = None,
    ) -> T:
        """`run(work)` under the retry policy of `harel_edge.retry`, inside the one thread call.

        A transient failure (the link to the primary, sqld's expiries, a busy file) is retried
        after repairing the connection: a dead remote stream is reopened, a transaction left
        open is rolled back, a replica is synced. When an attempt may have reached the primary
        before failing, `resolve` is asked first whether it took effect (its result then is
        the operation's). The guard stays held across the attempts: nothing else could use
        the connection meanwhile anyway.
        """

        def attempts(connection: EdgeConnection) -> T:
            return retry.call_with_retry(
                connection.settings,
                operation,
                lambda: work(connection),
                recover=lambda error: _recover(connection, error),
                resolve=None if resolve is None else lambda: resolve(connection),
            )

        return await self.run(attempts)


def _recover(connection: EdgeConnection, error: BaseException) -> None:
    """Make the connection usable again after `error`, before anything else is sent."""
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


def connect(settings: EdgeSettings | None = None, **overrides: Any) -> Database:
    """Open the Database the durable stores run on, for the profile the settings name.

    The connection comes from `harel_edge.connection`, so the stores and the transport agree
    on what each profile promises. On the local profile that is WAL (a status query does not
    block a pass mid-transaction), `synchronous=FULL` by default (a record that returned
    survives power loss, which every exactly-once argument here assumes) and a busy timeout
    (a second process waits for the write lock instead of failing). On sqld and replica the
    durability is the primary's: a write is acknowledged once the primary committed it to its
    own WAL, and a replica's writes are all delegated to the primary.

    `connect()` reads the environment; keywords override single settings.
    """
    if settings is None:
        settings = EdgeSettings.load(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    return Database(open_connection(settings))


async def migrate(database: Database) -> int:
    """Create or upgrade every harel_edge table in this database; returns the version it had.

    Safe from every process at every start: each statement is idempotent, and a database
    written by a newer harel_edge is refused with `SchemaTooNewError` before anything changes.
    """
    prefix = database.connection.settings.prefix
    return await database.call(
        "durable.migrate", lambda connection: schema.migrate(connection.execute, prefix)
    )
