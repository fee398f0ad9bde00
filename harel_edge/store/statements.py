"""The execution store's queries that harel's store contract asks for (listing, id prefixes,
purge), in the SQLite dialect, so the event path's store needs nothing private from harel."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

from harel.engine.execution import ExecutionPage, ExecutionSummary, Status

TRACE_MAX = 200  # trace rows kept per execution, as harel's own stores keep

IDS_WITH_PREFIX = "SELECT id FROM {executions} WHERE id LIKE ? ESCAPE '\\'"

# The reads harel's store contract makes.
LOAD = "SELECT data FROM {executions} WHERE id = ?"
LOAD_FOR_EVENT = (
    "SELECT (SELECT data FROM {executions} WHERE id = ?),"
    " EXISTS(SELECT 1 FROM {processed_events} WHERE execution_id = ? AND event_id = ?)"
)
IS_PROCESSED = "SELECT 1 FROM {processed_events} WHERE execution_id = ? AND event_id = ?"
READ_TRACE = "SELECT idx, entry FROM {trace} WHERE execution_id = ? ORDER BY idx"
PENDING_OUTBOX = "SELECT seq, target_id, event FROM {outbox} ORDER BY seq"
PENDING_SPAWNS = "SELECT seq, parent_id, child_id, root_path, context FROM {spawns} ORDER BY seq"
DUE_TIMERS = "SELECT execution_id, path, fire_at FROM {timers} WHERE fire_at <= ? ORDER BY fire_at"
EXISTS_EXECUTION = "SELECT 1 FROM {executions} WHERE id = ?"

# The writes after a commit: harel's drivers settle what it left behind.
ACK_OUTBOX = "DELETE FROM {outbox} WHERE seq = ?"
ACK_SPAWN = "DELETE FROM {spawns} WHERE seq = ?"
DELETE_TIMER = "DELETE FROM {timers} WHERE execution_id = ? AND path = ? AND fire_at = ?"

# An execution's compare-and-set write: a new row, or the next version of the one at the base.
INSERT_EXECUTION = "INSERT INTO {executions} (id, definition_id, data, version) VALUES (?, ?, ?, ?)"
UPDATE_EXECUTION = "UPDATE {executions} SET data = ?, version = ? WHERE id = ? AND version = ?"
VERSION_GUARD = "SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('harel_edge: version conflict') END"
VERSION_OF = "SELECT version FROM {executions} WHERE id = ?"
VERSION_AND_DATA_OF = "SELECT version, data FROM {executions} WHERE id = ?"

# What a commit writes besides the execution (harel's tables, harel's shapes).
INSERT_OUTBOX = "INSERT INTO {outbox} (target_id, event) VALUES (?, ?) RETURNING seq"
OUTBOX_SEQ_OF = "SELECT seq FROM {outbox} WHERE target_id IS ? AND event = ? ORDER BY seq DESC LIMIT 1"
MARK_PROCESSED = "INSERT OR IGNORE INTO {processed_events} (execution_id, event_id) VALUES (?, ?)"
INSERT_SPAWN = "INSERT INTO {spawns} (parent_id, child_id, root_path, context) VALUES (?, ?, ?, ?)"
SCHEDULE_TIMER = (
    "INSERT INTO {timers} (execution_id, path, fire_at) VALUES (?, ?, ?)"
    " ON CONFLICT(execution_id, path) DO UPDATE SET fire_at = excluded.fire_at"
)
CANCEL_TIMER = "DELETE FROM {timers} WHERE execution_id = ? AND path = ?"
APPEND_TRACE = (
    "INSERT INTO {trace} (execution_id, idx, entry) SELECT ?,"
    " COALESCE((SELECT MAX(idx) FROM {trace} WHERE execution_id = ?), -1) + 1, ?"
)
TRIM_TRACE = "DELETE FROM {trace} WHERE execution_id = ? AND idx <= (SELECT MAX(idx) FROM {trace} WHERE execution_id = ?) - ?"

# A purge: the row, fenced on its version (the guard fails the unit when it matched nothing,
# so nothing else is deleted), then what goes with it.
PURGE_EXECUTION = "DELETE FROM {executions} WHERE id = ? AND version = ?"
PURGE_GUARD = "SELECT CASE WHEN changes() = 1 THEN 1 ELSE json('harel_edge: moved on') END"
PURGE_COMPANIONS = (
    "DELETE FROM {processed_events} WHERE execution_id = ?",
    "DELETE FROM {trace} WHERE execution_id = ?",
    "DELETE FROM {timers} WHERE execution_id = ?",
    "DELETE FROM {outbox} WHERE target_id = ?",
    "DELETE FROM {spawns} WHERE parent_id = ?",
)

_SUMMARY_COLUMNS = (
    "id, definition_id, version, json_extract(data,'$.status'), json_extract(data,'$.outcome'), "
    "json_extract(data,'$.active_path'), json_extract(data,'$.parent_id'), json_extract(data,'$.finished_at')"
)


def like_prefix(prefix: str) -> str:
    """A LIKE pattern (with `ESCAPE '\\'`) matching ids that start with `prefix` literally."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def listing_query(
    table: str,
    status: Iterable[Status] | None,
    definition_id: str | None,
    roots_only: bool,
    limit: int,
    offset: int,
) -> tuple[str, tuple[Any, ...]]:
    """One page of executions (plus one row, which says whether there is a next page)."""
    where, params = ["1=1"], []
    if definition_id is not None:
        where.append("definition_id = ?")
        params.append(definition_id)
    if status is not None:
        statuses = [s.value for s in status]
        where.append(f"json_extract(data,'$.status') IN ({','.join('?' * len(statuses))})")
        params += statuses
    if roots_only:
        where.append("json_extract(data,'$.parent_id') IS NULL")
    sql = f"SELECT {_SUMMARY_COLUMNS} FROM {table} WHERE {' AND '.join(where)} ORDER BY id LIMIT ? OFFSET ?"
    return sql, (*params, limit + 1, offset)


def listing_page(rows: list[tuple], limit: int, offset: int) -> ExecutionPage:
    items = [
        ExecutionSummary(
            id=r[0],
            definition_id=r[1],
            version=r[2],
            status=r[3],
            outcome=r[4],
            active_path=r[5],
            parent_id=r[6],
            finished_at=r[7],
        )
        for r in rows[:limit]
    ]
    more = len(rows) > limit
    return ExecutionPage(items=items, next_cursor=encode_offset(offset + limit) if more else None)


def encode_offset(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode()


def decode_offset(cursor: str | None) -> int:
    """A cursor this module made; none, or one it cannot read, starts from the beginning."""
    if not cursor:
        return 0
    try:
        return int(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (ValueError, TypeError, binascii.Error):
        return 0
