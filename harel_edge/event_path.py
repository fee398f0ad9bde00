"""How an event crosses the link: its share of one `claim_many` statement, and one commit carrying its ack.

The transport and store harel's `AsyncWorker` runs on, sharing one executor (docs/executor.md).
"""

from __future__ import annotations

import json
import secrets
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog
from harel.engine.execution import Execution
from harel.engine.schema import Names
from harel.engine.store import OutboxEntry, SpawnEntry, StoreConflict
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge import observability, retry, store_sql
from harel_edge.executor import Executor, Result, StatementError, Stmt
from harel_edge.schema import PARKED, EdgeNames, dead_letters_table, now_or, now_table
from harel_edge.settings import EdgeSettings
from harel_edge.transport import (
    BATCH_ROWS,
    Message,
    claim_params,
    claim_sql,
    lease_from_row,
    message_row,
    publish_statement,
    published_sql,
)

log = structlog.get_logger("harel_edge.event_path")

Clock = Callable[[], float]
LeaseKey = tuple[int, str | None]
MAX_ERROR_CHARS = 4000  # of a handling failure kept on its message and in its dead letter
ACK_ROWS = 2000  # leases in one DELETE of `ack_many`: 3 parameters each, far below SQLite's 32,766


class EventPath:
    """What the transport and the store of one worker share: the executor, the leases held
    (with their delivery counts and handling failures), the executions the claim brought, and
    the acks a commit already made."""

    def __init__(self, executor: Executor, settings: EdgeSettings, *, clock: Clock | None = None) -> None:
        self.executor = executor
        self.settings = settings
        self.queue = EdgeNames(settings.prefix)
        self.store = Names(settings.prefix)
        self.clock = clock
        self.held: dict[LeaseKey, Lease] = {}
        self.by_event: dict[tuple[str, str], Lease] = {}  # (group_id, event id) -> its lease
        self.prefetched: dict[tuple[str, str], tuple[str | None, bool]] = {}
        self.acked_by_commit: dict[LeaseKey, bool] = {}
        self.deliveries: dict[LeaseKey, int] = {}  # which delivery of its message a lease is
        self.failures: dict[LeaseKey, str] = {}  # a handling failure, for the nack to record

    def now(self) -> float | None:
        return self.clock() if self.clock is not None else None

    async def run(self, operation: str, attempt: Callable[[], Any], resolve: Callable[[], Any] | None = None) -> Any:
        return await retry.acall_with_retry(self.settings, operation, attempt, resolve=resolve)

    async def execute(self, sql: str, *args: Any, volatile: bool = False) -> Result:
        return await self.executor.execute(Stmt(sql, tuple(args)), volatile=volatile)

    def hold(
        self,
        lease: Lease,
        execution: str | None = None,
        processed: bool = False,
        prefetch: bool = False,
        deliveries: int | None = None,
    ) -> None:
        self.held[(lease.seq, lease.token)] = lease
        if deliveries is not None:
            self.deliveries[(lease.seq, lease.token)] = deliveries
        self.by_event[(lease.group_id, lease.event.id)] = lease
        if prefetch:
            self.prefetched[(lease.group_id, lease.event.id)] = (execution, processed)

    def release(self, lease: Lease) -> None:
        self.held.pop((lease.seq, lease.token), None)
        self.deliveries.pop((lease.seq, lease.token), None)
        self.failures.pop((lease.seq, lease.token), None)
        self.by_event.pop((lease.group_id, lease.event.id), None)
        self.prefetched.pop((lease.group_id, lease.event.id), None)


