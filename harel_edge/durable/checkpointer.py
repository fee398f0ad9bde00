"""LibsqlCheckpointer: a workflow's steps as rows, and its claim as a fenced row beside them.

Every write is checked against the claim's token in the statement that writes (checkpoint_statements.py, docs/durable.md).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from harel_edge.connection import EdgeConnection
from harel_edge.durable import checkpoint_statements as sql
from harel_edge.durable.database import Database, execute_many
from harel_edge.durable.types import (
    INBOX,
    JSON,
    CheckpointCodec,
    Entry,
    FencedError,
    Pass,
    Recorded,
    Written,
    from_seconds,
    to_seconds,
)
from harel_edge.executor import StatementError, Stmt
from harel_edge.ids import refuse_nul


class Transaction:
    """What a `transact` effect gets: statements that commit with the step's record, or not at all.

    Never COMMIT or ROLLBACK through it; keep it short (remotely it holds the primary's write lock).
    """

    def __init__(self, connection: EdgeConnection) -> None:
        self._connection = connection

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        """Run one statement in the transaction; its rows (RETURNING rows too)."""
        return self._connection.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[tuple | list]) -> None:
        """Run one statement once per row of parameters, inside the transaction like `execute`."""
        execute_many(self._connection, sql, rows)


@dataclass(frozen=True, init=False)
class SqlEffect:
    """An effect given as statements, and the value the step records: sent with the step's
    fence and record as one unit, so a remote primary sees one request and no open transaction."""

    statements: tuple[Stmt, ...]
    value: object

    def __init__(self, *statements: Stmt | tuple[str, tuple] | str, value: object = None) -> None:
        stmts = tuple(s if isinstance(s, Stmt) else Stmt(s) if isinstance(s, str) else Stmt(s[0], tuple(s[1])) for s in statements)
        object.__setattr__(self, "statements", stmts)
        object.__setattr__(self, "value", value)


LibsqlEffect = Callable[[Transaction], object] | SqlEffect


def new_inbox_key() -> str:
    """A key for a new inbox entry, made by the sender so that retrying a send is idempotent.

    Time-ordered for people reading the table; the inbox's order is the table's `seq`.
    """
    return f"{INBOX}{time.time_ns():020d}-{secrets.token_hex(4)}"


@dataclass(eq=False)
class LibsqlCheckpointer:
    """The checkpoint store: load, claim, and fenced writes of a workflow's records.

    `codec` turns a result into the row's TEXT (JSON by default); `now` replaces the database's clock.
    """

    database: Database
    codec: CheckpointCodec[str] = JSON
    now: Callable[[], datetime] | None = field(default=None, repr=False)

    def clock_param(self) -> float | None:
        """The injected clock's time as a statement parameter, or None for the database's own."""
        return None if self.now is None else to_seconds(self.now())

    # ---- reading ---------------------------------------------------------------------------

    async def load(self, workflow: str) -> dict[str, object]:
        """Every record of the workflow, in the order they were written (read on the primary)."""
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.load", sql.LOAD, (workflow,))
        return {step: self.codec.decode(value) for step, value in rows}

    async def history(self, workflow: str) -> dict[str, Written]:
        """The same records as `load`, each with when it was written (by the writer's clock)."""
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.history", sql.HISTORY, (workflow,))
        return {
            step: Written(self.codec.decode(value), from_seconds(written_at))
            for step, value, written_at in rows
        }

    # ---- the claim ---------------------------------------------------------------------------

    async def claim(self, workflow: str, budget: timedelta, alive: timedelta) -> Pass | None:
        """Take the workflow for a pass, or None while another pass holds it.

        `budget` is the most the claim can last; `alive` how long it lasts without a sign of life.
        """
        refuse_nul(workflow, "workflow id")
        budget_s, alive_s = _positive(budget, "budget"), _positive(alive, "alive")
        rows = await self.database.execute("durable.claim", sql.CLAIM, (workflow, budget_s, alive_s, self.clock_param()))
        if not rows:
            return None
        token, held_until = rows[0]
        return Pass(workflow, int(token), from_seconds(held_until), alive)

    async def extend(self, holder: Pass, budget: timedelta, alive: timedelta) -> bool:
        """Give the claim a new budget from now; False if it is no longer this pass's."""
        budget_s, alive_s = _positive(budget, "budget"), _positive(alive, "alive")
        rows = await self.database.execute("durable.extend", sql.EXTEND, (holder.workflow, holder.token, budget_s, alive_s, self.clock_param()))
        return bool(rows)

    async def renew(self, holder: Pass, alive: timedelta) -> bool:
        """A sign of life: keep the claim `alive` more, capped at its budget.

        False once the claim is not this pass's (taken over, released, out of budget); it never revives one.
        """
        alive_s = _positive(alive, "alive")
        rows = await self.database.execute("durable.renew", sql.RENEW, (holder.workflow, holder.token, alive_s, self.clock_param()))
        return bool(rows) and rows[0][0] is not None

    async def cancelled(self, workflow: str) -> bool:
        """Whether the workflow is cancelled (then no claim is granted until it is resumed)."""
        return bool(await self.database.execute("durable.cancelled", sql.IS_CANCELLED, (workflow,)))

    async def release(self, holder: Pass) -> None:
        """Give the workflow up now, so the next pass need not wait for the claim to lapse."""
        await self.database.execute("durable.release", sql.RELEASE, (holder.workflow, holder.token, self.clock_param()))

    # ---- writing -----------------------------------------------------------------------------

    async def record(self, holder: Pass, key: str, value: object) -> Recorded:
        """Store a step's result if `holder` still holds the workflow; a sign of life as well.

        `FencedError` when superseded; the first write of a key wins (`fresh=False` returns the stored value).
        """
        refuse_nul(key, "step name")
        text = self.codec.encode(value)
        rows = await self.database.execute("durable.record", sql.RECORD, (holder.workflow, key, text, holder.token, self.clock_param()))
        held, existed, stored, written_at = rows[0]
        if not held:
            raise FencedError(_fenced(holder.workflow, holder.token))
        return Recorded(key, self.codec.decode(stored), from_seconds(written_at), fresh=not existed)

    async def transact(self, holder: Pass, key: str, effect: LibsqlEffect) -> object:
        """Run `effect` and record its result in one transaction, so the step happens exactly once.

        An unknown outcome is settled by looking the step's row up before retrying (docs/durable-design.md).
        """
        refuse_nul(key, "step name")
        if isinstance(effect, SqlEffect):
            return await self._transact_sql(holder, key, effect)
        stored = await self.database.call(
            "durable.transact",
            _transact,
            holder.workflow,
            holder.token,
            key,
            effect,
            self.codec,
            self.now,
            resolve=_committed,
        )
        return self.codec.decode(stored)

    async def _transact_sql(self, holder: Pass, key: str, effect: SqlEffect) -> object:
        """Fence, replay check, the effect's statements and the record as ONE unit of work."""
        workflow, token = holder.workflow, holder.token
        text = self.codec.encode(effect.value)
        at = self.clock_param()
        stmts = [
            Stmt(sql.TRANSACT_FENCE, (workflow, token, key, at)),
            Stmt(sql.HELD_GUARD),
            Stmt(sql.NOT_RECORDED_GUARD, (workflow, key)),
            *effect.statements,
            Stmt(sql.RECORD, (workflow, key, text, token, at)),
            Stmt(sql.RECORDED_GUARD, (workflow, key)),
        ]

        async def recorded() -> str | None:
            rows = await self.database.execute("durable.transact.lookup", sql.LOOKUP, (workflow, key))
            return rows[0][0] if rows else None

        try:
            results = await self.database.transaction("durable.transact", stmts, resolve=recorded)
        except StatementError as exc:
            if exc.step == 1 or exc.step == len(stmts) - 1:
                raise FencedError(_fenced(workflow, token)) from None
            if exc.step == 2:  # a replay: recorded already, nothing was performed
                stored = await recorded()
                if stored is not None:
                    return self.codec.decode(stored)
            if not 3 <= exc.step < len(stmts) - 2:  # BEGIN, the fence, the record or COMMIT itself
                raise
            raise StatementError(
                f"statement {exc.step - 3} of the effect of step {key!r} failed, so nothing of the step "
                f"was applied: {exc}",
                step=exc.step - 3,
                code=exc.code,
            ) from None
        if isinstance(results, str):  # looked up after an unknown outcome
            return self.codec.decode(results)
        return self.codec.decode(results[-2].rows[0][2])

    async def supply(self, workflow: str, key: str, value: object) -> object:
        """File a value under `key` from outside the workflow (no claim needed).

        The first value wins and is returned, so a retried webhook is harmless.
        """
        refuse_nul(workflow, "workflow id")
        refuse_nul(key, "key")
        text = self.codec.encode(value)
        rows = await self.database.execute("durable.supply", sql.ARRIVE, (workflow, key, text, None, self.clock_param()))
        return self.codec.decode(rows[0][0])

    async def append(self, workflow: str, value: object, key: str | None = None) -> Entry:
        """File `value` in the workflow's inbox under a new key (or `key`, to make a retry idempotent).

        Inbox entries are records under `inbox/`, returned by `load` in commit order.
        """
        key = key or new_inbox_key()
        stored = await self.supply(workflow, key, value)
        return Entry(key, stored)

    async def discard(self, workflow: str) -> int:
        """Forget every record of the workflow and raise its fence, in one commit; returns how many there were.

        Why one commit: docs/durable-design.md ("Deleting a workflow").
        """
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.discard", sql.DISCARD, (workflow, None, self.clock_param()))
        return int(rows[0][0])


def _positive(span: timedelta, name: str) -> float:
    seconds = span.total_seconds()
    if seconds <= 0:
        raise ValueError(f"{name}={span} must be a positive duration")
    return seconds


def _fenced(workflow: str, token: int) -> str:
    return (
        f"workflow {workflow!r}: pass {token} no longer holds it (taken over, released, "
        "or out of budget); stop this pass, the workflow continues in the one that holds it"
    )


# ---- the work `Database.call` runs on a thread: on a local file with its libsql connection,
# remotely with a StreamConnection, one interactive Hrana stream (harel_edge.durable.database) ----


def _transact(
    connection: EdgeConnection,
    workflow: str,
    token: int,
    key: str,
    effect: LibsqlEffect,
    codec: CheckpointCodec[str],
    now: Callable[[], datetime] | None,
) -> str:
    """One attempt of `transact`: fence, replay check, effect, record and COMMIT in one transaction.

    `now` is read again at the record, so its sign of life dates from the effect's end.
    """

    def at() -> float | None:
        return None if now is None else to_seconds(now())

    connection.execute("BEGIN IMMEDIATE")
    try:
        rows = connection.execute(sql.TRANSACT_FENCE, (workflow, token, key, at()))
        if not rows:
            raise FencedError(_fenced(workflow, token))
        if rows[0][0] is not None:  # a replay: recorded already, perform nothing
            connection.execute("ROLLBACK")
            return rows[0][0]
        result = effect(Transaction(connection))
        text = codec.encode(result)
        held, _, stored, _ = connection.execute(sql.RECORD, (workflow, key, text, token, at()))[0]
        if not held:  # the budget ran out while the effect ran
            raise FencedError(_fenced(workflow, token))
        connection.execute("COMMIT")
        return stored
    except BaseException:
        _roll_back(connection)
        raise


def _committed(connection: EdgeConnection, workflow: str, token: int, key: str, *_: object) -> str | None:
    """After a `transact` attempt failed somewhere unknown: is the step's row on the primary?"""
    rows = connection.execute(sql.LOOKUP, (workflow, key))
    return rows[0][0] if rows else None


def _roll_back(connection: EdgeConnection) -> None:
    """Best effort, so a failed transaction is not left open; the retry policy's recovery
    replaces a connection that cannot even roll back."""
    try:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the rollback's own failure tells nothing new
        pass
