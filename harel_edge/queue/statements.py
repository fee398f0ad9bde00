"""The queue's SQL: every operation is one statement decided on the primary, by its clock.

Why each has the shape it has: docs/transport.md.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from harel.engine.transport import Lease
from harel.spec.states import Event
from pydantic_core import from_json

from harel_edge import migrations, schema
from harel_edge.errors import SchemaError
from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.schema import DB_NOW, PARKED, EdgeNames, dead_letters_table, now_or, now_table

MAX_PRIORITY = 4
# Rows per multi-row INSERT of a batch publish: 8 parameters a row stays far below SQLite's
# 32,766 bound variables, and one statement (a few hundred KB) stays one modest HTTP request.
BATCH_ROWS = 2000
ACK_ROWS = 2000  # leases in one DELETE of `ack_many`: 3 parameters each
# Each claim's stamp is after every earlier one (its clock's now, or a step past the latest stamp
# when the clock has not moved), and the leases of one claim_many are a step apart in the order
# they were chosen: groups served together take their next turn in that order (fair ties).
RANK_STEP = 1e-6


@dataclass(frozen=True)
class Message:
    """One message of a batch publish."""

    group_id: str
    event: Event
    priority: int = 0
    routing_key: str | None = None


def claim_sql(n: EdgeNames, routing_keys: int, *, many: bool = False, returning: str = "") -> str:
    """The claim in one statement: the spec's selection and its lease (`many`: up to `?7` groups'
    heads). Parameters: token, now, visibility, min_priority, keys as a JSON array (any number of
    them: one parameter), now[, n]. Its cost is flat in the groups waiting."""
    keyed = bool(routing_keys)
    now, limit = now_or("?6"), "?7" if many else "1"
    # INDEXED BY: a walk must never become a scan in last-claim order, whatever the statistics.
    index = n.routing_index if keyed else n.free_index
    head = f"JOIN {n.messages} m ON m.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = g.group_id)"
    free = f"(m.locked_by IS NULL OR m.lock_expiry < {now})"
    order = f"ORDER BY g.last_claimed_at, g.rowid LIMIT {limit}"
    # The priorities from the floor to 4, and the keys (DISTINCT: a key given twice counts once).
    ctes = "pr(p) AS (SELECT MAX(?4, 0) WHERE ?4 <= 4 UNION ALL SELECT p + 1 FROM pr WHERE p < 4)"
    source, of_key = "pr", ""
    if keyed:
        ctes += ", ks(k) AS (SELECT DISTINCT value FROM json_each(?5))"
        source, of_key = "pr CROSS JOIN ks", " AND g.routing_key = ks.k"
    # No LATERAL in SQLite: each (priority, key)'s walk is a correlated IN subquery.
    walks = (
        f"SELECT g.last_claimed_at AS c, g.rowid AS r, m.seq AS seq FROM {source} CROSS JOIN {n.groups} g {head}"
        f" WHERE g.rowid IN (SELECT g.rowid FROM {n.groups} g INDEXED BY {index} {head}"
        f" WHERE g.claimable_at IS NULL AND g.priority = pr.p{of_key} AND {free} {order})"
    )
    # The groups whose lease or park has ended (few: each claim frees those it finds), and
    # those of a priority above 4 (none unless harel's own publish wrote one). Two walks, not an
    # OR, which the planner may turn into a scan of every group of the key.
    others = " UNION ALL ".join(
        f"SELECT * FROM (SELECT g.last_claimed_at AS c, g.rowid AS r, m.seq AS seq"
        f" FROM {'ks CROSS JOIN ' if keyed else ''}{n.groups} g INDEXED BY {index} {head}"
        f" WHERE {which}{of_key} AND g.priority >= MAX(?4, 0) AND {free} {order})"
        for which in (f"g.claimable_at < {now}", f"g.claimable_at IS NULL AND g.priority > {MAX_PRIORITY}")
    )
    claim_now = f"COALESCE(?2, {DB_NOW})"
    base = f"MAX({claim_now}, COALESCE((SELECT MAX(last_claimed_at) FROM {n.groups}), 0) + {RANK_STEP})"
    return (
        f"WITH RECURSIVE {ctes}, pick(seq, rank) AS (SELECT seq, row_number() OVER (ORDER BY c, r) - 1"
        f" FROM (SELECT * FROM ({walks} UNION ALL {others}) ORDER BY c, r LIMIT {limit})),"
        f" b(base) AS (SELECT {base})"
        f" UPDATE {n.messages} SET locked_by = ?1, claimed_at = b.base + pick.rank * {RANK_STEP},"
        f" lock_expiry = {claim_now} + ?3"
        f" FROM pick CROSS JOIN b WHERE {n.messages}.seq = pick.seq"
        f" RETURNING seq, group_id, event{returning}"
    )


def claim_params(
    worker_id: str, visibility: float, min_priority: int, keys: Sequence[str], now: float | None
) -> tuple[str, tuple]:
    """A fresh claim token and the claim statement's parameters; refuses bad arguments."""
    if not visibility > 0:
        raise ValueError(f"visibility must be a positive number of seconds, got {visibility!r}")
    if not worker_id or "#" in worker_id:
        raise ValueError(f"worker_id must be a non-empty name without '#', got {worker_id!r}")
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"routing keys must be strings, got {key!r}")
        refuse_nul(key, "routing key")
    token = f"{worker_id}#{secrets.token_hex(8)}"
    return token, (token, now, visibility, min_priority, json.dumps(list(keys)), now)


