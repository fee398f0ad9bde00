"""EdgeStore: harel's sync execution store, the async `EventStore` on a loop thread of its own,
for sync code (harel's sync worker, the CLI's publish, seeding, a user's script)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harel.engine.execution import Execution

from harel_edge.executor import Stmt, open_executor
from harel_edge.loop_thread import SyncFace
from harel_edge.schema_step import prepare
from harel_edge.settings import EdgeSettings
from harel_edge.store.core import EventStore

if TYPE_CHECKING:
    from harel_edge.queue.core import EventTransport
    from harel_edge.queue.faces import LibsqlTransport

class _OwnedStore(EventStore):
    """An `EventStore` that owns its executor, so closing the face closes it."""

    async def close(self) -> None:
        await self.executor.aclose()


async def _open(settings: EdgeSettings, create_schema: bool) -> _OwnedStore:
    store = _OwnedStore(open_executor(settings), settings)
    try:
        # harel's tables are version 4 of the numbered versions; a library face opens the
        # database it is pointed at (`adopt`), as the transport does.
        await prepare(store.executor, settings, migrate=create_schema, adopt=True)
    except BaseException:
        await store.close()
        raise
    return store


async def _beside(transport: EventTransport, create_schema: bool) -> EventStore:
    # Its close leaves the executor to the transport that owns it.
    store = EventStore(transport.path.executor, transport.settings, events=transport)
    if create_schema:
        await prepare(store.executor, store.settings, adopt=True)
    return store


class EdgeStore(SyncFace):
    """harel's `ExecutionStore` for sync callers: one SQL and retry policy for sync and async,
    on the profile's executor; safe to share between threads."""

    def __init__(
        self, settings: EdgeSettings | None = None, *, create_schema: bool = True, transport: LibsqlTransport | None = None
    ) -> None:
        """With `transport`, the store shares that transport's core (one executor; the transport
        owns the connections) and each commit carries its message's ack; a transport opened with
        `pair_with_store=True` also brings each execution with the claim and has the commit carry
        the next claim (two round trips an event instead of four)."""
        if transport is not None:
            self.settings = transport.settings
            self._core: EventStore = self._start_beside(transport, _beside(transport.core, create_schema))
            return
        self.settings = settings or EdgeSettings.load()
        self._core = self._start("harel-edge-store", _open(self.settings, create_schema))

    def __repr__(self) -> str:  # never the token
        return f"<EdgeStore prefix={self.settings.prefix} profile={self.settings.profile}>"

    @property
    def trace_max(self) -> int:
        return self.core.trace_max

    @trace_max.setter
    def trace_max(self, value: int) -> None:
        self.core.trace_max = value

    def execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        """One statement of the caller's through this store's executor (inspection, tools)."""
        return self._call(self.core.executor.execute(Stmt(statement, tuple(params)))).rows

    # ---- harel's ExecutionStore -------------------------------------------------------------

    def load(self, execution_id: str) -> Execution | None:
        return self._call(self.core.load(execution_id))

    def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        return self._call(self.core.load_for_event(execution_id, event_id))

    def is_processed(self, execution_id: str, event_id: str) -> bool:
        return self._call(self.core.is_processed(execution_id, event_id))

    def list_executions(self, **filters: Any) -> Any:
        if filters.get("status") is not None:
            filters["status"] = list(filters["status"])
        return self._call(self.core.list_executions(**filters))

    def read_trace(self, execution_id: str) -> list[dict]:
        return self._call(self.core.read_trace(execution_id))

    def pending_outbox(self) -> list:
        return self._call(self.core.pending_outbox())

    def pending_spawns(self) -> list:
        return self._call(self.core.pending_spawns())

    def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        return self._call(self.core.due_timers(now))

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self._call(self.core.ids_with_prefix(prefix))

    def save(self, exe: Execution) -> None:
        self._call(self.core.save(exe))

    def commit(self, exe: Execution, emits: list, *args: Any, **kwargs: Any) -> list[int]:
        return self._call(self.core.commit(exe, emits, *args, **kwargs))

    def append_trace(self, execution_id: str, entry: dict) -> None:
        self._call(self.core.append_trace(execution_id, entry))

    def ack_outbox(self, seq: int) -> None:
        self._call(self.core.ack_outbox(seq))

    def ack_spawn(self, seq: int) -> None:
        self._call(self.core.ack_spawn(seq))

    def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        self._call(self.core.delete_timer(execution_id, path, fire_at))

    def purge(self, execution_id: str, expected_version: int) -> bool:
        return self._call(self.core.purge(execution_id, expected_version))
