"""Cancel, resume and fork a durable workflow: each ONE statement through schema version 10's
views, which decides on the primary whether the command applies, and what each answer means.

Why a cancel is a raised fence, and what each command does to each state: docs/durable.md.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Any

from harel_edge.errors import ConfigurationError, NotFoundError
from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.schema import dead_letters_table, now_table
from harel_edge.schema_control import ControlNames, known_namespace, workflow_state

COMMANDS = ("cancel", "resume", "fork")
# Where each command applies; elsewhere it changes nothing and says so.
CANCELS = ("running", "sleeping", "ready", "dead", "waiting")
RESUMES = ("cancelled", "dead")


@dataclass(frozen=True)
class WorkflowChange:
    """A workflow's state before and after this call's write; `changed` is False when the call
    wrote nothing (the command did not apply, or another caller made the change first). A fork
    is told of the workflow it made (absent before), with `forked_from` its source."""

    workflow: str
    command: str
    before: str
    after: str
    forked_from: str | None = None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed}


def _missing(workflow: str) -> NotFoundError:
    return NotFoundError(f"no workflow {workflow!r}: `harel-edge workflows list` shows the ones there are")


def _switch(view: str, prefix: str, workflow: str, at: float | None) -> Stmt:
    dl = dead_letters_table(prefix)
    return Stmt(
        f"INSERT INTO {view} (workflow, at, state)"
        f" SELECT ?1, t.now, {workflow_state('?1', 't.now', dl)} FROM {now_table('?2')}"
        f" RETURNING state, {workflow_state('?1', 'at', dl)}",
        (workflow, at),
    )


def cancel_statement(prefix: str, workflow: str, at: float | None = None) -> Stmt:
    """Cancel: the workflow marked cancelled, its fence raised (a running pass's next write is
    refused), its wakeups, timers and dead letters dropped; returns (state before, after)."""
    refuse_nul(workflow, "workflow id")
    return _switch(ControlNames(prefix).cancel, prefix, workflow, at)


def resume_statement(prefix: str, workflow: str, at: float | None = None) -> Stmt:
    """Resume a cancelled or dead workflow: ready now, its failed passes forgotten."""
    refuse_nul(workflow, "workflow id")
    return _switch(ControlNames(prefix).resume, prefix, workflow, at)


def switched(command: str, workflow: str, rows: list[tuple]) -> WorkflowChange:
    """What a cancel or resume statement answered."""
    before, after = rows[0] if rows else (None, None)
    if before is None:
        raise _missing(workflow)
    return WorkflowChange(workflow, command, str(before), str(after))


def new_fork_id(source: str) -> str:
    return f"{source}.fork-{secrets.token_hex(4)}"


def fork_statement(
    prefix: str, source: str, step: str, workflow: str, namespace: str | None = None, at: float | None = None
) -> Stmt:
    """Fork: a new workflow `workflow` with the records `source` wrote before `step`, ready now in
    `namespace` (default: the source's), to run `step` and what follows again."""
    for value, what in ((source, "workflow id"), (step, "step name"), (workflow, "new workflow id"), (namespace, "namespace")):
        refuse_nul(value, what)
    if not workflow:
        raise ConfigurationError("the new workflow id is empty: give --id NEW or leave it out for a new one")
    dl = dead_letters_table(prefix)
    view = ControlNames(prefix).fork
    outcome = (
        f"CASE WHEN {workflow_state('?1', 't.now', dl)} IS NULL THEN 'unknown'"
        " WHEN NOT EXISTS (SELECT 1 FROM workflow_checkpoint WHERE workflow = ?1 AND step = ?2) THEN 'no step'"
        " WHEN EXISTS (SELECT 1 FROM workflow_info WHERE workflow = ?3 AND forked_from = ?1 AND forked_step = ?2)"
        " THEN 'already forked'"
        f" WHEN {workflow_state('?3', 't.now', dl)} IS NOT NULL THEN 'taken'"
        " WHEN ns IS NULL THEN 'no namespace' ELSE 'forked' END"
    )
    return Stmt(
        f"INSERT INTO {view} (source, step, workflow, namespace, at, outcome)"
        f" SELECT ?1, ?2, ?3, ns, t.now, {outcome}"
        f" FROM (SELECT COALESCE(?4, {known_namespace('?1', dl)}) AS ns), {now_table('?5')}"
        " RETURNING outcome, (SELECT group_concat(step, ', ') FROM"
        " (SELECT step FROM workflow_checkpoint WHERE workflow = ?1 AND step NOT LIKE '$%' ORDER BY seq))",
        (source, step, workflow, namespace, at),
    )


def forked(source: str, step: str, workflow: str, rows: list[tuple]) -> WorkflowChange:
    """What a fork statement answered; ConfigurationError for a fork that cannot be made."""
    outcome, steps = rows[0]
    if outcome == "unknown":
        raise _missing(source)
    if outcome == "no step":
        raise ConfigurationError(
            f"workflow {source!r} recorded no step {step!r}, so nothing was forked: its steps are "
            f"{steps or 'none yet'} (`harel-edge workflows show {source}`)"
        )
    if outcome == "taken":
        raise ConfigurationError(
            f"workflow {workflow!r} exists already, so nothing was forked: give another --id (or none, for a new one)"
        )
    if outcome == "no namespace":
        raise ConfigurationError(
            f"workflow {source!r} was never queued in a namespace this database remembers, so the fork would "
            "never run: give --namespace NS (the one its workers serve); nothing was forked"
        )
    before = "absent" if outcome == "forked" else "ready"  # a retried fork that had landed: made already
    return WorkflowChange(workflow, "fork", before, "ready", forked_from=source)
