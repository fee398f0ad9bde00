"""The queue's SQL: every operation is one statement decided on the primary, by its clock.

Why each has the shape it has: docs/transport.md.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence

from harel.engine.transport import Lease
from harel.spec.states import Event
from pydantic_core import from_json

from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.queue.messages import MAX_PRIORITY
from harel_edge.schema import DB_NOW, PARKED, EdgeNames, dead_letters_table, is_free, now_or, now_table
from harel_edge.schema_flow import FlowNames

ACK_ROWS = 2000  # leases in one DELETE of `ack_many`: 3 parameters each
# Each claim's stamp is after every earlier one (its clock's now, or a step past the latest stamp
# when the clock has not moved), and the leases of one claim_many are a step apart in the order
# they were chosen: groups served together take their next turn in that order (fair ties).
RANK_STEP = 1e-6


def claim_sql(
    n: EdgeNames, routing_keys: int, *, many: bool = False, returning: str = "", limited: bool = True, runs: bool = False
) -> str:
    """The claim in one statement: the spec's selection and its lease (`many`: up to `?7` groups'
    heads), skipping the groups of a key at its concurrency or rate limit. Parameters: token,
    now, visibility, min_priority, keys as a JSON array (any number of them: one parameter),
    now[, n[, the longest run, the most messages]]. Its cost is flat in the groups waiting.

    `runs`: each group's head comes with the messages after it (`run_sql`), `?9` messages in all.
    `limited=False`: the claim for a database with no limits set, which does not read them
    (a fifth less work) and fails, changing nothing, if any limit is set (`limits_were_set`)."""
    keyed = bool(routing_keys)
    now, limit = now_or("?6"), "?7" if many else "1"
    # INDEXED BY: a walk must never become a scan in last-claim order, whatever the statistics.
    index = n.routing_index if keyed else n.free_index
    head = f"JOIN {n.messages} m ON m.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = g.group_id)"
    # A parked or delayed head is locked until its time: the primary's clock (or the injected one) decides.
    free = is_free("m", now)
    # With no limit set, one look at an empty table, made once for the statement.
    unlimited = f"NOT EXISTS (SELECT 1 FROM {FlowNames(n.prefix).limits})"
    allowed = f" AND ({unlimited} OR g.held_key IS NULL OR {allowance_sql(n, 'g.held_key', now)} > 0)" if limited else ""
    order = f"ORDER BY g.last_claimed_at, g.rowid LIMIT {limit}"
    # The priorities from the floor to 4, and the keys (DISTINCT: a key given twice counts once).
    ctes = "pr(p) AS (SELECT MAX(?4, 0) WHERE ?4 <= 4 UNION ALL SELECT p + 1 FROM pr WHERE p < 4)"
    source, of_key = "pr", ""
    if keyed:
        ctes += ", ks(k) AS (SELECT DISTINCT value FROM json_each(?5))"
        source, of_key = "pr CROSS JOIN ks", " AND g.routing_key = ks.k"
    columns = "g.last_claimed_at AS c, g.rowid AS r, m.seq AS seq, g.held_key AS lk"
    # No LATERAL in SQLite: each (priority, key)'s walk is a correlated IN subquery.
    walks = (
        f"SELECT {columns} FROM {source} CROSS JOIN {n.groups} g {head}"
        f" WHERE g.rowid IN (SELECT g.rowid FROM {n.groups} g INDEXED BY {index} {head}"
        f" WHERE g.claimable_at IS NULL AND g.priority = pr.p{of_key} AND {free}{allowed} {order})"
    )
    # The groups whose lease or park has ended (few: each claim frees those it finds), and
    # those of a priority above 4 (none unless harel's own publish wrote one). Two walks, not an
    # OR, which the planner may turn into a scan of every group of the key.
    others = " UNION ALL ".join(
        f"SELECT * FROM (SELECT {columns}"
        f" FROM {'ks CROSS JOIN ' if keyed else ''}{n.groups} g INDEXED BY {index} {head}"
        f" WHERE {which}{of_key} AND g.priority >= MAX(?4, 0) AND {free}{allowed} {order})"
        for which in (f"g.claimable_at < {now}", f"g.claimable_at IS NULL AND g.priority > {MAX_PRIORITY}")
    )
    # Each walk admits a key's groups while the key has room; of the first n, no more than its
    # room (a claim_many may then lease fewer than n: the next claim goes on past the key).
    first = f"SELECT * FROM ({walks} UNION ALL {others}) ORDER BY c, r LIMIT {limit}"
    within = f"kr = 1 OR lk IS NULL OR {unlimited} OR kr <= {allowance_sql(n, 'lk', now)}"
    ranked = (
        f"SELECT seq, rank, lk FROM (SELECT seq, lk, row_number() OVER (ORDER BY c, r) - 1 AS rank,"
        f" row_number() OVER (PARTITION BY lk ORDER BY c, r) AS kr FROM ({first})) WHERE {within}"
        if limited
        else f"SELECT seq, row_number() OVER (ORDER BY c, r) - 1, NULL FROM ({first})"
    )
    claim_now = f"COALESCE(?2, {DB_NOW})"
    base = f"MAX({claim_now}, COALESCE((SELECT MAX(last_claimed_at) FROM {n.groups}), 0) + {RANK_STEP})"
    if not limited:  # an integer overflow, before any row is leased, if a limit is set
        base += f" + abs(CASE WHEN {unlimited} THEN 0 ELSE -9223372036854775807 - 1 END)"
    leased = "pick"
    if runs:
        ctes += f", pick(seq, rank, lk) AS ({ranked}), {run_sql(n, now, limited)}"
        ranked, leased = "SELECT seq, rank, lk FROM run ORDER BY k, rank LIMIT ?9", "leased"
    return (
        f"WITH RECURSIVE {ctes}, {leased}(seq, rank, lk) AS ({ranked}),"
        f" b(base) AS (SELECT {base})"
        f" UPDATE {n.messages} SET locked_by = ?1, claimed_at = b.base + {leased}.rank * {RANK_STEP},"
        f" lock_expiry = {claim_now} + ?3{f', held_key = {leased}.lk' if limited else ''}"
        f" FROM {leased} CROSS JOIN b WHERE {n.messages}.seq = {leased}.seq"
        f" RETURNING seq, group_id, event{returning}"
    )


def run_sql(n: EdgeNames, now: str, limited: bool) -> str:
    """Each picked head and the messages after it in its group, in order, up to `?8` a group: each
    one free (not in flight, not delayed or debounced before its time). A head delivered before
    comes alone (a message that failed, or whose worker died, is tried on its own), and so does
    one of a key with a rate limit (each claim of it counts). Heads first: `?9` bounds the rows."""
    rated = (
        f" AND (run.lk IS NULL OR NOT EXISTS (SELECT 1 FROM {FlowNames(n.prefix).limits} l"
        " WHERE l.key = run.lk AND l.rate IS NOT NULL))"
        if limited
        else ""
    )
    follower = f"(SELECT MIN(x.seq) FROM {n.messages} x WHERE x.group_id = run.gid AND x.seq > run.seq)"
    return (
        "run(seq, gid, rank, lk, k, d) AS ("
        f"SELECT m.seq, m.group_id, pick.rank, pick.lk, 1, m.deliveries FROM pick JOIN {n.messages} m ON m.seq = pick.seq"
        f" UNION ALL SELECT m.seq, run.gid, run.rank, run.lk, run.k + 1, run.d FROM run JOIN {n.messages} m"
        f" ON m.seq = {follower}"
        f" WHERE run.k < ?8 AND run.d = 0 AND {is_free('m', now)}{rated})"
    )


UNBOUNDED = 1 << 62  # the room of a key with no limit of that kind


def limits_were_set(exc: BaseException) -> bool:
    """Whether a claim made with `limited=False` failed because a limit is set: claim with them."""
    return "integer overflow" in str(exc).lower()


def allowance_sql(n: EdgeNames, key: str, now: str) -> str:
    """How many more claims the limits of `key` admit now: its concurrency less its groups whose
    lease has not ended, and its rate less its claims within the rolling period; unbounded
    without a limit. Each count reads only that key's rows."""
    f = FlowNames(n.prefix)
    in_flight = f"(SELECT count(*) FROM {n.groups} x WHERE x.held_key = l.key AND x.leased_until >= {now})"
    recent = f"(SELECT count(*) FROM {f.limit_claims} c WHERE c.key = l.key AND c.at > {now} - l.period)"
    return (
        f"COALESCE((SELECT MIN(CASE WHEN l.concurrency IS NULL THEN {UNBOUNDED} ELSE l.concurrency - {in_flight} END,"
        f" CASE WHEN l.rate IS NULL THEN {UNBOUNDED} ELSE l.rate - {recent} END)"
        f" FROM {f.limits} l WHERE l.key = {key}), {UNBOUNDED})"
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


def claim_returning(
    store_executions: str, processed: str, with_execution: bool, *, after_trigger: bool = False, heads_of: str | None = None
) -> str:
    """The claim's extra columns: the execution and its processed flag (`with_execution`), then
    which delivery this is. RETURNING sees the row before the AFTER UPDATE trigger counts the
    delivery, so the claim adds it; a look-up afterwards reads it counted. `heads_of` (the
    messages table, for a claim of runs): the execution only with each group's head."""
    data = f"(SELECT data FROM {store_executions} WHERE id = group_id)"
    if heads_of is not None:
        data = f"CASE WHEN seq = (SELECT MIN(x.seq) FROM {heads_of} x WHERE x.group_id = {heads_of}.group_id) THEN {data} END"
    execution = (
        f", {data},"
        f" EXISTS(SELECT 1 FROM {processed} WHERE execution_id = group_id AND event_id = json_extract(event, '$.id'))"
        if with_execution
        else ""
    )
    return f"{execution}, deliveries{'' if after_trigger else ' + 1'}"


def leased_sql(n: EdgeNames, returning: str) -> str:
    """What a claim token holds now: the look-up after an ambiguous claim."""
    return f"SELECT seq, group_id, event{returning} FROM {n.messages} WHERE locked_by = ? ORDER BY seq"


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


def give_back_statement(n: EdgeNames, leases: Sequence[Lease]) -> Stmt:
    """Give back the messages of a run after the one it stopped at (all under one token): free
    at once, their deliveries not counted, since they were never handled."""
    seqs = ", ".join(["?"] * len(leases))
    return Stmt(
        f"UPDATE {n.messages} SET locked_by = NULL, lock_expiry = NULL, deliveries = MAX(deliveries - 1, 0)"
        f" WHERE seq IN ({seqs}) AND locked_by = ? RETURNING seq",
        (*(lease.seq for lease in leases), leases[0].token),
    )


def renew_statement(n: EdgeNames, leases: Sequence[Lease], visibility: float, now: float | None) -> Stmt:
    """Extend the lease of a run's messages not yet handled (its head's moves its group's lease)."""
    seqs = ", ".join(["?"] * len(leases))
    return Stmt(
        f"UPDATE {n.messages} SET lock_expiry = {now_or()} + ? WHERE seq IN ({seqs}) AND locked_by = ?",
        (now, visibility, *(lease.seq for lease in leases), leases[0].token),
    )


def error_statement(n: EdgeNames, lease: Lease, error: str) -> Stmt:
    """Keep a handling failure on the leased message (for the dead letter a bury makes of it)."""
    where, args = fence(lease)
    return Stmt(f"UPDATE {n.messages} SET last_error = ? WHERE {where}", (error, *args))


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


def next_work_sql(n: EdgeNames, timers: str) -> str:
    """SQL: the first time a group's lease, delay or park ends and a timer is due (NULL when
    none), and whether limits may hold free work back: what a doorbell's ring never announces."""
    limits = FlowNames(n.prefix).limits
    return (
        f"SELECT (SELECT min(claimable_at) FROM {n.groups}), (SELECT min(fire_at) FROM {timers}),"
        f" EXISTS (SELECT 1 FROM {limits})"
    )


def depth_sql(n: EdgeNames) -> str:
    return f"SELECT count(*) FROM {n.messages}"


def lease_from_row(row: tuple, token: str) -> Lease:
    seq, group_id, event = row
    # Not model_validate_json: it caches the strings it parses, and every event id is new, so a
    # long-running worker's heap would grow with that cache. from_json without it is as fast.
    return Lease(int(seq), group_id, Event.model_validate(from_json(event, cache_strings=False)), token=token)


def acked(leases: Sequence[Lease], gone: set[tuple[int, str]]) -> list[bool]:
    """Each lease's answer from the (seq, token) pairs deleted: True once for each pair deleted;
    False for a stale lease of a deleted seq, and for a lease given twice, the second time."""
    answers = []
    for lease in leases:
        key = (lease.seq, lease.token)
        answers.append(key in gone)
        gone.discard(key)
    return answers
