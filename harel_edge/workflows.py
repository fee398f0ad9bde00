"""What `harel-edge workflows list|show` shows: the durable workflows as the stores keep them (in
one of STATES), each one's recorded steps with their values and times, failed passes and last
error; read through `access.with_reader`, never written."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from harel_edge.access import Listed, with_reader
from harel_edge.errors import ConfigurationError
from harel_edge.inspection import Execute
from harel_edge.limits import UNITS
from harel_edge.schema import dead_letters_table, now_table, table_exists
from harel_edge.schema_control import STATES, known_namespace, workflow_state
from harel_edge.settings import EdgeSettings


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow: its namespace, where it stands, how many steps it recorded, its failed
    passes in a row and the last one's error, when it wakes if it sleeps, when it last changed,
    and the workflow (and step) it was forked from."""

    workflow: str
    namespace: str | None
    state: str  # one of STATES
    steps: int
    attempts: int
    last_error: str | None
    wakes_in_seconds: float | None
    changed_at: float | None = None  # its newest record or its cancel, unix seconds by the database's clock
    forked_from: str | None = None
    forked_step: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkflowDetail:
    """One workflow in full: the summary, and each record in the order written."""

    summary: WorkflowSummary
    records: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary.as_dict(), "records": self.records}


def _summaries(execute: Execute, prefix: str, where: str, params: tuple, limit: int, offset: int = 0) -> Listed:
    if not table_exists(execute, "workflow_info"):  # before version 10 there is nothing to list
        return Listed([], WorkflowSummary)
    dl = dead_letters_table(prefix)
    dead = table_exists(execute, dl)
    dead_ids = f" UNION SELECT workflow FROM {dl} WHERE kind = 'workflow'" if dead else ""
    dead_error = (
        f"(SELECT last_error FROM {dl} d WHERE d.kind = 'workflow' AND d.workflow = i.workflow ORDER BY d.id DESC LIMIT 1)"
        if dead
        else "NULL"
    )
    namespace = known_namespace("i.workflow", dl) if dead else "COALESCE(x.namespace, q.namespace)"
    rows = execute(
        f"SELECT *, count(*) OVER () FROM (SELECT i.workflow AS workflow, {namespace} AS namespace,"
        f" {workflow_state('i.workflow', 't.now', dl if dead else None)} AS state,"
        f" (SELECT count(*) FROM workflow_checkpoint s WHERE s.workflow = i.workflow AND s.step NOT LIKE '$%'),"
        f" COALESCE(q.failures, 0), COALESCE(q.last_error, {dead_error}),"
        f" CASE WHEN q.visible_at > t.now THEN q.visible_at - t.now END,"
        f" MAX(COALESCE((SELECT max(written_at) FROM workflow_checkpoint s WHERE s.workflow = i.workflow), x.cancelled_at),"
        f" COALESCE(x.cancelled_at, 0)) AS changed, x.forked_from, x.forked_step"
        f" FROM (SELECT workflow FROM workflow_checkpoint UNION SELECT workflow FROM workflow_queue"
        f" UNION SELECT workflow FROM workflow_info{dead_ids}) i"
        f" LEFT JOIN workflow_queue q ON q.workflow = i.workflow LEFT JOIN workflow_info x ON x.workflow = i.workflow,"
        f" {now_table()})"
        f" {where} ORDER BY changed IS NULL, changed DESC, 1 LIMIT ? OFFSET ?",
        (*params, limit, offset),
    )
    return Listed(rows, lambda r: WorkflowSummary(
        str(r[0]), r[1], str(r[2]), int(r[3] or 0), int(r[4] or 0), r[5], None if r[6] is None else float(r[6]),
        None if r[7] is None else float(r[7]), r[8], r[9],
    ))  # fmt: skip


def list_workflows(
    settings: EdgeSettings,
    *,
    state: str | None = None,
    namespace: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Listed:
    """The workflows, the most recently changed first, in `state` and `namespace` when given, and
    changed (a record written, or cancelled) at `since` or later and before `until` (unix seconds),
    `limit` of them after the first `offset`. Reads only."""
    clauses, params = [], []
    if state is not None:
        if state.lower() not in STATES:
            raise ConfigurationError(f"--state {state!r}: use one of {', '.join(STATES)}")
        clauses.append("state = ?")
        params.append(state.lower())
    if namespace is not None:
        clauses.append("namespace IS ?")
        params.append(namespace)
    if since is not None:
        clauses.append("changed >= ?")
        params.append(since)
    if until is not None:
        clauses.append("changed < ?")
        params.append(until)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return with_reader(settings, lambda execute: _summaries(execute, settings.prefix, where, tuple(params), limit, offset))


def show_workflow(settings: EdgeSettings, workflow: str) -> WorkflowDetail | None:
    """Workflow `workflow` in full, or None if there is none. Reads only."""

    def read(execute: Execute) -> WorkflowDetail | None:
        found = _summaries(execute, settings.prefix, "WHERE workflow = ?", (workflow,), 1)
        if not found:
            return None
        records = [
            {"step": step, "value": _value(value), "written_at": at}
            for step, value, at in execute(
                "SELECT step, value, written_at FROM workflow_checkpoint WHERE workflow = ? ORDER BY seq", (workflow,)
            )
        ]
        return WorkflowDetail(found[0], records)

    return with_reader(settings, read)


def parse_time(text: str, option: str, now: float | None = None) -> float:
    """A time for `--since`/`--until`: ISO 8601 with its zone (`2026-12-07T08:00Z`), or a span
    back from now (`90s`, `15m`, `2h`, `3d`), as unix seconds."""
    span = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if span:
        return (time.time() if now is None else now) - float(span.group(1)) * UNITS[span.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ConfigurationError(
            f"{option} {text!r}: give a time with its zone (2026-12-07T08:00:00Z) or a span back from now (15m, 2h, 3d)"
        )
    return when.timestamp()


def _value(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