def claim_returning(store_executions: str, processed: str, with_execution: bool, *, after_trigger: bool = False) -> str:
    """The claim's extra columns: the execution and its processed flag (`with_execution`), then
    which delivery this is. RETURNING sees the row before the AFTER UPDATE trigger counts the
    delivery, so the claim adds it; a look-up afterwards reads it counted."""
    execution = (
        f", (SELECT data FROM {store_executions} WHERE id = group_id),"
        f" EXISTS(SELECT 1 FROM {processed} WHERE execution_id = group_id AND event_id = json_extract(event, '$.id'))"
        if with_execution
        else ""
    )
    return f"{execution}, deliveries{'' if after_trigger else ' + 1'}"


def leased_sql(n: EdgeNames, returning: str) -> str:
    """What a claim token holds now: the look-up after an ambiguous claim."""
    return f"SELECT seq, group_id, event{returning} FROM {n.messages} WHERE locked_by = ? ORDER BY seq"


def publish_statement(n: EdgeNames, chunk: list[tuple], now: float | None, keep_for: float, batch: str) -> Stmt:
    """One multi-row INSERT into the publish view for `chunk` (rows from `message_row`); its
    trigger skips an event id the group had within `keep_for` seconds. Plain `?`s: numbered
    ones cost the driver 114 ms instead of 20 for 2,000 rows."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
    sql = (
        f"INSERT INTO {n.publish_once_view} (group_id, event, priority, routing_key, event_id, now, keep_for, batch)"
        f" VALUES {values}"
    )
    return Stmt(sql, tuple(value for row in chunk for value in (*row, now, keep_for, batch)))


def published_sql(n: EdgeNames) -> str:
    """The batch token recorded for (group_id, event_id): after an ambiguous publish, its own
    token means it landed (the batch is atomic); anything else, try again, which the view makes
    harmless for the rows that did land before."""
    return f"SELECT batch FROM {n.published} WHERE group_id = ? AND event_id = ?"


def fence(lease: Lease) -> tuple[str, tuple]:
    """A lease made here carries its token; one made elsewhere (harel's own transport on a shared
    file) has only its seq to go by, as harel itself does."""
    if lease.token:
        return "seq = ? AND locked_by = ?", (lease.seq, lease.token)
    return "seq = ?", (lease.seq,)


def ack_statement(n: EdgeNames, lease: Lease) -> Stmt:
    where, args = fence(lease)
    return Stmt(f"DELETE FROM {n.messages} WHERE {where} RETURNING seq", args)


def ack_many_statement(n: EdgeNames, leases: Sequence[Lease]) -> Stmt:
    """One DELETE of the messages the leases (all with tokens) still hold. The `seq IN` list finds
    them by primary key on any SQLite: 3.40's planner scans the whole queue for the row-value test alone."""
    seqs = ", ".join(["?"] * len(leases))
    pairs = ", ".join(["(?, ?)"] * len(leases))
    args = (*(lease.seq for lease in leases), *(v for lease in leases for v in (lease.seq, lease.token)))
    return Stmt(
        f"DELETE FROM {n.messages} WHERE seq IN ({seqs}) AND (seq, locked_by) IN (VALUES {pairs}) RETURNING seq, locked_by",
        args,
    )


