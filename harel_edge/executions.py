"""What `harel-edge executions` shows: harel's statechart executions as the store keeps them
(status, active state, context, last error), the events still queued for each and the last
steps of its trace; read through `access.with_reader`, never written."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from harel.engine.execution import Status

from harel_edge.access import Listed, with_reader
from harel_edge.errors import ConfigurationError
from harel_edge.inspection import Execute
from harel_edge.schema import EdgeNames, lease_state, now_table
from harel_edge.settings import EdgeSettings

STATUSES = tuple(status.value.lower() for status in Status)


@dataclass(frozen=True)
class ExecutionSummary:
    """One execution in a list: its machine, status, active state, when it last changed, its error,
    and once it is done, the outcome of the final state it reached (a machine's own `Cancel`
    transition ends it done, with the outcome its model gives, e.g. cancelled)."""

    id: str
    machine: str
    status: str
    state: str | None
    updated_at: Any
    error: str | None
    pending: int  # its events still in the queue
    outcome: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExecutionDetail:
    """One execution in full: the summary, its context and outcome, each event queued for it and
    the last entries of its trace (newest last)."""

    summary: ExecutionSummary
    context: dict[str, Any]
    created_at: Any
    finished_at: Any
    processed_events: int
    queued: list[dict[str, Any]] = field(default_factory=list)
    history: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.summary.as_dict(),
            "context": self.context,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "processed_events": self.processed_events,
            "queued": self.queued,
            "history": self.history,
        }


def _status_filter(status: str | None) -> str | None:
    if status is None:
        return None
    if status.lower() not in STATUSES:
        raise ConfigurationError(f"--state {status!r}: use one of {', '.join(STATUSES)}")
    return status.upper()


def _summaries(
    execute: Execute, prefix: str, where: str, params: tuple, limit: int, offset: int = 0
) -> Listed:
    n = EdgeNames(prefix)
    rows = execute(
        f"SELECT e.id, e.definition_id, json_extract(e.data, '$.status'), json_extract(e.data, '$.active_path'),"
        f" json_extract(e.data, '$.updated_at'), json_extract(e.data, '$.error'),"
        f" (SELECT count(*) FROM {n.messages} m WHERE m.group_id = e.id), json_extract(e.data, '$.outcome'),"
        f" count(*) OVER () FROM {prefix}_executions e {where}"
        f" ORDER BY json_extract(e.data, '$.updated_at') DESC, e.id LIMIT ? OFFSET ?",
        (*params, limit, offset),
    )
    return Listed(rows, lambda r: ExecutionSummary(str(r[0]), str(r[1]), str(r[2]), r[3], r[4], r[5], int(r[6] or 0), r[7]))


def list_executions(
    settings: EdgeSettings,
    *,
    status: str | None = None,
    machine: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Listed:
    """The executions, most recently changed first, of `status` (pending, running, done, failed,
    ...), of `machine` and ending with `outcome` (done ones: e.g. cancelled by their own `Cancel`
    transition) when given, `limit` of them after the first `offset`. Reads only."""
    wanted = _status_filter(status)
    clauses, params = [], []
    for clause, value in (
        ("json_extract(e.data, '$.status') = ?", wanted),
        ("e.definition_id = ?", machine),
        ("json_extract(e.data, '$.outcome') = ?", outcome),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return with_reader(settings, lambda execute: _summaries(execute, settings.prefix, where, tuple(params), limit, offset))


def status_counts(settings: EdgeSettings) -> dict[str, int]:
    """How many executions there are of each status (lower case). Reads only."""

    def read(execute: Execute) -> dict[str, int]:
        rows = execute(
            f"SELECT json_extract(data, '$.status'), count(*) FROM {settings.prefix}_executions GROUP BY 1"
        )
        return {str(s).lower(): int(c) for s, c in rows}

    return with_reader(settings, read)


def show_execution(settings: EdgeSettings, execution_id: str, *, history: int = 20) -> ExecutionDetail | None:
    """Execution `execution_id` in full, or None if there is none. Reads only."""
    prefix = settings.prefix
    n = EdgeNames(prefix)

    def read(execute: Execute) -> ExecutionDetail | None:
        found = _summaries(execute, prefix, "WHERE e.id = ?", (execution_id,), 1)
        if not found:
            return None
        data = json.loads(execute(f"SELECT data FROM {prefix}_executions WHERE id = ?", (execution_id,))[0][0])
        queued = [
            {
                "seq": int(seq),
                "kind": kind,
                "event_id": event_id,
                "deliveries": int(deliveries or 0),
                "state": state.replace("_", " "),
                "last_error": last_error,
            }
            for seq, kind, event_id, deliveries, state, last_error in execute(
                f"SELECT seq, json_extract(m.event, '$.kind'), json_extract(m.event, '$.id'), deliveries,"
                f" {lease_state('m', 't.now')}, last_error FROM {n.messages} m, {now_table()}"
                " WHERE group_id = ? ORDER BY seq",
                (execution_id,),
            )
        ]
        trace = execute(
            f"SELECT entry FROM (SELECT idx, entry FROM {prefix}_trace WHERE execution_id = ?"
            f" ORDER BY idx DESC LIMIT ?) ORDER BY idx",
            (execution_id, history),
        )
        processed = execute(
            f"SELECT count(*) FROM {prefix}_processed_events WHERE execution_id = ?", (execution_id,)
        )[0][0]
        return ExecutionDetail(
            found[0],
            data.get("context") or {},
            data.get("created_at"),
            data.get("finished_at"),
            int(processed or 0),
            queued,
            [_entry(row[0]) for row in trace],
        )

    return with_reader(settings, read)


def _entry(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
