"""What `harel-edge workflows` shows: the durable workflows as the stores keep them (queued,
sleeping, running, finished or dead), each one's recorded steps, failed passes and last error;
read through `access.with_reader`, never written."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from harel_edge.access import Listed, with_reader
from harel_edge.durable.runtime import RESULT
from harel_edge.errors import ConfigurationError
from harel_edge.inspection import Execute
from harel_edge.schema import dead_letters_table, now_table, table_exists
from harel_edge.settings import EdgeSettings

STATES = ("ready", "sleeping", "running", "finished", "dead")


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow: its namespace, where it stands, how many steps it recorded, its failed
    passes in a row and the last one's error, and when it wakes if it sleeps."""

    workflow: str
    namespace: str | None
    state: str  # one of STATES
    steps: int
    attempts: int
    last_error: str | None
    wakes_in_seconds: float | None

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
    if not table_exists(execute, "workflow_checkpoint"):
        return Listed([], WorkflowSummary)
    dl = dead_letters_table(prefix)
    dead = table_exists(execute, dl)
    dead_ids = f" UNION SELECT workflow FROM {dl} WHERE kind = 'workflow'" if dead else ""
    dead_error = (
        f"(SELECT last_error FROM {dl} d WHERE d.kind = 'workflow' AND d.workflow = i.workflow ORDER BY d.id DESC LIMIT 1)"
        if dead
        else "NULL"
    )
    dead_namespace = (
        f"(SELECT namespace FROM {dl} d WHERE d.kind = 'workflow' AND d.workflow = i.workflow ORDER BY d.id DESC LIMIT 1)"
        if dead
        else "NULL"
    )
    live = "c.workflow = i.workflow AND c.held_until > t.now AND c.alive_until > t.now"
    state = (
        f"CASE WHEN EXISTS (SELECT 1 FROM workflow_checkpoint r WHERE r.workflow = i.workflow AND r.step = '{RESULT}')"
        f" THEN 'finished'"
        f" WHEN EXISTS (SELECT 1 FROM workflow_claim c WHERE {live}) THEN 'running'"
        f" WHEN q.workflow IS NOT NULL AND q.visible_at > t.now THEN 'sleeping'"
        f" WHEN q.workflow IS NOT NULL THEN 'ready'"
        f" WHEN {dead_namespace} IS NOT NULL THEN 'dead'"
        f" ELSE 'ready' END"
    )
    rows = execute(
        f"SELECT *, count(*) OVER () FROM (SELECT i.workflow AS workflow, COALESCE(q.namespace, {dead_namespace}) AS namespace,"
        f" {state} AS state,"
        f" (SELECT count(*) FROM workflow_checkpoint s WHERE s.workflow = i.workflow AND s.step NOT LIKE '$%'),"
        f" COALESCE(q.failures, 0), COALESCE(q.last_error, {dead_error}),"
        f" CASE WHEN q.visible_at > t.now THEN q.visible_at - t.now END,"
        f" (SELECT max(written_at) FROM workflow_checkpoint s WHERE s.workflow = i.workflow) AS last"
        f" FROM (SELECT workflow FROM workflow_checkpoint UNION SELECT workflow FROM workflow_queue{dead_ids}) i"
        f" LEFT JOIN workflow_queue q ON q.workflow = i.workflow, {now_table()})"
        f" {where} ORDER BY last DESC, 1 LIMIT ? OFFSET ?",
        (*params, limit, offset),
    )
    return Listed(rows, lambda r: WorkflowSummary(
        str(r[0]), r[1], str(r[2]), int(r[3] or 0), int(r[4] or 0), r[5], None if r[6] is None else float(r[6])
    ))  # fmt: skip


def list_workflows(
    settings: EdgeSettings, *, state: str | None = None, namespace: str | None = None, limit: int = 100, offset: int = 0
) -> Listed:
    """The workflows, the most recently recorded first, in `state` and `namespace` when given,
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


def _value(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
