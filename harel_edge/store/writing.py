"""How the execution store's writes reach the data: an execution's compare-and-set write and what
goes with it, as one unit, with what the queue adds to it (queue/carrying.py). A lost answer is
looked up, not resent."""

from __future__ import annotations

import json
from typing import Any

from harel.engine.execution import Execution
from harel.engine.schema import Names
from harel.engine.store import StoreConflict

from harel_edge import retry
from harel_edge.executor import Executor, Result, StatementError, Stmt
from harel_edge.ids import refuse_nul
from harel_edge.queue.carrying import Acks
from harel_edge.queue.runs import Write
from harel_edge.settings import EdgeSettings
from harel_edge.store import statements as store_sql


class Writing:
    """The writes of `EventStore`, with their look-ups after an unknown outcome."""

    executor: Executor
    settings: EdgeSettings
    trace_max: int
    _n: Names

    async def _run(self, operation: str, attempt: Any, resolve: Any = None) -> Any:
        """`attempt` under the retry policy; after an unknown outcome `resolve` looks it up first."""
        return await retry.acall_with_retry(self.settings, operation, attempt, resolve=resolve)

    async def _execute(self, sql: str, *args: Any) -> Result:
        return await self.executor.execute(Stmt(sql, tuple(args)))

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

    # ---- one unit ------------------------------------------------------------------------------

    async def _write_unit(
        self,
        write: Write | None,
        rest: list[Stmt],
        operation: str = "store.commit",
        *,
        emits: list = (),
        emits_at: int = 0,
        acks: Acks | None = None,
    ) -> list[Result]:
        """`write` with `rest` as one transaction; returns `rest`'s results. A lost outcome is
        looked up: the execution's row holds exactly what was sent (without a write, the first
        ack's message is gone)."""
        n = self._n
        head = write.stmts if write is not None else []
        stmts = [*head, *rest]

        async def attempt() -> list[Result]:
            try:
                return (await self.executor.transaction(stmts))[len(head) :]
            except StatementError as exc:
                # Step -1 is the BEGIN (the primary's write lock refused: nothing ran), for the retry policy.
                if write is not None and 0 <= exc.step < len(head) and (write.base > 0 or exc.refused_by_a_constraint):
                    rows = (await self._execute(n.sql(store_sql.VERSION_OF), write.execution_id)).rows
                    raise StoreConflict(write.execution_id, expected=write.base, found=rows[0][0] if rows else None) from None
                raise

        async def resolve() -> list[Result] | None:
            if write is not None:
                rows = (await self._execute(n.sql(store_sql.VERSION_AND_DATA_OF), write.execution_id)).rows
                if not rows or rows[0][0] != write.version or rows[0][1] != write.data:
                    return None
            gone = await acks.gone() if acks is not None else []
            if write is None and (acks is None or (acks.leases[0].seq, acks.leases[0].token) not in gone):
                return None
            results = [Result() for _ in rest]
            for i, (target, event) in enumerate(emits):
                found = (await self._execute(n.sql(store_sql.OUTBOX_SEQ_OF), target, event.model_dump_json())).rows
                results[emits_at + i] = Result(rows=found or [(0,)])
            if acks is not None:  # the commit landed, and with it each ack whose lease still held
                results[acks.at] = Result(rows=gone)
            return results

        return await self._run(operation, attempt, resolve)
