"""EdgeStore: harel's (sync) execution store on the event path's own SQL and executor, for sync
code: the CLI's publish, the demo's seeding, a user's script. See docs/transport.md."""

from __future__ import annotations

import weakref
from typing import Any

from harel.engine.execution import Execution
from harel.engine.schema import Names, store_schema

from harel_edge import schema
from harel_edge.connection import EdgeConnection
from harel_edge.errors import SchemaError
from harel_edge.event_path import EventPath, EventStore
from harel_edge.executor import ExecutorClosedError, open_executor
from harel_edge.executor.local import LocalExecutor
from harel_edge.loop_thread import LoopThread
from harel_edge.settings import EdgeSettings


def store_tables(prefix: str) -> list[str]:
    """harel's execution-store tables under `prefix`, as harel creates them for SQLite."""
    return list(store_schema("sqlite", prefix))


class EdgeStore:
    """harel's `ExecutionStore` for sync callers: each call runs the event path's `EventStore` on
    a loop thread of this store's (one SQL and retry policy for sync and async). `connection`:
    a local file's connection the caller owns; without it, what the profile calls for."""

    def __init__(
        self,
        settings: EdgeSettings | None = None,
        *,
        connection: EdgeConnection | None = None,
        create_schema: bool = True,
    ) -> None:
        self.settings = connection.settings if connection is not None else settings or EdgeSettings.load()
        self._connection = connection
        self._owns_connection = connection is None
        if connection is None and self.settings.profile == "local":
            self._connection = EdgeConnection(self.settings)
        self._loop = LoopThread("harel-edge-store")
        self._finalizer = weakref.finalize(self, self._loop.stop)  # a store dropped unclosed
        try:
            self._store = self._loop.call(self._open())
            if create_schema:
                self._loop.call(self._store.path.run("store.schema", self._create_tables))
            elif not schema.table_exists(self._execute, Names(self.settings.prefix).executions):
                raise SchemaError(
                    f"{Names(self.settings.prefix).executions} does not exist and create_schema=False: run "
                    "`harel-edge migrate` (or apply `harel-edge migrate --print-sql` with your migration tool)"
                )
        except BaseException:
            self.close()
            raise

    async def _open(self) -> EventStore:
        if self.settings.profile == "local":
            executor = LocalExecutor(self.settings, connection=self._connection)
        else:
            executor = open_executor(self.settings)
        return EventStore(EventPath(executor, self.settings))

    async def _create_tables(self) -> None:
        for statement in store_tables(self.settings.prefix):
            await self._store.path.execute(statement)

    def __enter__(self) -> EdgeStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._loop.call(self._store.path.execute(sql, *params)).rows

    def __repr__(self) -> str:  # never the token
        return f"<EdgeStore prefix={self.settings.prefix} profile={self.settings.profile}>"

    @property
    def connection(self) -> EdgeConnection:
        """A libsql connection to the same data (opened at first use on sqld and replica)."""
        if self._connection is None:
            self._connection = EdgeConnection(self.settings)
        return self._connection

    @property
    def trace_max(self) -> int:
        return self._store.trace_max

    @trace_max.setter
    def trace_max(self, value: int) -> None:
        self._store.trace_max = value

    # ---- harel's ExecutionStore -------------------------------------------------------------

    def load(self, execution_id: str) -> Execution | None:
        return self._loop.call(self._store.load(execution_id))

    def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        return self._loop.call(self._store.load_for_event(execution_id, event_id))

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        return self._loop.call(self._store.is_processed(execution_id, event_id))

    def list_executions(self, **filters: Any) -> Any:
        if filters.get("status") is not None:
            filters["status"] = list(filters["status"])
        return self._loop.call(self._store.list_executions(**filters))

    def read_trace(self, execution_id: str) -> list[dict]:
        return self._loop.call(self._store.read_trace(execution_id))

    def pending_outbox(self) -> list:
        return self._loop.call(self._store.pending_outbox())

    def pending_spawns(self) -> list:
        return self._loop.call(self._store.pending_spawns())

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return self._loop.call(self._store.due_timers(now))

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self._loop.call(self._store.ids_with_prefix(prefix))

    def save(self, exe: Execution) -> None:
        self._loop.call(self._store.save(exe))

    def commit(self, exe: Execution, emits: list, *args: Any, **kwargs: Any) -> list[int]:
        return self._loop.call(self._store.commit(exe, emits, *args, **kwargs))

    def append_trace(self, execution_id: str, entry: dict) -> None:
        self._loop.call(self._store.append_trace(execution_id, entry))

    def ack_outbox(self, seq: int) -> None:
        self._loop.call(self._store.ack_outbox(seq))

    def ack_spawn(self, seq: int) -> None:
        self._loop.call(self._store.ack_spawn(seq))

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        self._loop.call(self._store.delete_timer(execution_id, path, fire_at))

    def purge(self, execution_id: str, expected_version: int) -> bool:
        return self._loop.call(self._store.purge(execution_id, expected_version))

    def close(self) -> None:
        store = getattr(self, "_store", None)
        try:
            if store is not None and not isinstance(store, _Closed):
                self._store = _Closed()
                self._loop.call(store.path.executor.aclose())
        finally:
            self._finalizer()
            if self._owns_connection and self._connection is not None:
                self._connection.close()
                self._connection = None


class _Closed:
    """What a closed EdgeStore calls through: every call says so, clearly."""

    def __getattr__(self, name: str) -> Any:
        raise ExecutorClosedError("this EdgeStore was closed: open a new one to go on")