def nack_statement(n: EdgeNames, lease: Lease, delay: float, now: float | None, error: str | None) -> Stmt:
    """Give the message back, or park it for `delay` seconds. After a handling failure (`error`)
    the delivery stays counted and its error is kept; any other give-back takes its delivery back."""
    if delay > 0:
        lock, lock_args = f"locked_by = ?, lock_expiry = {now_or()} + ?", (PARKED, now, delay)
    else:
        lock, lock_args = "locked_by = NULL, lock_expiry = NULL", ()
    count, count_args = (
        (", last_error = ?", (error,)) if error is not None else (", deliveries = MAX(deliveries - 1, 0)", ())
    )
    where, args = fence(lease)
    return Stmt(f"UPDATE {n.messages} SET {lock}{count} WHERE {where} RETURNING seq", (*lock_args, *count_args, *args))


def lock_of_sql(n: EdgeNames) -> str:
    """Who holds a message now: the look-up after an ambiguous ack or nack."""
    return f"SELECT locked_by FROM {n.messages} WHERE seq = ?"


def bury_statement(n: EdgeNames, lease: Lease, now: float | None) -> Stmt:
    """Insert the dead letter and delete the message, fenced by the lease's token (the view's
    trigger does both); returns whether the lease still held."""
    return Stmt(
        f"INSERT INTO {n.prefix}_transport_bury (seq, token, at, held)"
        f" SELECT ?, ?, t.now, EXISTS(SELECT 1 FROM {n.messages} WHERE seq = ? AND locked_by = ?)"
        f" FROM {now_table('?')} RETURNING held",
        (lease.seq, lease.token, lease.seq, lease.token, now),
    )


def buried_sql(n: EdgeNames) -> str:
    """After an ambiguous bury: who holds the message, and whether its dead letter exists."""
    return (
        f"SELECT (SELECT locked_by FROM {n.messages} WHERE seq = ?),"
        f" EXISTS(SELECT 1 FROM {dead_letters_table(n.prefix)} WHERE seq = ? AND kind = 'message')"
    )


def depth_sql(n: EdgeNames) -> str:
    return f"SELECT count(*) FROM {n.messages}"


def check_schema(execute: schema.Execute, prefix: str) -> None:
    """Refuse a database whose schema is newer than this code, or lacks a version (read only)."""
    lacking = migrations.missing(execute, prefix)
    if lacking:
        raise SchemaError(
            f"the tables under prefix {prefix!r} lack schema version(s) {', '.join(map(str, lacking))}, and "
            "create_schema=False: run `harel-edge migrate` (or `harel-edge migrate --print-sql` for your migration tool)"
        )


def message_row(item: Message | tuple) -> tuple:
    """A message checked and as the publish statement binds it; refuses what cannot be queued."""
    message = item if isinstance(item, Message) else Message(*item)
    priority = message.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be a whole number from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not isinstance(message.group_id, str) or not message.group_id:
        raise ValueError(f"group_id must be a non-empty string, got {message.group_id!r}")
    refuse_nul(message.group_id, "group_id")
    refuse_nul(message.routing_key, "routing_key")
    if not isinstance(message.event, Event):
        raise TypeError(f"event must be a harel Event, got {type(message.event).__name__}")
    return (message.group_id, message.event.model_dump_json(), priority, message.routing_key, str(message.event.id))


def lease_from_row(row: tuple, token: str) -> Lease:
    seq, group_id, event = row
    # Not model_validate_json: it caches the strings it parses, and every event id is new, so a
    # long-running worker's heap would grow with that cache. from_json without it is as fast.
    return Lease(int(seq), group_id, Event.model_validate(from_json(event, cache_strings=False)), token=token)
