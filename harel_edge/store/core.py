"""harel's execution store, written once (async) on the profile's executor: `load_for_event` is
answered from the claim's read, and `commit` carries the event's ack. `EdgeStore` is its sync face.
A cancelled caller cannot know whether its commit landed; the version check applies it at most once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harel.engine.execution import Execution
from harel.engine.schema import Names
from harel.engine.store import OutboxEntry, SpawnEntry, StoreConflict
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge.executor import Result, StatementError, Stmt
from harel_edge.queue.leases import EventPath
from harel_edge.queue.statements import ack_statement, lock_of_sql
from harel_edge.store import statements as store_sql

_TAKEN = object()  # a prefetched execution already handed out by `load`: only its processed flag is left


class EventStore:
    """harel's async execution store over an `EventPath`, with its own SQL (harel's tables).

    `load_for_event` is answered from the claim's read, and `commit` carries the event's ack.
    """

    def __init__(self, path: EventPath) -> None:
        self.path = path
        self.trace_max = store_sql.TRACE_MAX

    @property
    def _n(self) -> Names:
        return self.path.store

    async def _rows(self, sql: str, *args: Any, operation: str = "store.read") -> list[tuple]:
        async def attempt() -> list[tuple]:
            return (await self.path.execute(sql, *args)).rows

        return await self.path.run(operation, attempt)

    # ---- reads -------------------------------------------------------------------------------------

    async def load(self, execution_id: str) -> Execution | None:
        """The execution; the first `load` after a claim that read it is answered from that read,
        leaving its processed flag for the `is_processed` that follows (harel's worker without
        `load_for_event`, as its sync `Worker` in background execution is)."""
        key = next((k for k in self.path.prefetched if k[0] == execution_id), None)
        if key is not None and self.path.prefetched[key][0] is not _TAKEN:
            data, processed = self.path.prefetched[key]
            self.path.prefetched[key] = (_TAKEN, processed)
            return None if data is None else Execution.model_validate_json(data)
        rows = await self._rows(f"SELECT data FROM {self._n.executions} WHERE id = ?", execution_id, operation="store.load")
        return Execution.model_validate_json(rows[0][0]) if rows else None

    async def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        found = self.path.prefetched.pop((execution_id, event_id), None)
        if found is None or found[0] is _TAKEN:
            rows = await self._rows(
                f"SELECT (SELECT data FROM {self._n.executions} WHERE id = ?),"
                f" EXISTS(SELECT 1 FROM {self._n.processed_events} WHERE execution_id = ? AND event_id = ?)",
                execution_id,
                execution_id,
                event_id,
                operation="store.load",
            )
            found = (rows[0][0], bool(rows[0][1])) if rows else (None, False)
        data, processed = found
        if data is None:
            return None, False
        return Execution.model_validate_json(data), processed

    async def is_processed(self, execution_id: str, event_id: str) -> bool:
        found = self.path.prefetched.pop((execution_id, event_id), None)
        if found is not None:  # the claim read it with the execution
            return found[1]
        rows = await self._rows(
            f"SELECT 1 FROM {self._n.processed_events} WHERE execution_id = ? AND event_id = ?", execution_id, event_id
        )
        return bool(rows)

    async def list_executions(self, *, status=None, definition_id=None, roots_only=False, limit=100, cursor=None):  # noqa: ANN001, ANN201 - harel's signature
        off = store_sql.decode_offset(cursor)
        sql, params = store_sql.listing_query(self._n.executions, status, definition_id, roots_only, limit, off)
        return store_sql.listing_page(await self._rows(sql, *params, operation="store.list"), limit, off)

    async def read_trace(self, execution_id: str) -> list[dict]:
        rows = await self._rows(f"SELECT idx, entry FROM {self._n.trace} WHERE execution_id = ? ORDER BY idx", execution_id)
        return [{**json.loads(entry), "index": idx} for idx, entry in rows]

    async def pending_outbox(self) -> list[OutboxEntry]:
        rows = await self._rows(f"SELECT seq, target_id, event FROM {self._n.outbox} ORDER BY seq")
        return [OutboxEntry(seq, target, Event.model_validate_json(event)) for seq, target, event in rows]

    async def pending_spawns(self) -> list[SpawnEntry]:
        rows = await self._rows(f"SELECT seq, parent_id, child_id, root_path, context FROM {self._n.spawns} ORDER BY seq")
        return [SpawnEntry(seq, pid, cid, rp, json.loads(ctx)) for seq, pid, cid, rp, ctx in rows]

    async def due_timers(self, now: float) -> list[tuple[str, str, float]]:
        rows = await self._rows(
            f"SELECT execution_id, path, fire_at FROM {self._n.timers} WHERE fire_at <= ? ORDER BY fire_at", now
        )
        return [(eid, p, fa) for eid, p, fa in rows]

    async def ids_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in await self._rows(self._n.sql(store_sql.IDS_WITH_PREFIX), store_sql.like_prefix(prefix))]

    # ---- writes ------------------------------------------------------------------------------------

    async def save(self, exe: Execution) -> None:
        await self._write_unit(exe, [], "store.save")

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
        n = self._n
        stmts = [Stmt(f"INSERT INTO {n.outbox} (target_id, event) VALUES (?, ?) RETURNING seq", (t, e.model_dump_json())) for t, e in emits]
        if processed_event_id is not None:
            stmts.append(
                Stmt(f"INSERT OR IGNORE INTO {n.processed_events} (execution_id, event_id) VALUES (?, ?)", (exe.id, processed_event_id))
            )
        for child_id, root_path, context in spawns:
            stmts.append(
                Stmt(
                    f"INSERT INTO {n.spawns} (parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?)",
                    (exe.id, child_id, root_path, json.dumps(context)),
                )
            )
        for op in timers:
            if op.action == "schedule":
                stmts.append(
                    Stmt(
                        f"INSERT INTO {n.timers} (execution_id, path, fire_at) VALUES (?, ?, ?)"
                        " ON CONFLICT(execution_id, path) DO UPDATE SET fire_at = excluded.fire_at",
                        (exe.id, op.path, op.fire_at),
                    )
                )
            else:
                stmts.append(Stmt(f"DELETE FROM {n.timers} WHERE execution_id = ? AND path = ?", (exe.id, op.path)))
        if trace is not None:
            stmts.extend(self._trace_stmts(exe.id, trace))
        lease = self.path.by_event.get((exe.id, processed_event_id)) if processed_event_id else None
        claim = None
        if lease is not None:
            stmts.append(ack_statement(self.path.queue, lease))
            claimer = self.path.claimer
            claim = claimer.claim_with_commit() if claimer is not None else None
        try:
            results = await self._write_unit(exe, stmts, "store.commit", emits=emits, lease=lease)
        finally:
            if claim is not None:
                claimer.commit_ended()
        if lease is not None:
            self.path.acked_by_commit[(lease.seq, lease.token)] = bool(results[-1].rows)
        if claim is not None:  # the leases the claim after this commit took are held when it returns
            await asyncio.shield(claim)
        return [int(r.rows[0][0]) for r in results[: len(emits)]]

    async def append_trace(self, execution_id: str, entry: dict) -> None:
        stmts = self._trace_stmts(execution_id, entry)

        async def attempt() -> None:
            await self.path.executor.transaction(stmts)

        await self.path.run("store.trace", attempt)

    async def ack_outbox(self, seq: int) -> None:
        await self._rows(f"DELETE FROM {self._n.outbox} WHERE seq = ?", seq, operation="store.ack_outbox")

    async def ack_spawn(self, seq: int) -> None:
        await self._rows(f"DELETE FROM {self._n.spawns} WHERE seq = ?", seq, operation="store.ack_spawn")

    async def delete_timer(self, execution_id: str, path: str, fire_at: float) -> None:
        await self._rows(
            f"DELETE FROM {self._n.timers} WHERE execution_id = ? AND path = ? AND fire_at = ?",
            execution_id,
            path,
            fire_at,
            operation="store.delete_timer",
        )

    async def purge(self, execution_id: str, expected_version: int) -> bool:
        n = self._n
        # The delete of the row guards the rest: when it matched nothing, the guard fails the
        # unit, and nothing else is deleted.
        stmts = [
            Stmt(f"DELETE FROM {n.executions} WHERE id = ? AND version = ?", (execution_id, expected_version)),
            Stmt("SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('harel_edge: moved on') END"),
            *[Stmt(n.sql(sql), (execution_id,)) for sql in store_sql.PURGE_COMPANIONS],
        ]

        async def attempt() -> bool:
            try:
                await self.path.executor.transaction(stmts)
            except StatementError as exc:
                if exc.step == 1:
                    return False
                raise
            return True

        async def resolve() -> bool | None:
            return True if not await self._rows(f"SELECT 1 FROM {n.executions} WHERE id = ?", execution_id) else None

        return await self.path.run("store.purge", attempt, resolve)

    async def close(self) -> None:
        """The executor is shared with the transport; its owner closes it."""

    # ---- internals ---------------------------------------------------------------------------------

    def _trace_stmts(self, execution_id: str, entry: dict) -> list[Stmt]:
        n = self._n
        stmts = [
            Stmt(
                f"INSERT INTO {n.trace} (execution_id, idx, entry) SELECT ?,"
                f" COALESCE((SELECT MAX(idx) FROM {n.trace} WHERE execution_id = ?), -1) + 1, ?",
                (execution_id, execution_id, json.dumps(entry)),
            )
        ]
        if self.trace_max:
            stmts.append(
                Stmt(
                    f"DELETE FROM {n.trace} WHERE execution_id = ? AND idx <="
                    f" (SELECT MAX(idx) FROM {n.trace} WHERE execution_id = ?) - ?",
                    (execution_id, execution_id, self.trace_max),
                )
            )
        return stmts

    async def _write_unit(
        self,
        exe: Execution,
        rest: list[Stmt],
        operation: str,
        *,
        emits: list = (),
        lease: Lease | None = None,
    ) -> list[Result]:
        """Write `exe` one version on (compare-and-set on its version) with `rest`, as one
        transaction; returns the results of `rest` (which ends with `lease`'s ack, when given). A lost outcome is looked up: the row holds exactly what was sent."""
        n = self._n
        old = exe.version
        exe.version = old + 1  # the row's JSON names the version it writes; set in place, not copied (8.6 -> 2.0 us)
        try:
            data = exe.model_dump_json()
        finally:
            exe.version = old
        if old == 0:
            write = [Stmt(f"INSERT INTO {n.executions} (id, definition_id, data, version) VALUES (?, ?, ?, 1)", (exe.id, exe.definition_id, data))]
        else:
            write = [
                Stmt(f"UPDATE {n.executions} SET data = ?, version = ? WHERE id = ? AND version = ?", (data, old + 1, exe.id, old)),
                Stmt("SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('harel_edge: version conflict') END"),
            ]
        stmts = [*write, *rest]

        async def attempt() -> list[Result]:
            try:
                return (await self.path.executor.transaction(stmts))[len(write) :]
            except StatementError as exc:
                # Step -1 is the BEGIN (the primary's write lock refused: nothing ran), for the retry policy.
                if 0 <= exc.step < len(write) and (old > 0 or "constraint" in str(exc).lower()):
                    rows = (await self.path.execute(f"SELECT version FROM {n.executions} WHERE id = ?", exe.id)).rows
                    raise StoreConflict(exe.id, expected=old, found=rows[0][0] if rows else None) from None
                raise

        async def resolve() -> list[Result] | None:
            rows = (await self.path.execute(f"SELECT version, data FROM {n.executions} WHERE id = ?", exe.id)).rows
            if not rows or rows[0][0] != old + 1 or rows[0][1] != data:
                return None
            results = []
            for target, event in emits:
                found = (
                    await self.path.execute(
                        f"SELECT seq FROM {n.outbox} WHERE target_id IS ? AND event = ? ORDER BY seq DESC LIMIT 1",
                        target,
                        event.model_dump_json(),
                    )
                ).rows
                results.append(Result(rows=found or [(0,)]))
            results.extend(Result() for _ in rest[len(emits) :])
            if lease is not None:  # the commit landed, and with it the ack, if the lease still held
                gone = await self._message_gone(lease)
                results[-1] = Result(rows=[(lease.seq,)] if gone else [])
            return results

        results = await self.path.run(operation, attempt, resolve)
        exe.version = old + 1
        return results

    async def _message_gone(self, lease: Lease) -> bool:
        rows = (await self.path.execute(lock_of_sql(self.path.queue), lease.seq)).rows
        return not rows
