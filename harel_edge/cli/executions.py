"""`harel-edge executions` and `harel-edge workflows`: list the statechart executions and the
durable workflows, and show one of either in full (reads only)."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from harel_edge.cli.app import EXIT_PROBLEM, fail, handled, out, plural, shown
from harel_edge.timestamps import utc_text

# harel_edge.executions.STATUSES (harel's Status) and harel_edge.workflows.STATES, not imported for
# `--help` (they pull in harel and libsql); a test checks that they agree.
STATUSES = ("pending", "running", "done", "cancelled", "suspended", "cancelling", "failed")
WORKFLOW_STATE_NAMES = ("ready", "sleeping", "running", "waiting", "finished", "dead", "cancelled")
STATES = f"<{'|'.join(STATUSES)}>"


def _listing(
    what: str, found: list, state: str | None, as_json: bool, order: str, columns: tuple, numbers: tuple
) -> Table | None:
    """A list command's table to fill, or None when it printed all there is (JSON, or none)."""
    if as_json:
        print(json.dumps([item.as_dict() for item in found], indent=2, default=str))
        return None
    if not found:
        out.print(f"{what}: none{f' {state.lower()}' if state else ''}", markup=False)
        return None
    table = Table(title=f"{what} ({plural(len(found), 'shown', 'shown')}, {order})")
    for column in columns:
        table.add_column(column, justify="right" if column in numbers else "left")
    return table


def _printed_as_json(what: str, wanted: str, detail: Any, as_json: bool) -> bool:
    """A show command's first part: refuse what is not there (exit 1, pointing at the list), or
    print it as JSON; False when the caller renders it."""
    if detail is None:
        fail(EXIT_PROBLEM, f"no {what} {wanted!r}: `harel-edge {what}s list` shows the ones there are")
    if as_json:
        print(json.dumps(detail.as_dict(), indent=2, default=str))
    return as_json


