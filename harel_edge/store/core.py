"""harel's execution store, written once (async) on the profile's executor: `load_for_event` is
answered from the claim's read, and `commit` carries the event's ack. `EdgeStore` is its sync face.
A cancelled caller cannot know whether its commit landed; the version check applies it at most once."""

from __future__ import annotations

import json
from typing import Any

from harel.engine.execution import Execution
from harel.engine.schema import Names
from harel.engine.store import OutboxEntry, SpawnEntry
from harel.spec.states import Event

from harel_edge.executor import Executor, StatementError, Stmt
from harel_edge.queue.core import EventTransport
from harel_edge.queue.runs import Run
from harel_edge.settings import EdgeSettings
from harel_edge.store import statements as store_sql
from harel_edge.store.writing import Writing


class EventStore(Writing):
    """harel's async execution store on an executor, with its own SQL (harel's tables). With
    `events`, the transport whose leases the worker handles: `load_for_event` is answered from
    that transport's claim, and `commit` carries the event's ack through it."""

    def __init__(self, executor: Executor, settings: EdgeSettings, *, events: EventTransport | None = None) -> None:
        self.executor = executor
        self.settings = settings
        self.events = events
        self.trace_max = store_sql.TRACE_MAX
        self._n = Names(settings.prefix)

    async def _rows(self, sql: str, *args: Any, operation: str = "store.read") -> list[tuple]:
        async def attempt() -> list[tuple]:
            return (await self._execute(sql, *args)).rows

        return await self._run(operation, attempt)

    def _claimed(self, execution_id: str) -> Run | None:
        return self.events.claimed(execution_id) if self.events is not None else None

    # ---- reads -------------------------------------------------------------------------------------

    async def load(self, execution_id: str) -> Execution | None:
        """The execution: while a run of its group is held with the execution the claim read,
        as that run has it (harel's worker without `load_for_event`, as its sync `Worker` is)."""
        run = self._claimed(execution_id)
        if run is not None:
            return None if run.state is None else Execution.model_validate_json(run.state)
        rows = await self._rows(self._n.sql(store_sql.LOAD), execution_id, operation="store.load")
        return Execution.model_validate_json(rows[0][0]) if rows else None

    async def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        run = self._claimed(execution_id)
        if run is not None:
            data, processed = run.state, run.processed.get(event_id, False)
        else:
            rows = await self._rows(
                self._n.sql(store_sql.LOAD_FOR_EVENT),
                execution_id,
                execution_id,
                event_id,
                operation="store.load",
            )
            data, processed = (rows[0][0], bool(rows[0][1])) if rows else (None, False)
        if data is None:
            return None, False
        return Execution.model_validate_json(data), processed

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        run = self._claimed(execution_id)
        if run is not None and event_id in run.processed:
            return run.processed[event_id]
        rows = await self._rows(
            self._n.sql(store_sql.IS_PROCESSED), execution_id, event_id
        )
        return bool(rows)

    async def list_executions(self, *, status=None, definition_id=None, roots_only=False, limit=100, cursor=None):  # noqa: ANN001, ANN201 - harel's signature
        off = store_sql.decode_offset(cursor)
        sql, params = store_sql.listing_query(self._n.executions, status, definition_id, roots_only, limit, off)
        return store_sql.listing_page(await self._rows(sql, *params, operation="store.list"), limit, off)

    async def read_trace(self, execution_id: str) -> list[dict]:
        rows = await self._rows(self._n.sql(store_sql.READ_TRACE), execution_id)
        return [{**json.loads(entry), "index": idx} for idx, entry in rows]

    async def pending_outbox(self) -> list[OutboxEntry]:
        rows = await self._rows(self._n.sql(store_sql.PENDING_OUTBOX))
        return [OutboxEntry(seq, target, Event.model_validate_json(event)) for seq, target, event in rows]

    async def pending_spawns(self) -> list[SpawnEntry]:
        rows = await self._rows(self._n.sql(store_sql.PENDING_SPAWNS))
        return [SpawnEntry(seq, pid, cid, rp, json.loads(ctx)) for seq, pid, cid, rp, ctx in rows]

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        rows = await self._rows(self._n.sql(store_sql.DUE_TIMERS), now)
        return [(eid, p, fa) for eid, p, fa in rows]

    async def ids_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in await self._rows(self._n.sql(store_sql.IDS_WITH_PREFIX), store_sql.like_prefix(prefix))]

    # ---- writes ------------------------------------------------------------------------------------

    async def save(self, exe: Execution) -> None:
        await self._write_unit(self._execution_write(exe, exe.version), [], "store.save")
        exe.version += 1

    async def commit(
        self,
        exe: Execution,
        emits: list,
        processed_event_id: str | None = None,
        timers: tuple = (),
        spawns: tuple = (),
        trace: dict | None = None,
        step: Any = None,
    ) -> list[int]:
        """The event's commit; for a lease `events` holds, it carries the message's ack. A member
        of a run that others follow keeps it for the run's one commit (until the run's end, an
        emit or spawn, whose outbox harel reads next, or a third of the lease gone)."""
        rest = self._commit_stmts(exe, emits, processed_event_id, timers, spawns, trace)
        results = None
        if self.events is not None:
            results = await self.events.commit_with_ack(
                exe.id, processed_event_id, lambda base: self._execution_write(exe, exe.version if base is None else base),
                rest, self._write_unit, emits=emits, spawns=spawns,
            )
        if results is None:
            results = await self._write_unit(self._execution_write(exe, exe.version), rest, emits=emits)
        exe.version += 1
        return [int(r.rows[0][0]) for r in results[: len(emits)]]

    async def append_trace(self, execution_id: str, entry: dict) -> None:
        stmts = self._trace_stmts(execution_id, entry)

        async def attempt() -> None:
            await self.executor.transaction(stmts)

        await self._run("store.trace", attempt)

    async def ack_outbox(self, seq: int) -> None:
        await self._rows(self._n.sql(store_sql.ACK_OUTBOX), seq, operation="store.ack_outbox")

    async def ack_spawn(self, seq: int) -> None:
        await self._rows(self._n.sql(store_sql.ACK_SPAWN), seq, operation="store.ack_spawn")

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._rows(
            self._n.sql(store_sql.DELETE_TIMER),
            execution_id,
            path,
            fire_at,
            operation="store.delete_timer",
        )

    async def purge(self, execution_id: str, expected_version: int) -> bool:
        n = self._n
        stmts = [
            Stmt(n.sql(store_sql.PURGE_EXECUTION), (execution_id, expected_version)),
            Stmt(store_sql.PURGE_GUARD),
            *[Stmt(n.sql(sql), (execution_id,)) for sql in store_sql.PURGE_COMPANIONS],
        ]

        async def attempt() -> bool:
            try:
                await self.executor.transaction(stmts)
            except StatementError as exc:
                if exc.step == 1:
                    return False
                raise
            return True

        async def resolve() -> bool | None:
            return True if not await self._rows(n.sql(store_sql.EXISTS_EXECUTION), execution_id) else None

        return await self._run("store.purge", attempt, resolve)

    async def settle(self, run: Run) -> None:
        """Send what a run of `events` kept, once its handler is done with it."""
        if self.events is None:
            raise TypeError("a run is settled through the transport that holds it: EventStore(..., events=transport)")
        await self.events.settle_run(run, self._write_unit)

    async def close(self) -> None:
        """The executor is shared with the transport; its owner closes it."""
