"""LibsqlCheckpointer: a workflow's completed steps as rows, and its claim as a row beside them.

A pass of a workflow first `claim`s it and gets a `Pass` carrying a fencing token; every write
it makes is checked against the current token in the same statement that writes, so a pass
whose claim lapsed and was taken over cannot write anything afterwards, on any profile,
whatever its clock or the replica it reads from say.

Each operation is ONE statement except `transact`, which must run a caller's effect between
its checks and its record. One statement is one commit and one round trip to a remote
primary, and it needs no interactive transaction (which sqld aborts after 5 s when another
writer waits, and which leaves ambiguous commits behind on a flaky link). Where one statement
must write two tables, it inserts into a view whose INSTEAD OF trigger does the writes
(`harel_edge.schema.durable_writes`), and its RETURNING clause reports the outcome.

Deadlines (budget, liveness) are computed by the database's clock (`schema.DB_NOW`, evaluated
inside the statement): on sqld and replica that is the primary's clock, one clock for every
worker. Pass `now=` to use another clock (tests drive time this way on the local profile).

Workflow ids and keys are bound as parameters and never parsed: any string is an id, except
one holding a NUL, which the driver would read back cut short and which is refused.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from harel_edge.connection import EdgeConnection
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
from harel_edge.schema import DB_NOW

# Every statement gets the current time as one parameter: a number from an injected clock, or
# NULL for the database's own. `t.now` is then one value for the whole statement.
_NOW = "(SELECT COALESCE(?{n}, " + DB_NOW + ") AS now) AS t"


def _now(n: int) -> str:
    return _NOW.format(n=n)


_LOAD = "SELECT step, value FROM workflow_checkpoint WHERE workflow = ? ORDER BY seq"
_HISTORY = "SELECT step, value, written_at FROM workflow_checkpoint WHERE workflow = ? ORDER BY seq"
_LOOKUP = "SELECT value FROM workflow_checkpoint WHERE workflow = ? AND step = ?"

# A new claim wins only over one that is not alive (lapsed, released, or past its budget).
# The token is one more than the last, so every write of an older pass is refused from now on.
_CLAIM = f"""
INSERT INTO workflow_claim (workflow, token, held_until, alive_until, alive_for)
SELECT ?1, 1, t.now + ?2, t.now + MIN(?2, ?3), ?3 FROM {_now(4)} WHERE true
ON CONFLICT (workflow) DO UPDATE SET
    token = workflow_claim.token + 1,
    held_until = excluded.held_until,
    alive_until = excluded.alive_until,
    alive_for = excluded.alive_for
