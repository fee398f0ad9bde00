"""EdgeStore: harel's execution store on the same libSQL connection, settings and profiles as
the transport.

Why not harel's own `LibsqlStore` as it is. Run through harel's store contracts
(`harel.testing`: listing, purge, outbox) it passes on a local file and on an embedded replica,
and on sqld only without authentication: its constructor hands the auth token to libsql only
together with a `sync_url`, so a direct connection to an authenticating sqld or Turso fails with
401 before the first query. Beyond the contracts, a deployment needs what they do not test:

- on a replica its reads are local and never synced, so a worker loading an execution that
  another edge created sees None, and harel's worker then acknowledges (drops) the event;
- it opens libsql in its default DEFERRED mode (implicit transactions that
  hold the primary's write lock and are rolled back by sqld's timeout) with no WAL and no
  busy timeout on a local file, and it has no retry policy for a flaky link;
- its connection is its own, so a worker running it beside the transport has two writers in
  one process, which on a local file stall each other for the whole busy timeout (the driver
  holds the GIL while it waits for the lock).

So `EdgeStore` keeps harel's SQL (it subclasses `LibsqlStore` and calls its methods, which
keeps the contracts' behaviour and picks up harel's fixes) and changes how it reaches the
database: an `EdgeConnection` built from `EdgeSettings` (the token on every profile, WAL and
synchronous=FULL locally), explicit `BEGIN IMMEDIATE` transactions, a sync before the reads
a worker decides on when the data is a replica, and `retry.py`'s policy around every
operation. A commit whose outcome was lost on the way back from the primary is looked up
before it is tried again: the execution row carries the exact JSON that was written.

The connection may be shared (the worker shares one between transport, store and durable
stores); the caller then serializes use of it, as `AsyncEdgeStore` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from harel.engine.execution import Execution
from harel.engine.schema import Names, store_schema
from harel.engine.store import LibsqlStore

from harel_edge import observability, retry, schema, store_sql
from harel_edge.connection import EdgeConnection
from harel_edge.errors import SchemaError
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.store")
T = TypeVar("T")


def store_tables(prefix: str) -> list[str]:
    """harel's execution-store tables under `prefix`, as harel creates them for SQLite."""
    return list(store_schema("sqlite", prefix))


class _Driver:
    """What `LibsqlStore`'s methods call `self._conn`: the shared connection's driver object.

    Looked up on every call, because a reopen (after a dead remote stream) replaces it.
    `commit` and `rollback` only act inside a transaction: with `isolation_level=None` a
    statement outside one has already committed, and a rollback after a failed delegated
    transaction raises on a replica although nothing is left to undo (docs/operations.md).
    """

    def __init__(self, edge: EdgeConnection) -> None:
        self._edge = edge

    def execute(self, sql: str, params: tuple | list = ()) -> Any:
        return self._edge.raw.execute(sql, tuple(params))

    def commit(self) -> None:
        if self._edge.in_transaction:
            self._edge.raw.commit()

    def rollback(self) -> None:
        try:
            if self._edge.in_transaction:
                self._edge.raw.rollback()
        except Exception:  # noqa: BLE001 - a failed transaction is rolled back; see the class doc
            pass

    def close(self) -> None:
        self._edge.close()


