"""`harel-edge publish`: one event from the command line, or many from an NDJSON file
(`--from`); the work is in `harel_edge.publishing`."""


from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import typer

from harel_edge.cli.app import err, handled, out, plural, shown
from harel_edge.errors import ConfigurationError

# ---- publish --------------------------------------------------------------------------------------


@handled
def publish(
    ctx: typer.Context,
    group: str | None = typer.Argument(None, metavar="GROUP", help="The group (for a statechart: the execution id)."),
    kind: str | None = typer.Argument(None, metavar="KIND", help="The event's kind, e.g. Pay."),
    data: str = typer.Option("{}", "--data", "-d", metavar="JSON", help="The event's data: a JSON object."),
    priority: int = typer.Option(0, "--priority", "-p", min=0, max=4, help="0 (default) to 4."),
    routing_key: str | None = typer.Option(
        None, "--routing-key", "-r", metavar="KEY", help="Only workers claiming this key take the group."
    ),
    event_id: str | None = typer.Option(
        None, "--id", metavar="ID", help="The event id (dedupe key); a new one by default. Reuse it to retry safely."
    ),
    create: str | None = typer.Option(
        None,
        "--create",
        metavar="MACHINE",
        help="With KIND Start: first create execution GROUP of statechart MACHINE (if it does not exist).",
    ),
    definitions: str | None = typer.Option(
        None, "--definitions", "-D", metavar="DIR", help="With --create: the directory of .stm files that defines MACHINE."
    ),
    from_file: str | None = typer.Option(
        None,
        "--from",
        metavar="FILE",
        help="Publish every event of FILE (- for stdin) instead: NDJSON, one object a line with "
        'group, kind and optionally data, priority, routing_key, id, create (e.g. {"group": "order-1", '
        '"kind": "Pay", "data": {"amount": 12.5}, "id": "pay-1"}). Checked in full first, sent '
        "2,000 to a request; give ids to make running it again safe.",
    ),
    delay: float | None = typer.Option(
        None, "--delay", metavar="SECONDS", help="Claimable only this long from now (the primary's clock)."
    ),
    at: str | None = typer.Option(
        None, "--at", metavar="TIME", help="Claimable only from TIME: a unix time or ISO 8601 (2026-12-24T18:00:00Z)."
    ),
    limit_key: str | None = typer.Option(
        None, "--limit-key", metavar="KEY", help="The key the group's limits count under (default: its routing key)."
    ),
    debounce: float | None = typer.Option(
        None, "--debounce", metavar="SECONDS", help="Wait this long for a later publish of the same key to replace it."
    ),
    debounce_key: str | None = typer.Option(None, "--debounce-key", metavar="KEY", help="With --debounce: the key (default: KIND)."),
    max_wait: float | None = typer.Option(
        None, "--max-wait", metavar="SECONDS", help="With --debounce: never later than this after the first."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the published event as JSON."),
    database: str | None = typer.Option(None, "--database", metavar="NAME", help="Which of the deployment's databases."),
) -> None:
    """Append an event to a group's queue, or many with --from FILE.

    The group's first message fixes its priority, routing key and limit key; `--create MACHINE
    -D DIR` starts an execution; --delay, --at and --debounce hold it back (docs/flow-control.md).
    """
    hold = {
        "delay": delay,
        "at": None if at is None else _unix_time(at),
        "limit_key": limit_key,
        "debounce": debounce,
        "debounce_key": debounce_key,
        "max_wait": max_wait,
    }
    if from_file is not None:
        if group is not None or kind is not None or create is not None or event_id is not None or any(
            value is not None for value in hold.values()
        ):
            raise ConfigurationError(
                "--from FILE takes each event's group, kind, id, create and flow-control fields from its lines: "
                "drop GROUP, KIND, --id, --create, --delay, --at, --limit-key and the --debounce options"
            )
        _publish_from(ctx, from_file, definitions, as_json, database)
        return
    if group is None or kind is None:
        raise ConfigurationError("give GROUP and KIND (e.g. harel-edge publish order-1 Pay), or --from FILE")
    from harel_edge import publishing  # noqa: PLC0415 - imports harel and libsql

    request = publishing.publish_request(
        group,
        kind,
        data,
        priority=priority,
        routing_key=routing_key,
        event_id=event_id,
        create=create,
        definitions=definitions,
        hold=hold,
    )
    published = publishing.publish(ctx.obj.settings(database=database), request)
    if as_json:
        print(json.dumps(published.as_dict()))
    elif published.duplicate:
        out.print(
            f"duplicate: {shown(kind)} {shown(published.event_id)} was already published to {shown(group)} within "
            "HAREL_EDGE_PUBLISH_WINDOW; nothing was queued",
            markup=False,
        )
    else:
        key = f", routing key {shown(routing_key)}" if routing_key else ""
        held = "".join(f", {name.replace('_', ' ')} {shown(value)}" for name, value in request.hold.items())
        out.print(
            f"published {shown(kind)} {shown(published.event_id)} to {shown(group)} (priority {priority}{key}{held})", markup=False
        )


def _unix_time(text: str) -> float:
    """`--at`: a unix time, or an ISO 8601 time (UTC unless it names its offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(
            f"--at {text!r} is neither a unix time nor an ISO 8601 time (e.g. 2026-12-24T18:00:00Z)"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _publish_from(ctx: typer.Context, source: str, definitions: str | None, as_json: bool, database: str | None) -> None:
    """`publish --from`: read and check every line, then send them in batches behind a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from harel_edge import publishing  # noqa: PLC0415

    if source == "-":
        requests = publishing.read_lines(publishing.utf8_lines(sys.stdin.buffer), "stdin", definitions=definitions)
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigurationError(f"--from {source}: no such file (give an NDJSON file, or - to read stdin)")
        with path.open("rb") as binary:
            requests = publishing.read_lines(publishing.utf8_lines(binary), source, definitions=definitions)
    settings = ctx.obj.settings(database=database)
    with Progress(
        TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True
    ) as progress:
        task = progress.add_task("publishing", total=len(requests))
        done = publishing.publish_bulk(settings, requests, on_batch=lambda n: progress.advance(task, n))
    if as_json:
        print(json.dumps(done.as_dict()))
        return
    created = f", created {plural(done.created, 'execution')}" if done.created else ""
    already = (
        f"; {plural(done.already_queued, 'event')} already there, not queued again (its group had its id within"
        " HAREL_EDGE_PUBLISH_WINDOW)" if done.already_queued else ""
    )
    out.print(
        f"queued {done.queued} of {plural(done.events, 'event')} in {plural(done.batches, 'batch', 'batches')}"
        f"{created}{already}",
        markup=False,
    )