WHERE workflow_claim.alive_until <= excluded.held_until - ?2
RETURNING token, held_until
"""

# The fence for every holder's write: the token is current and the budget is not spent.
_EXTEND = f"""
UPDATE workflow_claim SET held_until = t.now + ?3, alive_until = t.now + MIN(?3, ?4), alive_for = ?4
FROM {_now(5)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING held_until
"""

# A sign of life: never past the budget, and nothing at all once released (held_until <= now).
_RENEW = f"""
UPDATE workflow_claim SET alive_until = MIN(t.now + ?3, held_until), alive_for = ?3
FROM {_now(4)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING alive_until
"""

_RELEASE = f"""
UPDATE workflow_claim SET held_until = MIN(held_until, t.now), alive_until = MIN(alive_until, t.now)
FROM {_now(3)}
WHERE workflow = ?1 AND token = ?2
"""

# Fence, first-write-wins insert and sign of life in one statement (the view's trigger).
# `held` and `existed` are evaluated before the trigger; RETURNING's subqueries after it.
_RECORD = f"""
INSERT INTO workflow_record (workflow, step, value, written_at, token, held, existed)
SELECT ?1, ?2, ?3, t.now, ?4,
    EXISTS (SELECT 1 FROM workflow_claim WHERE workflow = ?1 AND token = ?4 AND held_until > t.now),
    EXISTS (SELECT 1 FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2)
FROM {_now(5)}
RETURNING held, existed,
    (SELECT value FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2),
    (SELECT written_at FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2)
"""

# transact's first statement, inside its transaction: fence and sign of life, and whether the
# step is already recorded (a replay), in one write that a replica delegates to the primary.
_TRANSACT_FENCE = f"""
UPDATE workflow_claim SET alive_until = MIN(t.now + alive_for, held_until)
FROM {_now(4)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING (SELECT value FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?3)
"""

# The guards of an SqlEffect's unit: each fails its statement (json() of a non-JSON text) to abort
# the unit when the fence did not hold, when the step is already recorded, or when the record
# was not written (the budget ran out).
_HELD_GUARD = "SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('fenced') END"
_NOT_RECORDED_GUARD = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2) "
    "THEN json('recorded') ELSE 1 END"
)
_RECORDED_GUARD = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2) "
    "THEN 1 ELSE json('fenced') END"
)

# A write from outside the workflow; with a namespace it also makes the workflow ready.
ARRIVE = f"""
INSERT INTO workflow_arrival (workflow, step, value, written_at, namespace, visible_at)
SELECT ?1, ?2, ?3, t.now, ?4, t.now FROM {_now(5)}
RETURNING (SELECT value FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2)
"""

# Forget the records, raise the fence; with a namespace also drop the queue row.
DISCARD = f"""
INSERT INTO workflow_discard (workflow, namespace, at, records)
SELECT ?1, ?2, t.now, (SELECT count(*) FROM workflow_checkpoint WHERE workflow = ?1) FROM {_now(3)}
RETURNING records
"""


class Transaction:
    """What a `transact` effect gets: statements inside the step's open transaction.

    Everything executed here commits together with the step's record, or not at all. Do not
    COMMIT or ROLLBACK through it, and keep it short: on a remote primary the transaction holds
    the write lock across round trips, and sqld aborts it after 5 s if another writer waits.
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

    `codec` turns a step's result into the row's TEXT and back; the default is JSON. `now`
    replaces the database's clock (None) with another, for tests.
    """

    database: Database
    codec: CheckpointCodec[str] = JSON
    now: Callable[[], datetime] | None = field(default=None, repr=False)

    def clock_param(self) -> float | None:
        """The injected clock's time as a statement parameter, or None for the database's own."""
        return None if self.now is None else to_seconds(self.now())

    # ---- reading ---------------------------------------------------------------------------

    async def load(self, workflow: str) -> dict[str, object]:
        """Every record of the workflow, in the order they were written.

        On a replica this syncs first: a pass must see what earlier passes recorded, wherever
        they ran.
        """
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.load", _LOAD, (workflow,))
        return {step: self.codec.decode(value) for step, value in rows}

    async def history(self, workflow: str) -> dict[str, Written]:
        """The same records as `load`, each with when it was written (by the writer's clock)."""
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.history", _HISTORY, (workflow,))
        return {
            step: Written(self.codec.decode(value), from_seconds(written_at))
            for step, value, written_at in rows
        }

    # ---- the claim ---------------------------------------------------------------------------

    async def claim(self, workflow: str, budget: timedelta, alive: timedelta) -> Pass | None:
        """Take the workflow for a pass, or None while another pass holds it.

        `budget` is the most the claim can last; `alive` how long it lasts without a sign of
        life (`renew`, `record`, `transact`). It can be taken over once it is not alive.
        """
        refuse_nul(workflow, "workflow id")
        budget_s, alive_s = _positive(budget, "budget"), _positive(alive, "alive")
        rows = await self.database.execute("durable.claim", _CLAIM, (workflow, budget_s, alive_s, self.clock_param()))
        if not rows:
            return None
        token, held_until = rows[0]
        return Pass(workflow, int(token), from_seconds(held_until), alive)

    async def extend(self, holder: Pass, budget: timedelta, alive: timedelta) -> bool:
        """Give the claim a new budget from now; False if it is no longer this pass's."""
        budget_s, alive_s = _positive(budget, "budget"), _positive(alive, "alive")
        rows = await self.database.execute("durable.extend", _EXTEND, (holder.workflow, holder.token, budget_s, alive_s, self.clock_param()))
        return bool(rows)

    async def renew(self, holder: Pass, alive: timedelta) -> bool:
        """A sign of life: keep the claim for `alive` more, capped at its budget.

        False when the claim is not this pass's any more: taken over, released, or out of
        budget. A renewal never revives a released claim and never lengthens the budget.
        """
        alive_s = _positive(alive, "alive")
        rows = await self.database.execute("durable.renew", _RENEW, (holder.workflow, holder.token, alive_s, self.clock_param()))
        return bool(rows) and rows[0][0] is not None

    async def release(self, holder: Pass) -> None:
        """Give the workflow up now, so the next pass need not wait for the claim to lapse."""
        await self.database.execute("durable.release", _RELEASE, (holder.workflow, holder.token, self.clock_param()))

    # ---- writing -----------------------------------------------------------------------------

    async def record(self, holder: Pass, key: str, value: object) -> Recorded:
        """Store a step's result, if `holder` still holds the workflow; a sign of life as well.

        Raises `FencedError` when the pass was superseded. The first write of a key wins: a
        second one leaves the row alone and returns the stored value with `fresh=False`.
        """
        refuse_nul(key, "step name")
        text = self.codec.encode(value)
        rows = await self.database.execute("durable.record", _RECORD, (holder.workflow, key, text, holder.token, self.clock_param()))
        held, existed, stored, written_at = rows[0]
        if not held:
            raise FencedError(_fenced(holder.workflow, holder.token))
        return Recorded(key, self.codec.decode(stored), from_seconds(written_at), fresh=not existed)

    async def transact(self, holder: Pass, key: str, effect: LibsqlEffect) -> object:
        """Run `effect` and record its result in one transaction, so the step happens once.

        In order, under the write lock of one BEGIN IMMEDIATE transaction: the fence (a
        superseded pass must not act), the existence check (a recorded step is not run again,
        so a replay performs nothing), the effect, and the record with a sign of life. An
        exception anywhere rolls the effect back with its record.

        On sqld and replica the outcome can be unknown (the primary applied the COMMIT and the
        reply was lost). The step's row answers that, because it commits with the effect or not
        at all: after a transient failure the connection is repaired (a replica synced) and the
        row looked up on the primary; found, the transaction committed and its value is
        returned; absent, nothing happened and the attempt runs again, under the retry policy
        of `harel_edge.retry`. If the policy gives up, the error is raised and the step may or
        may not have committed; whatever retries it later finds out the same way, since its
        existence check runs inside its own transaction.

        The effect holds the connection, and on a remote primary the write lock, until it
        returns: nothing else of this process reaches the store meanwhile, the pass's own
        renewals included. The record at the end is a sign of life that lands before any
        claim waiting for the lock, so a long effect does not lose the claim by itself. Keep
        effects short anyway (sqld aborts a transaction after 5 s when another writer waits).
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
            Stmt(_TRANSACT_FENCE, (workflow, token, key, at)),
            Stmt(_HELD_GUARD),
            Stmt(_NOT_RECORDED_GUARD, (workflow, key)),
            *effect.statements,
            Stmt(_RECORD, (workflow, key, text, token, at)),
            Stmt(_RECORDED_GUARD, (workflow, key)),
        ]

        async def recorded() -> str | None:
            rows = await self.database.execute("durable.transact.lookup", _LOOKUP, (workflow, key))
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

        The first value for a key wins; the stored one is returned, so supplying twice (a
        retried webhook, say) is harmless.
        """
        refuse_nul(workflow, "workflow id")
        refuse_nul(key, "key")
        text = self.codec.encode(value)
        rows = await self.database.execute("durable.supply", ARRIVE, (workflow, key, text, None, self.clock_param()))
        return self.codec.decode(rows[0][0])

    async def append(self, workflow: str, value: object, key: str | None = None) -> Entry:
        """File `value` in the workflow's inbox under a new key (or `key`, to make a retry idempotent).

        Inbox entries are ordinary records whose keys start with `inbox/`; their order is the
        order they were committed in, which is the order `load` returns them.
        """
        key = key or new_inbox_key()
        stored = await self.supply(workflow, key, value)
        return Entry(key, stored)

    async def discard(self, workflow: str) -> int:
        """Forget every record of the workflow and raise its fence, in one commit.

        One commit, because the two are only right together: records deleted under an
        unraised fence would be written back one by one by a pass still in flight, and a fence
        raised over records that stay would stop a live pass for a deletion that never
        happened. Returns how many records there were. A released claim row carrying the
        raised number stays behind; nothing sweeps it.
        """
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.discard", DISCARD, (workflow, None, self.clock_param()))
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


# ---- the work functions: module-level, so that on sqld and replica they run whole in the
# Database's worker process, next to the connection (see harel_edge.durable.database) ----------


def _transact(
    connection: EdgeConnection,
    workflow: str,
    token: int,
    key: str,
    effect: LibsqlEffect,
    codec: CheckpointCodec[str],
    now: Callable[[], datetime] | None,
) -> str:
    """One attempt of `transact`: fence, replay check, effect, record, COMMIT, in one transaction.

    `now` is read at the fence and again at the record, so the sign of life the record gives
    is measured when the effect has ended.
    """

    def at() -> float | None:
        return None if now is None else to_seconds(now())

    connection.execute("BEGIN IMMEDIATE")
    try:
        rows = connection.execute(_TRANSACT_FENCE, (workflow, token, key, at()))
        if not rows:
            raise FencedError(_fenced(workflow, token))
        if rows[0][0] is not None:  # a replay: recorded already, perform nothing
            connection.execute("ROLLBACK")
            return rows[0][0]
        result = effect(Transaction(connection))
        text = codec.encode(result)
        held, _, stored, _ = connection.execute(_RECORD, (workflow, key, text, token, at()))[0]
        if not held:  # the budget ran out while the effect ran
            raise FencedError(_fenced(workflow, token))
        connection.execute("COMMIT")
        return stored
    except BaseException:
        _roll_back(connection)
        raise


def _committed(connection: EdgeConnection, workflow: str, token: int, key: str, *_: object) -> str | None:
    """After a `transact` attempt failed somewhere unknown: is the step's row on the primary?"""
    rows = connection.execute(_LOOKUP, (workflow, key))
    return rows[0][0] if rows else None


def _roll_back(connection: EdgeConnection) -> None:
    """Best effort, so a failed transaction is not left open; the retry policy's recovery
    replaces a connection that cannot even roll back."""
    try:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the rollback's own failure tells nothing new
        pass
