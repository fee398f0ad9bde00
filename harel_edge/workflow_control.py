"""What `harel-edge workflows cancel|resume|fork` do, on the primary itself: each ONE statement
(harel_edge.durable.control), so of two callers at once one makes the change and the other is
told it changed nothing; the async faces are `LibsqlDurable.cancel/resume/fork`."""

from __future__ import annotations

from harel_edge.access import with_primary_writer
from harel_edge.durable import control
from harel_edge.durable.control import WorkflowChange
from harel_edge.settings import EdgeSettings


def cancel_workflow(settings: EdgeSettings, workflow: str) -> WorkflowChange:
    """Cancel a workflow that has not finished: a running pass is fenced off before its next
    write, its wakeups and timers are dropped, and no pass runs until `resume_workflow`."""
    stmt = control.cancel_statement(settings.prefix, workflow)
    return with_primary_writer(settings, lambda execute: control.switched("cancel", workflow, execute(stmt.sql, stmt.args)))


def resume_workflow(settings: EdgeSettings, workflow: str) -> WorkflowChange:
    """Run a cancelled or dead workflow again from its last recorded step, its failed passes forgotten."""
    stmt = control.resume_statement(settings.prefix, workflow)
    return with_primary_writer(settings, lambda execute: control.switched("resume", workflow, execute(stmt.sql, stmt.args)))


def fork_workflow(
    settings: EdgeSettings, workflow: str, from_step: str, new_id: str | None = None, *, namespace: str | None = None
) -> WorkflowChange:
    """A new workflow (`new_id`, or a new id) with the records `workflow` wrote before `from_step`,
    ready now in `namespace` (default: the original's); the original is left as it is."""
    target = new_id if new_id is not None else control.new_fork_id(workflow)
    stmt = control.fork_statement(settings.prefix, workflow, from_step, target, namespace)
    return with_primary_writer(
        settings, lambda execute: control.forked(workflow, from_step, target, execute(stmt.sql, stmt.args))
    )