class EventTransport:
    """harel's async transport over an `EventPath`, with `claim_many` behind `claim`.

    `prefetch` and `max_deliveries`: docs/executor.md ("The event path") and docs/operations.md.
    """

    def __init__(
        self,
        path: EventPath,
        *,
        concurrency: int = 32,
        prefetch: bool = False,
        report: Any = None,
        count_groups: bool = False,
        routing_keys: Sequence[str] | None = None,
        max_deliveries: int = 0,
    ) -> None:
        if max_deliveries < 0:
            raise ValueError(f"max_deliveries must be >= 0 (0: never dead-letter), got {max_deliveries!r}")
        self.path = path
        self.concurrency = concurrency
        self.max_deliveries = max_deliveries
        self.prefetch = prefetch
        self._report = report
        self._groups: Counter[str] | None = Counter() if count_groups else None
        self._routing_keys = tuple(path.settings.routing_keys if routing_keys is None else routing_keys)
        self._buffer: deque[Lease] = deque()
        self._buffer_for: tuple | None = None
        self._sql: dict[tuple[int, bool], str] = {}

    @property
    def held(self) -> dict[LeaseKey, Lease]:
        return self.path.held

    # ---- publish -------------------------------------------------------------------------------

    async def publish(self, group_id: str, event: Event, priority: int = 0, routing_key: str | None = None) -> None:
        await self.publish_many([Message(group_id, event, priority, routing_key)])

    async def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        """All or none, in order; one unit of work (one statement up to BATCH_ROWS messages).
        Idempotent on each event id within `publish_window` (see `LibsqlTransport.publish_many`)."""
        rows = [message_row(item) for item in messages]
        if not rows:
            return 0
        q = self.path.queue
        now, window, batch = self.path.now(), self.path.settings.publish_window, secrets.token_hex(8)
        stmts = [
            Stmt(*publish_statement(q, rows[i : i + BATCH_ROWS], now, window, batch))
            for i in range(0, len(rows), BATCH_ROWS)
        ]

        async def attempt() -> bool:
            if len(stmts) == 1:
                await self.path.executor.execute(stmts[0])
            else:
                await self.path.executor.transaction(stmts)
            return True

        async def resolve() -> bool | None:
            found = await self.path.execute(published_sql(q), rows[0][0], rows[0][4])
            return True if found.rows and found.rows[0][0] == batch else None

        await self.path.run("publish", attempt, resolve)
        return len(rows)

    # ---- claim -----------------------------------------------------------------------------------

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys: Sequence[str] | None = None
    ) -> Lease | None:
        keys = tuple(self._routing_keys if routing_keys is None else routing_keys)
        wanted = (worker_id, visibility, min_priority, keys)
        if self._buffer and self._buffer_for == wanted:
            return self._buffer.popleft()
        # The free slots: leases held (buffered ones included) count against `concurrency`.
        n = max(1, self.concurrency - len(self.path.held)) if self.prefetch and not self._buffer else 1
        leases = await self.claim_many(worker_id, visibility, n, min_priority, keys, with_execution=self.prefetch)
        if not leases:
            return None
        if not self._buffer:
            self._buffer.extend(leases[1:])
            self._buffer_for = wanted
        return leases[0]

    async def claim_many(
        self,
        worker_id: str,
        visibility: float,
        n: int,
        min_priority: int = 0,
        routing_keys: Sequence[str] | None = None,
        *,
        with_execution: bool = False,
    ) -> list[Lease]:
        """Lease the heads of up to `n` groups in one statement, in round-robin order. With
        `with_execution` the statement also reads each message's execution, which the
        `EventStore` then serves to the worker instead of reading it again."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n!r}")
        keys = tuple(self._routing_keys if routing_keys is None else routing_keys)
        while True:
            leases, buried = await self._claim_once(worker_id, visibility, n, min_priority, keys, with_execution)
            if leases or not buried:
                break  # when every message claimed was buried, the next heads may be deliverable
        if leases:
            observability.CLAIMS.inc(len(leases))
            if self._report is not None:
                self._report.claims += len(leases)
        return leases

    async def _claim_once(
        self, worker_id: str, visibility: float, n: int, min_priority: int, keys: tuple, with_execution: bool
    ) -> tuple[list[Lease], int]:
        """One claim statement: the leases to hand out, and how many messages it buried."""
        token, params = claim_params(worker_id, visibility, min_priority, keys, self.path.now())
        sql = self._claim_statement(len(keys), with_execution)
        q = self.path.queue

        async def attempt() -> list[tuple]:
            return (await self.path.execute(sql, *params, n, volatile=True)).rows

        async def resolve() -> list[tuple]:
            # Found or not, the look-up is the answer: a claim that did not land leased nothing.
            # The row is read after the delivery trigger ran: its count is already this one's.
            extra = self._returning(with_execution, after_trigger=True)
            return (
                await self.path.execute(
                    f"SELECT seq, group_id, event{extra} FROM {q.messages} WHERE locked_by = ? ORDER BY seq", token
                )
            ).rows

        rows = sorted(await self.path.run("claim", attempt, resolve), key=lambda row: row[0])
        leases, buried = [], 0
        for row in rows:
            lease = lease_from_row(row[:3], token)
            deliveries = int(row[-1] or 0)
            if self.max_deliveries and deliveries > self.max_deliveries:
                buried += 1
                await self._bury_quietly(lease, deliveries)
                continue
            if with_execution:
                self.path.hold(lease, row[3], bool(row[4]), prefetch=True, deliveries=deliveries)
            else:
                self.path.hold(lease, deliveries=deliveries)
            leases.append(lease)
        return leases, buried

    def _claim_statement(self, keys: int, with_execution: bool) -> str:
        sql = self._sql.get((keys, with_execution))
        if sql is None:
            sql = self._sql[(keys, with_execution)] = claim_sql(
                self.path.queue, keys, many=True, returning=self._returning(with_execution)
            )
        return sql

    def _returning(self, with_execution: bool, *, after_trigger: bool = False) -> str:
        """The claim's extra columns: the execution and its processed flag (`with_execution`),
        then which delivery this is. RETURNING sees the row before the AFTER UPDATE trigger
        counts the delivery, so the claim adds it; a look-up afterwards reads it counted."""
        s = self.path.store
        execution = (
            f", (SELECT data FROM {s.executions} WHERE id = group_id),"
            f" EXISTS(SELECT 1 FROM {s.processed_events}"
            f" WHERE execution_id = group_id AND event_id = json_extract(event, '$.id'))"
            if with_execution
            else ""
        )
        return f"{execution}, deliveries{'' if after_trigger else ' + 1'}"

    # ---- dead letters ------------------------------------------------------------------------------

    def deliveries(self, lease: Lease) -> int | None:
        """Which delivery of its message `lease` is (1: the first), while it is held."""
        return self.path.deliveries.get((lease.seq, lease.token))

    def failed(self, lease: Lease, error: BaseException | str) -> None:
        """Say that handling `lease` raised `error`: the nack that gives it back records the
        error on the message (a dead letter keeps the last one), and the delivery stays counted
        toward `max_deliveries`. A nack without it is a clean give-back and is not counted."""
        key = (lease.seq, lease.token)
        if key in self.path.held:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            self.path.failures[key] = text[:MAX_ERROR_CHARS]

    async def bury(self, lease: Lease, deliveries: int | None = None) -> bool:
        """Move the leased message to the dead-letter table, fenced by the lease's token: one
        statement that inserts the dead letter and deletes the message. False if the lease was lost."""
        q = self.path.queue
        bury = (
            f"INSERT INTO {q.prefix}_transport_bury (seq, token, at, held)"
            f" SELECT ?, ?, t.now, EXISTS(SELECT 1 FROM {q.messages} WHERE seq = ? AND locked_by = ?)"
            f" FROM {now_table('?')} RETURNING held"
        )

        async def attempt() -> bool:
            rows = (await self.path.execute(bury, lease.seq, lease.token, lease.seq, lease.token, self.path.now())).rows
            return bool(rows and rows[0][0])

        async def resolve() -> bool | None:
            rows = (
                await self.path.execute(
                    f"SELECT (SELECT locked_by FROM {q.messages} WHERE seq = ?),"
                    f" EXISTS(SELECT 1 FROM {dead_letters_table(q.prefix)} WHERE seq = ? AND kind = 'message')",
                    lease.seq,
                    lease.seq,
                )
            ).rows
            locked_by, dead = rows[0]
            if dead:
                return True
            return None if locked_by == lease.token else False

        done = await self.path.run("bury", attempt, resolve)
        self.path.release(lease)
        if done:
            observability.DEAD_LETTERED.labels("message").inc()
            if self._report is not None:
                self._report.dead_letters += 1
            log.warning(
                "dead-lettered",
                kind="message",
                group_id=lease.group_id,
                seq=lease.seq,
                event_kind=lease.event.kind,
                deliveries=None if deliveries is None else deliveries - 1,
                limit=self.max_deliveries,
            )
        else:
            observability.record_lost_lease("bury")
        return done

    async def _bury_quietly(self, lease: Lease, deliveries: int) -> None:
        """`bury`, from a claim: a failure leaves the message leased, and it comes back (still
        over the limit) once the lease lapses, so the claim hands out what else it leased."""
        try:
            await self.bury(lease, deliveries)
        except Exception as exc:  # noqa: BLE001 - the message is buried on a later claim
            log.warning("could not dead-letter a message", group_id=lease.group_id, seq=lease.seq, error=str(exc)[:200])

    # ---- ack / nack ------------------------------------------------------------------------------

    async def ack(self, lease: Lease) -> bool:
        key = (lease.seq, lease.token)
        if key in self.path.acked_by_commit:
            done = self.path.acked_by_commit.pop(key)
        else:
            fence, params = _fence(lease)
            q = self.path.queue

            async def attempt() -> bool:
                return bool((await self.path.execute(f"DELETE FROM {q.messages} WHERE {fence} RETURNING seq", *params)).rows)

            done = await self.path.run("ack", attempt, lambda: self._settled(lease, done_if_gone=True))
        self._finish([lease], [done], "ack")
        return done

    async def ack_many(self, leases: Sequence[Lease]) -> list[bool]:
        """Ack several leases as one unit of work; each answer as `ack` gives it."""
        q = self.path.queue
        if not leases:
            return []
        if all(lease.token for lease in leases):
            # One statement for the lot: libsql prepares each statement anew, so one DELETE of
            # n fenced rows costs far less than n DELETEs.
            chunks = [ack_many_statement(q, leases[i : i + ACK_ROWS]) for i in range(0, len(leases), ACK_ROWS)]

            async def attempt() -> list[bool]:
                if len(chunks) == 1:
                    results = [await self.path.executor.execute(chunks[0])]
                else:
                    results = await self.path.executor.transaction(chunks)
                return _acked(leases, {(row[0], row[1]) for result in results for row in result.rows})

        else:
            stmts = [Stmt(f"DELETE FROM {q.messages} WHERE {_fence(lease)[0]} RETURNING seq", _fence(lease)[1]) for lease in leases]

            async def attempt() -> list[bool]:
                return [bool(r.rows) for r in await self.path.executor.transaction(stmts)]

        async def resolve() -> list[bool]:
            return [bool(await self._settled(lease, done_if_gone=True)) for lease in leases]

        done = await self.path.run("ack", attempt, resolve)
        self._finish(leases, done, "ack")
        return done

    async def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        self.path.acked_by_commit.pop((lease.seq, lease.token), None)
        fence, params = _fence(lease)
        q = self.path.queue
        if delay > 0:
            lock, lock_args = f"locked_by = ?, lock_expiry = {now_or()} + ?", (PARKED, self.path.now(), delay)
        else:
            lock, lock_args = "locked_by = NULL, lock_expiry = NULL", ()
        # After a handling failure the delivery stays counted and its error is kept; any other
        # give-back (a suspended execution, a conflict, a stop) takes its delivery back.
        error = self.path.failures.pop((lease.seq, lease.token), None)
        count, count_args = (
            (", last_error = ?", (error,)) if error is not None else (", deliveries = MAX(deliveries - 1, 0)", ())
        )
        sql = f"UPDATE {q.messages} SET {lock}{count} WHERE {fence} RETURNING seq"
        args: tuple = (*lock_args, *count_args, *params)

        async def attempt() -> bool:
            return bool((await self.path.execute(sql, *args)).rows)

        done = await self.path.run("nack", attempt, lambda: self._settled(lease, done_if_gone=False))
        self._finish([lease], [done], "nack")
        return done

    async def _settled(self, lease: Lease, *, done_if_gone: bool) -> bool | None:
        """After an ambiguous ack or nack, what the message's row says happened (see
        `LibsqlTransport._settled`)."""
        rows = (await self.path.execute(f"SELECT locked_by FROM {self.path.queue.messages} WHERE seq = ?", lease.seq)).rows
        if not rows:
            return done_if_gone
        if lease.token and rows[0][0] == lease.token:
            return None
        return not done_if_gone

    def _finish(self, leases: Sequence[Lease], done: Sequence[bool], operation: str) -> None:
        """Forget the leases settled and count them, once for the lot (a lost one is logged)."""
        settled = 0
        for lease, one in zip(leases, done, strict=True):
            self.path.release(lease)
            if one:
                settled += 1
                if self._groups is not None and operation == "ack":
                    self._groups[lease.group_id] += 1
                continue
            observability.record_lost_lease(operation)
            log.warning("lost lease", operation=operation, group_id=lease.group_id, seq=lease.seq)
            if self._report is not None:
                self._report.lost += 1
        if not settled:
            return
        if operation == "ack":
            observability.ACKS.inc(settled)
            observability.EVENTS_HANDLED.inc(settled)
            if self._report is not None:
                self._report.acks += settled
        else:
            observability.NACKS.inc(settled)
            if self._report is not None:
                self._report.nacks += settled

    # ---- inspection and shutdown -----------------------------------------------------------------

    async def depth(self) -> int:
        return int((await self.path.execute(f"SELECT count(*) FROM {self.path.queue.messages}")).rows[0][0])

    async def release_held(self) -> int:
        """Give back every lease not yet settled (at shutdown, after cancelling its handler)."""
        self._buffer.clear()
        released = 0
        for lease in list(self.path.held.values()):
            try:
                if await self.nack(lease):
                    released += 1
            except Exception as exc:  # noqa: BLE001 - its lease lapses by itself; say so
                log.warning("could not give a message back", group_id=lease.group_id, seq=lease.seq, error=str(exc)[:200])
                self.path.release(lease)
        return released

    def group_counts(self) -> dict[str, int]:
        return dict(self._groups or {})

    async def close(self) -> None:
        """The executor is shared with the store; its owner closes it."""


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
        rows = await self._rows(f"SELECT data FROM {self._n.executions} WHERE id = ?", execution_id, operation="store.load")
        return Execution.model_validate_json(rows[0][0]) if rows else None

    async def load_for_event(self, execution_id: str, event_id: str) -> tuple[Execution | None, bool]:
        found = self.path.prefetched.pop((execution_id, event_id), None)
        if found is None:
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
        if lease is not None:
            fence, params = _fence(lease)
            stmts.append(Stmt(f"DELETE FROM {self.path.queue.messages} WHERE {fence} RETURNING seq", params))
        results = await self._write_unit(exe, stmts, "store.commit", emits=emits, lease=lease)
        if lease is not None:
            self.path.acked_by_commit[(lease.seq, lease.token)] = bool(results[-1].rows)
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
        self, exe: Execution, rest: list[Stmt], operation: str, *, emits: list = (), lease: Lease | None = None
    ) -> list[Result]:
        """Write `exe` one version on (compare-and-set on its version) with `rest`, as one
        transaction; returns the results of `rest`. A lost outcome is looked up: the row holds
        exactly what was sent."""
        n = self._n
        old = exe.version
        data = exe.model_copy(update={"version": old + 1}).model_dump_json()
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
                if exc.step < len(write) and (old > 0 or "constraint" in str(exc).lower()):
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
        rows = (await self.path.execute(f"SELECT locked_by FROM {self.path.queue.messages} WHERE seq = ?", lease.seq)).rows
        return not rows


def ack_many_statement(q: EdgeNames, leases: Sequence[Lease]) -> Stmt:
    """One DELETE of the messages the leases (all with tokens) still hold. The `seq IN` list finds
    them by primary key on any SQLite: 3.40's planner scans the whole queue for the row-value test alone."""
    seqs = ", ".join(["?"] * len(leases))
    pairs = ", ".join(["(?, ?)"] * len(leases))
    args = (*(lease.seq for lease in leases), *(v for lease in leases for v in (lease.seq, lease.token)))
    return Stmt(
        f"DELETE FROM {q.messages} WHERE seq IN ({seqs}) AND (seq, locked_by) IN (VALUES {pairs}) RETURNING seq, locked_by",
        args,
    )


def _acked(leases: Sequence[Lease], gone: set[tuple[int, str]]) -> list[bool]:
    """Each lease's answer from the (seq, token) pairs deleted: True once for each pair deleted;
    False for a stale lease of a deleted seq, and for a lease given twice, the second time."""
    answers = []
    for lease in leases:
        key = (lease.seq, lease.token)
        answers.append(key in gone)
        gone.discard(key)
    return answers


def _fence(lease: Lease) -> tuple[str, tuple]:
    if lease.token:
        return "seq = ? AND locked_by = ?", (lease.seq, lease.token)
    return "seq = ?", (lease.seq,)
