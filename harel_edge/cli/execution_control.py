"""`harel-edge executions suspend|resume|cancel|terminate|retry`: harel's control plane on one
execution (`harel_edge.execution_control`), each saying what it changed."""

from __future__ import annotations

import json

import typer

from harel_edge.cli.app import EXIT_CONFIG, fail, handled, out, shown

AS_JSON = typer.Option(False, "--json", help="Print the outcome as JSON.")
DEFINITIONS = typer.Option(
    None, "--definitions", "-D", metavar="DIR", help="The directory of .stm files the workers run."
)


def _control(ctx: typer.Context, execution_id: str, command: str, as_json: bool, **options: object) -> None:
    settings = ctx.obj.settings()
    from harel_edge.execution_control import control_execution  # noqa: PLC0415

    outcome = control_execution(settings, execution_id, command, **options)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps(outcome.as_dict(), indent=2))
    elif outcome.changed:
        where = f" (in {shown(outcome.state)})" if outcome.state else ""
        ends = ": its Cancel transition ends it, done with its final state's outcome" if outcome.after == "cancelling" else ""
        out.print(f"{shown(outcome.id)}: {outcome.before} -> {outcome.after}{where}{ends}", markup=False)
    else:
        out.print(f"{shown(outcome.id)} is {outcome.before}: {command} changed nothing", markup=False)


@handled
def executions_suspend(ctx: typer.Context, execution_id: str = typer.Argument(..., metavar="ID"), as_json: bool = AS_JSON) -> None:
    """Pause a running execution: its queued events wait (given back by the workers) until resume."""
    _control(ctx, execution_id, "suspend", as_json)


@handled
def executions_resume(ctx: typer.Context, execution_id: str = typer.Argument(..., metavar="ID"), as_json: bool = AS_JSON) -> None:
    """Resume a suspended execution where it stopped, with its queued events."""
    _control(ctx, execution_id, "resume", as_json)


@handled
def executions_cancel(
    ctx: typer.Context,
    execution_id: str = typer.Argument(..., metavar="ID"),
    definitions: str | None = DEFINITIONS,
    reason: str | None = typer.Option(None, "--reason", metavar="JSON", help="Data for the machine's Cancel event."),
    as_json: bool = AS_JSON,
) -> None:
    """Cancel an execution: its own Cancel transition where the machine models one, else terminate."""
    data = None
    if reason is not None:
        try:
            data = json.loads(reason)
        except json.JSONDecodeError as exc:
            fail(EXIT_CONFIG, f"--reason is not JSON ({exc.msg}): give an object, e.g. '{{\"why\": \"duplicate\"}}'")
        if not isinstance(data, dict):
            fail(EXIT_CONFIG, "--reason must be a JSON object, e.g. '{\"why\": \"duplicate\"}'")
    _control(ctx, execution_id, "cancel", as_json, definitions_dir=definitions, reason=data)


@handled
def executions_terminate(ctx: typer.Context, execution_id: str = typer.Argument(..., metavar="ID"), as_json: bool = AS_JSON) -> None:
    """End an execution at once (cancelled, no hooks run); its queued events are dropped unapplied."""
    _control(ctx, execution_id, "terminate", as_json)


@handled
def executions_retry(
    ctx: typer.Context,
    execution_id: str = typer.Argument(..., metavar="ID"),
    to: str = typer.Option(..., "--to", metavar="STATE", help="The leaf state to run it again from."),
    definitions: str | None = DEFINITIONS,
    as_json: bool = AS_JSON,
) -> None:
    """Run a failed execution again from STATE, once the bug that failed it is fixed."""
    _control(ctx, execution_id, "retry", as_json, definitions_dir=definitions, to_state=to)
