"""The checkpoint store's statements: each read or fenced write of a workflow's records and claim
is one statement, decided on the primary by its clock (docs/durable.md)."""

from __future__ import annotations

from harel_edge.schema import now_table
from harel_edge.schema_control import CANCELLED

# Every statement gets the current time as one parameter: a number from an injected clock, or
# NULL for the database's own. `t.now` is then one value for the whole statement.


def _now(n: int) -> str:
    return now_table(f"?{n}")


LOAD = "SELECT step, value FROM workflow_checkpoint WHERE workflow = ? ORDER BY seq"
HISTORY = "SELECT step, value, written_at FROM workflow_checkpoint WHERE workflow = ? ORDER BY seq"
LOOKUP = "SELECT value FROM workflow_checkpoint WHERE workflow = ? AND step = ?"
IS_CANCELLED = f"SELECT 1 WHERE {CANCELLED.format(w='?1')}"

# A new claim wins only over one that is not alive (lapsed, released, or past its budget), and
# never for a cancelled workflow. The token is one more than the last, so every write of an
# older pass is refused from now on.
CLAIM = f"""
INSERT INTO workflow_claim (workflow, token, held_until, alive_until, alive_for)
SELECT ?1, 1, t.now + ?2, t.now + MIN(?2, ?3), ?3 FROM {_now(4)} WHERE NOT {CANCELLED.format(w="?1")}
ON CONFLICT (workflow) DO UPDATE SET
    token = workflow_claim.token + 1,
    held_until = excluded.held_until,
    alive_until = excluded.alive_until,
    alive_for = excluded.alive_for
WHERE workflow_claim.alive_until <= excluded.held_until - ?2
RETURNING token, held_until
"""

# The fence for every holder's write: the token is current and the budget is not spent.
EXTEND = f"""
UPDATE workflow_claim SET held_until = t.now + ?3, alive_until = t.now + MIN(?3, ?4), alive_for = ?4
FROM {_now(5)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING held_until
"""

# A sign of life: never past the budget, and nothing at all once released (held_until <= now).
RENEW = f"""
UPDATE workflow_claim SET alive_until = MIN(t.now + ?3, held_until), alive_for = ?3
FROM {_now(4)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING alive_until
"""

RELEASE = f"""
UPDATE workflow_claim SET held_until = MIN(held_until, t.now), alive_until = MIN(alive_until, t.now)
FROM {_now(3)}
WHERE workflow = ?1 AND token = ?2
"""

# Fence, first-write-wins insert and sign of life in one statement (the view's trigger).
# `held` and `existed` are evaluated before the trigger; RETURNING's subqueries after it.
RECORD = f"""
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
TRANSACT_FENCE = f"""
UPDATE workflow_claim SET alive_until = MIN(t.now + alive_for, held_until)
FROM {_now(4)}
WHERE workflow = ?1 AND token = ?2 AND held_until > t.now
RETURNING (SELECT value FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?3)
"""

# SqlEffect guards: json() of a non-JSON text fails the statement, aborting the unit when the
# fence failed, the step is already recorded, or the record was not written.
HELD_GUARD = "SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('fenced') END"
NOT_RECORDED_GUARD = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2) "
    "THEN json('recorded') ELSE 1 END"
)
RECORDED_GUARD = (
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