@handled
def executions_list(
    ctx: typer.Context,
    state: str | None = typer.Option(None, "--state", metavar=STATES, help="Only executions with this status."),
    machine: str | None = typer.Option(None, "--machine", metavar="MACHINE", help="Only executions of this statechart."),
    outcome: str | None = typer.Option(
        None, "--outcome", metavar="OUTCOME", help="Only those whose final state has this outcome (e.g. cancelled)."
    ),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, most recently changed first."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the statechart executions: status, outcome, state, queued events, last error. Reads only."""
    settings = ctx.obj.settings()
    from harel_edge import executions  # noqa: PLC0415

    found = executions.list_executions(settings, status=state, machine=machine, outcome=outcome, limit=limit)
    columns = ("id", "machine", "status", "outcome", "state", "queued", "updated", "error")
    table = _listing("executions", found, state, as_json, "most recently changed first", columns, ("queued",))
    if table is None:
        return
    for e in found:
        error = (e.error or "-").splitlines()[0] if e.error else "-"
        table.add_row(
            *map(shown, (e.id, e.machine, e.status.lower(), e.outcome or "-", e.state or "-")),
            str(e.pending), utc_text(e.updated_at), shown(error[:80]),
        )  # fmt: skip
    out.print(table)


@handled
def executions_show(
    ctx: typer.Context,
    execution_id: str = typer.Argument(..., metavar="ID", help="The execution's id (its group)."),
    history: int = typer.Option(20, "--history", min=0, help="How many of its last trace entries to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one execution: status, active state, context, last error, queued events, history. Reads only."""
    settings = ctx.obj.settings()
    from harel_edge import executions  # noqa: PLC0415

    detail = executions.show_execution(settings, execution_id, history=history)
    if _printed_as_json("execution", execution_id, detail, as_json):
        return
    s = detail.summary
    lines = [
        f"execution {shown(s.id)} of {shown(s.machine)}: {s.status.lower()}"
        + (f" (outcome {shown(s.outcome)})" if s.outcome else "")
        + f", in {shown(s.state or '-')}",
        f"created {utc_text(detail.created_at)}, updated {utc_text(s.updated_at)}"
        + (f", finished {utc_text(detail.finished_at)}" if detail.finished_at else ""),
        f"last error: {shown(s.error or '-', lines=True)}",
        f"processed: {plural(detail.processed_events, 'event')}",
        f"context: {json.dumps(detail.context, default=str)}",
    ]
    for line in lines:
        out.print(line, markup=False)
    if not detail.queued:
        out.print("queued events: none", markup=False)
    else:
        table = Table(title=f"queued events ({len(detail.queued)})")
        for column in ("seq", "kind", "event id", "state", "deliveries", "last error"):
            table.add_column(column)
        for q in detail.queued:
            table.add_row(
                str(q["seq"]), shown(q["kind"]), shown(q["event_id"]), q["state"], str(q["deliveries"]),
                shown((q["last_error"] or "-")[:80]),
            )  # fmt: skip
        out.print(table)
    if not detail.history:
        out.print("history: none recorded", markup=False)
    else:
        out.print(f"history (last {plural(len(detail.history), 'entry', 'entries')}):", markup=False)
        for entry in detail.history:
            out.print(f"  {json.dumps(entry, default=str) if not isinstance(entry, str) else shown(entry)}", markup=False)


WORKFLOW_STATES = f"<{'|'.join(WORKFLOW_STATE_NAMES)}>"


@handled
def workflows_list(
    ctx: typer.Context,
    state: str | None = typer.Option(None, "--state", metavar=WORKFLOW_STATES, help="Only workflows in this state."),
    namespace: str | None = typer.Option(None, "--namespace", metavar="NS", help="Only workflows of this namespace."),
    since: str | None = typer.Option(
        None, "--since", metavar="WHEN", help="Only workflows changed at WHEN or later: 2026-12-07T08:00Z, or 15m, 2h, 3d ago."
    ),
    until: str | None = typer.Option(None, "--until", metavar="WHEN", help="Only workflows last changed before WHEN."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, the most recently changed first."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the durable workflows: state, recorded steps, failed passes, last error, last change. Reads only."""
    settings = ctx.obj.settings()
    from harel_edge import workflows  # noqa: PLC0415

    after = None if since is None else workflows.parse_time(since, "--since")
    before = None if until is None else workflows.parse_time(until, "--until")
    found = workflows.list_workflows(settings, state=state, namespace=namespace, since=after, until=before, limit=limit)
    columns = ("workflow", "namespace", "state", "steps", "failed passes", "wakes", "changed", "last error")
    table = _listing("workflows", found, state, as_json, "the most recently changed first", columns, ("steps", "failed passes"))
    if table is None:
        return
    for w in found:
        wakes = "-" if w.wakes_in_seconds is None else f"in {w.wakes_in_seconds:.1f} s"
        error = (w.last_error or "-").splitlines()[0][:80] if w.last_error else "-"
        table.add_row(
            shown(w.workflow), shown(w.namespace or "-"), w.state, str(w.steps), str(w.attempts), wakes, utc_text(w.changed_at), shown(error)
        )  # fmt: skip
    out.print(table)


@handled
def workflows_show(
    ctx: typer.Context,
    workflow: str = typer.Argument(..., metavar="ID", help="The workflow's id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one durable workflow: its state, each recorded step with its value and when it was
    written, and the error of its failed passes. Reads only."""
    settings = ctx.obj.settings()
    from harel_edge import workflows  # noqa: PLC0415

    detail = workflows.show_workflow(settings, workflow)
    if _printed_as_json("workflow", workflow, detail, as_json):
        return
    w = detail.summary
    wakes = "" if w.wakes_in_seconds is None else f", wakes in {w.wakes_in_seconds:.1f} s"
    lines = [f"workflow {shown(w.workflow)} ({shown(w.namespace or 'no namespace')}): {w.state}{wakes}"]
    if w.forked_from is not None:
        lines.append(f"forked from {shown(w.forked_from)} at step {shown(w.forked_step or '-')}")
    lines += [f"failed passes in a row: {w.attempts}", f"last error: {shown(w.last_error or '-', lines=True)}"]
    for line in lines:
        out.print(line, markup=False)
    if not detail.records:
        out.print("steps: none recorded", markup=False)
        return
    table = Table(title=f"records ({len(detail.records)}, in the order written)")
    for column in ("#", "step", "written", "value"):
        table.add_column(column, justify="right" if column == "#" else "left")
    for number, record in enumerate(detail.records, 1):
        value = json.dumps(record["value"], default=str)[:80]
        table.add_row(str(number), shown(record["step"]), utc_text(record["written_at"]), shown(value))
    if w.last_error and w.state not in ("finished", "cancelled"):
        table.add_row("", "(next)", "-", shown(f"failed {w.attempts}x: {w.last_error.splitlines()[0][:70]}"))
    out.print(table)
