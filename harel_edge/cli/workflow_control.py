"""`harel-edge workflows cancel|resume|fork`: the operator's commands on one durable workflow
(`harel_edge.workflow_control`), each saying what it changed."""

from __future__ import annotations

import json

import typer

from harel_edge.cli.app import handled, out, shown

AS_JSON = typer.Option(False, "--json", help="Print the outcome as JSON.")
WORKFLOW = typer.Argument(..., metavar="ID", help="The workflow's id (from `workflows list`).")


def _said(change, as_json: bool, *, applies: str) -> None:  # noqa: ANN001 - a WorkflowChange
    if as_json:
        print(json.dumps(change.as_dict(), indent=2))
    elif change.changed:
        out.print(f"{shown(change.workflow)}: {change.before} -> {change.after}", markup=False)
    else:
        out.print(
            f"{shown(change.workflow)} is {change.after}: {change.command} changed nothing ({applies})", markup=False
        )


@handled
def workflows_cancel(ctx: typer.Context, workflow: str = WORKFLOW, as_json: bool = AS_JSON) -> None:
    """Stop a workflow: a running pass writes nothing more, its timers and wakeups are dropped,
    and no pass runs until `workflows resume`."""
    from harel_edge.workflow_control import cancel_workflow  # noqa: PLC0415

    _said(cancel_workflow(ctx.obj.settings(), workflow), as_json, applies="only an unfinished workflow is cancelled")


@handled
def workflows_resume(ctx: typer.Context, workflow: str = WORKFLOW, as_json: bool = AS_JSON) -> None:
    """Run a cancelled or dead workflow again from its last recorded step, its failed passes forgotten."""
    from harel_edge.workflow_control import resume_workflow  # noqa: PLC0415

    _said(resume_workflow(ctx.obj.settings(), workflow), as_json, applies="only a cancelled or dead workflow resumes")


@handled
def workflows_fork(
    ctx: typer.Context,
    workflow: str = WORKFLOW,
    from_step: str = typer.Option(..., "--from-step", metavar="STEP", help="The recorded step to run again, and all after it."),
    new_id: str | None = typer.Option(None, "--id", metavar="NEW", help="The new workflow's id (default: ID.fork-<random>)."),
    namespace: str | None = typer.Option(
        None, "--namespace", metavar="NS", help="Where the new workflow runs (default: the original's namespace)."
    ),
    as_json: bool = AS_JSON,
) -> None:
    """Copy a workflow's records from before STEP under a new id, ready now: STEP and what follows
    run again there; the original is left as it is."""
    from harel_edge.workflow_control import fork_workflow  # noqa: PLC0415

    change = fork_workflow(ctx.obj.settings(), workflow, from_step, new_id, namespace=namespace)
    if as_json:
        print(json.dumps(change.as_dict(), indent=2))
    elif change.changed:
        out.print(
            f"forked {shown(workflow)} from step {shown(from_step)} as {shown(change.workflow)}: ready now", markup=False
        )
    else:
        out.print(f"{shown(change.workflow)} was forked from {shown(workflow)} already: fork changed nothing", markup=False)
