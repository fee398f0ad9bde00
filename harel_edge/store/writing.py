"""How the execution store's writes reach the data: an execution's compare-and-set write and what
goes with it, as one unit; for a run, what its members kept, their acks, and at its end the member
it stopped at, the next claim (docs/transport.md, "Runs"). A lost answer is looked up, not resent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harel.engine.execution import Execution
from harel.engine.schema import Names
from harel.engine.store import StoreConflict
from harel.engine.transport import Lease

from harel_edge.executor import Result, StatementError, Stmt
from harel_edge.ids import refuse_nul
from harel_edge.queue import statements as queue_sql
from harel_edge.queue.leases import EventPath
from harel_edge.queue.runs import Run, Write
from harel_edge.store import statements as store_sql


class Writing:
    """The writes of `EventStore`, with their look-ups after an unknown outcome."""

    path: EventPath
    trace_max: int
    _n: Names

    def _execution_write(self, exe: Execution, base: int) -> Write:
        """`exe` one version on, compare-and-set on `base`, the version the database holds."""
        refuse_nul(exe.id, "execution id")
        n = self._n
        old = exe.version
        exe.version = old + 1  # the row's JSON names the version it writes; set in place, not copied
        try:
            data = exe.model_dump_json()
        finally:
            exe.version = old
        if base == 0:
            stmts = [Stmt(n.sql(store_sql.INSERT_EXECUTION), (exe.id, exe.definition_id, data, old + 1))]
        else:
            stmts = [Stmt(n.sql(store_sql.UPDATE_EXECUTION), (data, old + 1, exe.id, base)), Stmt(store_sql.VERSION_GUARD)]
        return Write(exe.id, stmts, base, old + 1, data)

    def _commit_stmts(self, exe: Execution, emits: list, processed: str | None, timers: Any, spawns: Any, trace: Any) -> list[Stmt]:
        """A commit's statements besides the execution's own write, its outbox first."""
        n = self._n
        stmts = [Stmt(n.sql(store_sql.INSERT_OUTBOX), (t, e.model_dump_json())) for t, e in emits]
        if processed is not None:
            stmts.append(Stmt(n.sql(store_sql.MARK_PROCESSED), (exe.id, processed)))
        for child_id, root_path, context in spawns:
            stmts.append(Stmt(n.sql(store_sql.INSERT_SPAWN), (exe.id, child_id, root_path, json.dumps(context))))
        for op in timers:
            if op.action == "schedule":
                stmts.append(Stmt(n.sql(store_sql.SCHEDULE_TIMER), (exe.id, op.path, op.fire_at)))
            else:
                stmts.append(Stmt(n.sql(store_sql.CANCEL_TIMER), (exe.id, op.path)))
        if trace is not None:
            stmts.extend(self._trace_stmts(exe.id, trace))
        return stmts

    def _trace_stmts(self, execution_id: str, entry: dict) -> list[Stmt]:
        n = self._n
        stmts = [Stmt(n.sql(store_sql.APPEND_TRACE), (execution_id, execution_id, json.dumps(entry)))]
        if self.trace_max:
            stmts.append(Stmt(n.sql(store_sql.TRIM_TRACE), (execution_id, execution_id, self.trace_max)))
        return stmts

    # ---- runs --------------------------------------------------------------------------------------

    async def settle(self, run: Run) -> None:
        """Send what a run kept once its handler is done with it. After a failed send, every member
        still held goes back (what was kept was not applied)."""
        if not self._held(run):
            return
        if run.failed:
            await self._give_back(run)
            return
        try:
            await self._send(run, run.write, [])
        except Exception:
            await self._give_back(run)
            raise

    async def _send(
        self, run: Run, write: Write | None, rest: list[Stmt], *, emits: list = (), lease: Lease | None = None
    ) -> list[Result]:
        """One unit: the execution's write, what the run kept, `rest` (the commit of `lease`, a
        member), the acks of the members handled; then at the run's end (its last member, or no
        `lease`) the member it stopped at parked or given back with those after it, and the next
        claim; mid-run, the lease of the members to come renewed. Returns `rest`'s results."""
        q, now = self.path.queue, self.path.now()
        acked = [*run.settled, *([lease] if lease is not None and not (run.settled and run.settled[-1] is lease) else [])]
        last = lease is None or run.is_last(lease)
        tail: list[Stmt] = []
        stopped = run.stopped[0] if last and run.stopped is not None else None
        unhandled = run.unhandled() if last and stopped is None else []  # a halted run's rest
        if not last and run.after(lease):
            tail.append(queue_sql.renew_statement(q, run.after(lease), run.visibility, now))
        elif stopped is not None:
            error = self.path.failures.get((stopped.seq, stopped.token))
            tail.append(queue_sql.nack_statement(q, stopped, run.stopped[1], now, error))
            if run.after(stopped):
                tail.append(queue_sql.give_back_statement(q, run.after(stopped)))
        elif unhandled:
            tail.append(queue_sql.give_back_statement(q, unhandled))
        settling = [*run.pending, *rest]
        rest_at, acked_at = len(run.pending), len(settling)
        if acked:
            settling.append(queue_sql.ack_many_statement(q, acked))
        settling.extend(tail)
        transport = self.path.claimer
        claim = transport.claim_with_commit() if transport is not None and last else None  # for the run's slot
        try:
            results = await self._write_unit(
                write, settling, "store.commit", emits=emits, emits_at=rest_at, acked=acked, acked_at=acked_at
            )
        except BaseException:
            run.failed, run.known = True, False
            raise
        finally:
            if claim is not None:
                transport.commit_ended()
        done = queue_sql.acked(acked, {(row[0], row[1]) for row in results[acked_at].rows}) if acked else []
        if lease is not None:  # harel's ack that follows finds it
            self.path.acked_by_commit[(lease.seq, lease.token)] = done[-1]
        kept = [(member, one) for member, one in zip(acked, done, strict=True) if member is not lease]
        self._finish([member for member, _ in kept], [one for _, one in kept], "ack")
        if stopped is not None:
            self._finish([stopped], [bool(results[acked_at + bool(acked)].rows)], "nack")
            for member in run.after(stopped):
                self.path.release(member)
        for member in unhandled:
            self.path.release(member)
        run.sent(write)
        if claim is not None:  # the leases the claim after this commit took are held when it returns
            await asyncio.shield(claim)
        return results[rest_at : rest_at + len(rest)]

    async def _give_back(self, run: Run) -> None:
        """Every member still held goes back, one unit: the one the run stopped at as its nack says,
        the others untouched (their deliveries not counted); a failure leaves them to lapse."""
        held = self._held(run)
        stopped = run.stopped[0] if run.stopped is not None and run.stopped[0] in held else None
        others = [member for member in held if member is not stopped]
        stmts = [queue_sql.give_back_statement(self.path.queue, others)] if others else []
        if stopped is not None:
            error = self.path.failures.get((stopped.seq, stopped.token))
            stmts.append(queue_sql.nack_statement(self.path.queue, stopped, run.stopped[1], self.path.now(), error))
        try:
            await self.path.run("nack", lambda: self.path.executor.transaction(stmts))
        finally:
            for member in held:
                self.path.release(member)

    def _held(self, run: Run) -> list[Lease]:
        return [member for member in run.members if (member.seq, member.token) in self.path.held]

    def _finish(self, leases: list[Lease], done: list[bool], operation: str) -> None:
        """Count and forget settled leases as the transport does (`Settling.finish`)."""
        if self.path.claimer is not None:
            self.path.claimer.finish(leases, done, operation)
        else:
            for lease in leases:
                self.path.release(lease)

    # ---- one unit ------------------------------------------------------------------------------

    async def _write_unit(
        self,
        write: Write | None,
        rest: list[Stmt],
        operation: str,
        *,
        emits: list = (),
        emits_at: int = 0,
        acked: list[Lease] = (),
        acked_at: int = -1,
    ) -> list[Result]:
        """`write` with `rest` as one transaction; returns `rest`'s results. A lost outcome is
        looked up: the execution's row holds exactly what was sent (without a write, the first
        ack's message is gone)."""
        n = self._n
        head = write.stmts if write is not None else []
        stmts = [*head, *rest]

        async def attempt() -> list[Result]:
            try:
                return (await self.path.executor.transaction(stmts))[len(head) :]
            except StatementError as exc:
                # Step -1 is the BEGIN (the primary's write lock refused: nothing ran), for the retry policy.
                if write is not None and 0 <= exc.step < len(head) and (write.base > 0 or exc.refused_by_a_constraint):
                    rows = (await self.path.execute(n.sql(store_sql.VERSION_OF), write.execution_id)).rows
                    raise StoreConflict(write.execution_id, expected=write.base, found=rows[0][0] if rows else None) from None
                raise

        async def resolve() -> list[Result] | None:
            if write is not None:
                rows = (await self.path.execute(n.sql(store_sql.VERSION_AND_DATA_OF), write.execution_id)).rows
                if not rows or rows[0][0] != write.version or rows[0][1] != write.data:
                    return None
            elif not acked or not await self._message_gone(acked[0]):
                return None
            results = [Result() for _ in rest]
            for i, (target, event) in enumerate(emits):
                found = (await self.path.execute(n.sql(store_sql.OUTBOX_SEQ_OF), target, event.model_dump_json())).rows
                results[emits_at + i] = Result(rows=found or [(0,)])
            if acked:  # the commit landed, and with it each ack whose lease still held
                gone = [(lease.seq, lease.token) for lease in acked if await self._message_gone(lease)]
                results[acked_at] = Result(rows=gone)
            return results

        return await self.path.run(operation, attempt, resolve)

    async def _message_gone(self, lease: Lease) -> bool:
        rows = (await self.path.execute(queue_sql.lock_of_sql(self.path.queue), lease.seq)).rows
        return not rows