class EdgeStore(LibsqlStore):
    """harel's `ExecutionStore` on an `EdgeConnection` (see the module doc for why)."""

    def __init__(
        self,
        settings: EdgeSettings | None = None,
        *,
        connection: EdgeConnection | None = None,
        create_schema: bool = True,
    ) -> None:
        # LibsqlStore.__init__ is not called: it would open a connection of its own.
        self._edge = connection if connection is not None else EdgeConnection(settings or EdgeSettings.load())
        self._owns_connection = connection is None
        self.settings = self._edge.settings
        self._n = Names(self.settings.prefix)
        self._conn = _Driver(self._edge)
        self.trace_max = store_sql.TRACE_MAX
        try:
            if create_schema:
                self._retry("store.schema", self._create_tables)
            else:
                self._check_tables()
        except BaseException:
            if self._owns_connection:
                self._edge.close()
            raise

    def __repr__(self) -> str:
        return f"<EdgeStore prefix={self.settings.prefix} {self._edge!r}>"

    @property
    def connection(self) -> EdgeConnection:
        return self._edge

    # ---- reads: a replica syncs first, so a worker never decides on another edge's past ----

    def load(self, execution_id: str) -> Execution | None:
        return self._read("store.load", lambda: LibsqlStore.load(self, execution_id))

    def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        return self._read("store.load", lambda: LibsqlStore.load_for_event(self, execution_id, event_id))

    def list_executions(self, **filters: Any) -> Any:
        return self._read("store.list", lambda: LibsqlStore.list_executions(self, **filters))

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        return self._read(
            "store.is_processed", lambda: LibsqlStore.is_processed(self, execution_id, event_id)
        )

    def pending_outbox(self) -> list:
        return self._read("store.outbox", lambda: LibsqlStore.pending_outbox(self))

    def pending_spawns(self) -> list:
        return self._read("store.spawns", lambda: LibsqlStore.pending_spawns(self))

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return self._read("store.timers", lambda: LibsqlStore.due_timers(self, now))

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self._read("store.ids", lambda: LibsqlStore.ids_with_prefix(self, prefix))

    def read_trace(self, execution_id: str) -> list[dict]:
        return self._read("store.trace", lambda: LibsqlStore.read_trace(self, execution_id))

    # ---- writes: one explicit transaction each, looked up after an unknown outcome --------

    def save(self, exe: Execution) -> None:
        old, data = exe.version, _as_written(exe)
        self._retry(
            "store.save",
            lambda: self._in_transaction(lambda: LibsqlStore.save(self, exe)) or True,
            resolve=lambda: self._written(exe, old, data) or None,
        )

    def commit(
        self,
        exe: Execution,
        emits: list,
        processed_event_id: str | None = None,
        timers: tuple = (),
        spawns: tuple = (),
        trace: dict | None = None,
        step: Any = None,
    ) -> list[int]:
        old, data = exe.version, _as_written(exe)

        def attempt() -> list[int]:
            return self._in_transaction(
                lambda: LibsqlStore.commit(self, exe, emits, processed_event_id, timers, spawns, trace, step)
            )

        def resolve() -> list[int] | None:
            if not self._written(exe, old, data):
                return None
            return [self._outbox_seq(target, event) for target, event in emits]

        return self._retry("store.commit", attempt, resolve=resolve)

    def purge(self, execution_id: str, expected_version: int) -> bool:
        return self._retry(
            "store.purge",
            lambda: self._in_transaction(lambda: LibsqlStore.purge(self, execution_id, expected_version)),
            resolve=lambda: True if self._gone(execution_id) else None,
        )

    def append_trace(self, execution_id: str, entry: dict) -> None:
        self._retry(
            "store.trace",
            lambda: self._in_transaction(lambda: LibsqlStore.append_trace(self, execution_id, entry)),
        )

    def ack_outbox(self, seq: int) -> None:
        self._retry("store.ack_outbox", lambda: LibsqlStore.ack_outbox(self, seq))

    def ack_spawn(self, seq: int) -> None:
        self._retry("store.ack_spawn", lambda: LibsqlStore.ack_spawn(self, seq))

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        self._retry("store.delete_timer", lambda: LibsqlStore.delete_timer(self, execution_id, path, fire_at))

    def close(self) -> None:
        if self._owns_connection:
            self._edge.close()

    # ---- internals -----------------------------------------------------------------------

    def _create_tables(self) -> None:
        for statement in store_tables(self.settings.prefix):
            self._edge.execute(statement)

    def _check_tables(self) -> None:
        if not schema.table_exists(self._edge.execute, self._n.executions):
            raise SchemaError(
                f"{self._n.executions} does not exist and create_schema=False: run `harel-edge migrate` "
                "(or apply `harel-edge migrate --print-sql` with your migration tool)"
            )

    def _in_transaction(self, body: Callable[[], T]) -> T:
        """`body` is one of LibsqlStore's writes: it ends with commit() or rollback() itself."""
        if self._edge.in_transaction:  # left open by a failure that could not roll back
            self._conn.rollback()
        self._edge.execute("BEGIN IMMEDIATE")
        try:
            return body()
        finally:
            if self._edge.in_transaction:
                self._conn.rollback()

    def _read(self, operation: str, body: Callable[[], T]) -> T:
        def attempt() -> T:
            self._sync()
            return body()

        return self._retry(operation, attempt)

    def _sync(self) -> None:
        if self._edge.profile != "replica":
            return
        try:
            self._edge.sync()
        except Exception as exc:
            observability.record_sync(False)
            log.warning("sync failed", where="store", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            raise
        observability.record_sync(True, self._edge.last_sync_at)

    def _retry(
        self, operation: str, attempt: Callable[[], T], resolve: Callable[[], T | None] | None = None
    ) -> T:
        return retry.call_with_retry(
            self.settings, operation, attempt, recover=self._recover, resolve=resolve
        )

    def _recover(self, exc: BaseException) -> None:
        self._conn.rollback()
        if retry.needs_reopen(exc):
            self._edge.reopen()
        else:
            self._sync()

    def _written(self, exe: Execution, old: int, data: str) -> bool:
        """Did the write of `exe` at version old+1 land? The row holds exactly what was sent."""
        rows = self._edge.execute(f"SELECT version, data FROM {self._n.executions} WHERE id = ?", (exe.id,))
        if rows and rows[0][0] == old + 1 and rows[0][1] == data:
            exe.version = old + 1
            return True
        return False

    def _outbox_seq(self, target: str | None, event: Any) -> int:
        rows = self._edge.execute(
            f"SELECT seq FROM {self._n.outbox} WHERE target_id IS ? AND event = ? ORDER BY seq DESC LIMIT 1",
            (target, event.model_dump_json()),
        )
        return int(rows[0][0]) if rows else 0  # already relayed and acked elsewhere: nothing to ack

    def _gone(self, execution_id: str) -> bool:
        return not self._edge.execute(f"SELECT 1 FROM {self._n.executions} WHERE id = ?", (execution_id,))


def _as_written(exe: Execution) -> str:
    """The JSON LibsqlStore writes for `exe`: itself, one version on."""
    return exe.model_copy(update={"version": exe.version + 1}).model_dump_json()


class AsyncEdgeStore:
    """The async face harel's `AsyncWorker` needs, over an `EdgeStore`.

    `runner` is what serializes the connection: any object with `async run(work)` that calls
    `work(connection)` on a thread with nobody else inside (the durable `Database` is one).
    The worker passes the `Database` its transport and durable stores also go through, so one
    process has one connection and one writer.
    """

    def __init__(self, store: EdgeStore, runner: Any) -> None:
        self._s = store
        self._runner = runner

    @property
    def sync_store(self) -> EdgeStore:
        return self._s

    @property
    def trace_max(self) -> int:
        return self._s.trace_max

    @trace_max.setter
    def trace_max(self, value: int) -> None:
        self._s.trace_max = value

    async def _run(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._runner.run(lambda _connection: method(*args, **kwargs))

    async def load(self, execution_id: str) -> Execution | None:
        return await self._run(self._s.load, execution_id)

    async def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        return await self._run(self._s.load_for_event, execution_id, event_id)

    async def list_executions(self, **filters: Any) -> Any:
        if filters.get("status") is not None:
            filters["status"] = list(filters["status"])
        return await self._run(self._s.list_executions, **filters)

    async def save(self, exe: Execution) -> None:
        await self._run(self._s.save, exe)

    async def commit(self, exe: Execution, emits: list, **kwargs: Any) -> list[int]:
        return await self._run(self._s.commit, exe, emits, **kwargs)

    async def append_trace(self, execution_id: str, entry: dict) -> None:
        await self._run(self._s.append_trace, execution_id, entry)

    async def read_trace(self, execution_id: str) -> list[dict]:
        return await self._run(self._s.read_trace, execution_id)

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        return await self._run(self._s.is_processed, execution_id, event_id)

    async def pending_outbox(self) -> list:
        return await self._run(self._s.pending_outbox)

    async def ack_outbox(self, seq: int) -> None:
        await self._run(self._s.ack_outbox, seq)

    async def pending_spawns(self) -> list:
        return await self._run(self._s.pending_spawns)

    async def ack_spawn(self, seq: int) -> None:
        await self._run(self._s.ack_spawn, seq)

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return await self._run(self._s.due_timers, now)

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._run(self._s.delete_timer, execution_id, path, fire_at)

    async def ids_with_prefix(self, prefix: str) -> list[str]:
        return await self._run(self._s.ids_with_prefix, prefix)

    async def purge(self, execution_id: str, expected_version: int) -> bool:
        return await self._run(self._s.purge, execution_id, expected_version)

    async def close(self) -> None:
        await self._run(self._s.close)
