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

# What goes with an execution when it is purged (its row itself is deleted last, fenced).
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
