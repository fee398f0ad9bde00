"""`harel-edge dead-letter`: list, show, requeue and purge what failed too often."""


from __future__ import annotations

import json
import sys

import typer
from rich.table import Table

from harel_edge.cli.app import (
    EXIT_PROBLEM,
    fail,
    handled,
    out,
    plural,
    shown,
)
from harel_edge.errors import (
    ConfigurationError,
)
from harel_edge.timestamps import utc_text

# ---- dead letters ---------------------------------------------------------------------------------


# harel_edge.dead_letter.KINDS, not imported for `--help` (it pulls in harel and libsql); a test
# checks that they agree.
KINDS: tuple[str, ...] = ("message", "workflow")
KIND = f"<{'|'.join(KINDS)}>"


def _kind_option(kind: str | None) -> str | None:
    if kind is not None and kind not in KINDS:
        raise ConfigurationError(f"--kind {kind!r}: use {' or '.join(KINDS)}")
    return kind


def _dead_letter_id(value: int) -> int:
    if value < 1:
        raise ConfigurationError(f"ID {value} is not a dead letter's id: `harel-edge dead-letter list` shows them")
    return value


def _not_found(dead_letter_id: int) -> None:
    fail(EXIT_PROBLEM, f"no dead letter #{dead_letter_id}: `harel-edge dead-letter list` shows the ones there are")


@handled
def dead_letter_list(
    ctx: typer.Context,
    kind: str | None = typer.Option(None, "--kind", metavar=KIND, help="Only this kind."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the dead letters, oldest first.

    Messages and workflows that failed HAREL_EDGE_MAX_DELIVERIES times, moved aside. Reads only.
    """
    settings = ctx.obj.settings()
    from harel_edge import dead_letter  # noqa: PLC0415
    found = dead_letter.read_dead_letters(settings, kind=_kind_option(kind), limit=limit)
    if as_json:
        print(json.dumps([letter.as_dict() for letter in found], indent=2))
        return
    if not found:
        out.print("no dead letters", markup=False)
        return
    table = Table(title=f"dead letters (oldest {len(found)})" if len(found) == limit else "dead letters")
    for column in ("id", "kind", "of", "what", "attempts", "dead at", "last error"):
        table.add_column(column, justify="right" if column in ("id", "attempts") else "left")
    for letter in found:
        what = (letter.event or {}).get("kind", "-") if letter.kind == "message" else "-"
        error = (letter.last_error or "-").splitlines()[0] if letter.last_error else "-"
        table.add_row(
            str(letter.id),
            letter.kind,
            shown(letter.target),
            shown(what),
            str(letter.attempts),
            utc_text(letter.dead_at),
            shown(error[:80] + ("..." if len(error) > 80 else "")),
        )
    out.print(table)


@handled
def dead_letter_show(
    ctx: typer.Context,
    dead_letter_id: int = typer.Argument(..., metavar="ID", help="The dead letter's id (from `list`)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one dead letter: what it was, how often it failed, and its last error. Reads only."""
    settings = ctx.obj.settings()
    from harel_edge import dead_letter  # noqa: PLC0415
    wanted = _dead_letter_id(dead_letter_id)
    letter = dead_letter.read_dead_letter(settings, wanted)
    if letter is None:
        _not_found(wanted)
    if as_json:
        print(json.dumps(letter.as_dict(), indent=2))
        return
    lines = [f"dead letter #{letter.id}: {letter.kind} of {shown(letter.target)}"]
    if letter.kind == "message":
        key = shown(letter.routing_key or "-")
        lines.append(f"queue seq {letter.seq}, priority {letter.priority}, routing key {key}")
        lines.append(f"failed deliveries: {letter.attempts}")
    else:
        lines.append(f"failed passes in a row: {letter.attempts}")
    lines.append(f"dead at: {utc_text(letter.dead_at)}")
    lines.append(f"last error: {shown(letter.last_error or '- (none recorded: its worker may have died handling it)', lines=True)}")
    for line in lines:
        out.print(line, markup=False)
    if letter.event is not None:
        out.print("event:", markup=False)
        out.print(json.dumps(letter.event, indent=2), markup=False)


@handled
def dead_letter_requeue(
    ctx: typer.Context,
    dead_letter_id: int = typer.Argument(..., metavar="ID", help="The dead letter's id (from `list`)."),
) -> None:
    """Put a dead letter back, its count reset.

    Fix what made it fail first: it is dead-lettered again after as many failures.
    """
    settings = ctx.obj.settings()
    from harel_edge import dead_letter  # noqa: PLC0415
    wanted = _dead_letter_id(dead_letter_id)
    letter = dead_letter.requeue_dead_letter(settings, wanted)
    if letter is None:
        _not_found(wanted)
    if letter.kind == "message":
        out.print(f"requeued message #{letter.id} at the tail of group {shown(letter.target)}", markup=False)
    else:
        out.print(f"requeued workflow #{letter.id} ({shown(letter.target)}): ready now", markup=False)


@handled
def dead_letter_purge(
    ctx: typer.Context,
    dead_letter_id: int | None = typer.Argument(None, metavar="ID", help="The dead letter's id (from `list`)."),
    everything: bool = typer.Option(False, "--all", help="Every dead letter (of --kind, if given)."),
    kind: str | None = typer.Option(None, "--kind", metavar=KIND, help="With --all: only this kind."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --all: do not ask for confirmation."),
) -> None:
    """Delete one dead letter (ID) or all of them (--all, after a confirmation or --yes), for good."""
    settings = ctx.obj.settings()
    from harel_edge import dead_letter  # noqa: PLC0415
    if (dead_letter_id is None) == (not everything):
        raise ConfigurationError("give a dead letter's ID or --all (not both)")
    if kind is not None and not everything:
        raise ConfigurationError("--kind goes with --all")
    if everything:
        wanted_kind = _kind_option(kind)
        what = f"every {wanted_kind} dead letter" if wanted_kind else "every dead letter"
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigurationError(
                    f"dead-letter purge --all deletes {what} for good: add --yes to confirm "
                    "(there is no terminal to ask on); nothing was deleted"
                )
            if not typer.confirm(f"Delete {what} for good?", default=False):
                out.print("nothing was deleted", markup=False)
                raise typer.Exit(EXIT_PROBLEM)
        count = dead_letter.purge_dead_letters(settings, kind=wanted_kind).count
        out.print(f"purged {plural(count, 'dead letter')}", markup=False)
        return
    wanted = _dead_letter_id(dead_letter_id)  # type: ignore[arg-type]
    if not dead_letter.purge_dead_letter(settings, wanted).count:
        _not_found(wanted)
    out.print(f"purged dead letter #{wanted}", markup=False)
