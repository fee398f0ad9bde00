"""`harel-edge`: run, inspect and repair a harel_edge deployment from the shell.

This module parses, renders and maps errors to exit codes; the work is in the library modules.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from harel_edge import dead_letter, migration, publishing
from harel_edge.access import check_writable
from harel_edge.connection import explain_connect_error
from harel_edge.doctor import diagnose
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    DatabaseAccessError,
    ForeignDatabaseError,
    HarelEdgeError,
    NotADatabaseError,
    PrimaryUnavailableError,
    SchemaError,
    tidy,
)
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings
from harel_edge.status import collect_status

HELP_WIDTH = 100
CONTEXT = {
    "help_option_names": ["-h", "--help"],
    "terminal_width": HELP_WIDTH,
    "max_content_width": HELP_WIDTH,
}

app = typer.Typer(
    name="harel-edge",
    help="Run, inspect and repair harel_edge: harel's statecharts and durable workflows on libSQL.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)
config_app = typer.Typer(
    help="Inspect the configuration.", no_args_is_help=True, rich_markup_mode=None, context_settings=CONTEXT
)
app.add_typer(config_app, name="config")
dead_letter_app = typer.Typer(
    help="The messages and workflows that failed too often: list, show, requeue, purge.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings=CONTEXT,
)
app.add_typer(dead_letter_app, name="dead-letter")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# exit codes (docs/cli.md)
EXIT_PROBLEM, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_DATABASE = 1, 2, 3, 4, 5


@dataclass
class Globals:
    overrides: dict[str, Any] = field(default_factory=dict)
    env_file: str | None = None
    log_format: str = "console"
    log_level: str = "warning"

    def settings(self, **more: Any) -> EdgeSettings:
        values = {k: v for k, v in {**self.overrides, **more}.items() if v is not None}
        if self.env_file is not None:
            if not Path(self.env_file).is_file():
                raise ConfigurationError(f"--env-file {self.env_file!r} does not exist")
            values["_env_file"] = self.env_file
        return EdgeSettings.load(**values)


@app.callback()
def main(
    ctx: typer.Context,
    profile: str | None = typer.Option(
        None, "--profile", help="local, sqld or replica (overrides HAREL_EDGE_PROFILE)."
    ),
    db_path: str | None = typer.Option(
        None, "--db-path", help="The database file, or the replica's file (overrides HAREL_EDGE_DB_PATH)."
    ),
    url: str | None = typer.Option(None, "--url", help="The sqld/Turso server (overrides HAREL_EDGE_URL)."),
    sync_url: str | None = typer.Option(
        None, "--sync-url", help="The primary a replica syncs with (overrides HAREL_EDGE_SYNC_URL)."
    ),
    prefix: str | None = typer.Option(None, "--prefix", help="Table prefix (overrides HAREL_EDGE_PREFIX)."),
    env_file: str | None = typer.Option(
        None, "--env-file", help="Read settings from this file instead of ./.env."
    ),
    log_format: str = typer.Option(
        "auto", "--log-format", help="Log lines on stderr: json, console, or auto (json unless a terminal)."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Settings come from HAREL_EDGE_* variables (and .env); these options override them.
    The auth token is only read from HAREL_EDGE_AUTH_TOKEN (or the env file), never from an
    option, so it stays out of shell history and process listings."""
    from harel_edge import observability  # noqa: PLC0415

    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format not in ("json", "console"):
        _fail(EXIT_CONFIG, f"--log-format {log_format!r}: use json, console or auto")
    observability.configure_logging(log_format, log_level)  # type: ignore[arg-type]
    ctx.obj = Globals(
        {"profile": profile, "db_path": db_path, "url": url, "sync_url": sync_url, "prefix": prefix},
        env_file,
        log_format,
        log_level,
    )


# ---- errors --------------------------------------------------------------------------------------


def _fail(code: int, message: str) -> None:
    err.print(f"harel-edge: error: {message}", markup=False)
    raise typer.Exit(code)


def _code_for(exc: BaseException) -> int:
    if isinstance(exc, ConfigurationError):
        return EXIT_CONFIG
    if isinstance(exc, PrimaryUnavailableError):
        return EXIT_UNREACHABLE
    if isinstance(exc, AuthError):
        return EXIT_AUTH
    if isinstance(exc, (NotADatabaseError, ForeignDatabaseError, SchemaError, DatabaseAccessError)):
        return EXIT_DATABASE
    return EXIT_PROBLEM


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every expected failure into one line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx: typer.Context | None = kwargs.get("ctx")
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except HarelEdgeError as exc:
            _fail(_code_for(exc), _scrub(tidy(str(exc)), ctx))
        except sqlite3.DatabaseError as exc:  # a local file read through the standard library
            _fail(
                EXIT_DATABASE,
                f"SQLite could not read the database ({exc}): run `harel-edge doctor` to check it, and "
                "restore it from a backup if it reports damage",
            )
        except ValueError as exc:  # the driver's errors are ValueErrors: explain them
            settings = _maybe_settings(ctx)
            explained = explain_connect_error(settings, exc) if settings is not None else exc
            text = tidy(str(explained))
            if isinstance(explained, HarelEdgeError):
                _fail(_code_for(explained), _scrub(text, ctx))
            _fail(EXIT_PROBLEM, _scrub(text, ctx))

    return wrapper


def _maybe_settings(ctx: typer.Context | None) -> EdgeSettings | None:
    try:
        return ctx.obj.settings() if ctx is not None and ctx.obj is not None else None
    except Exception:  # noqa: BLE001 - only used to explain another error
        return None


def _scrub(text: str, ctx: typer.Context | None) -> str:
    """The shared scrubber, also given the token of settings that failed to load."""
    settings = _maybe_settings(ctx)
    return scrub(
        text,
        os.environ.get("HAREL_EDGE_AUTH_TOKEN", "").strip(),
        os.environ.get("HAREL_LIBSQL_AUTH_TOKEN", "").strip(),
        settings.auth_token if settings is not None else None,
    )


# ---- publish --------------------------------------------------------------------------------------


@handled
def publish(
    ctx: typer.Context,
    group: str = typer.Argument(..., help="The group (for a statechart: the execution id)."),
    kind: str = typer.Argument(..., help="The event's kind, e.g. Pay."),
    data: str = typer.Option("{}", "--data", "-d", help="The event's data: a JSON object."),
    priority: int = typer.Option(0, "--priority", "-p", min=0, max=4, help="0 (default) to 4."),
    routing_key: str | None = typer.Option(
        None, "--routing-key", "-r", help="Only workers claiming this key take the group."
    ),
    event_id: str | None = typer.Option(
        None, "--id", help="The event id (dedupe key); a new one by default. Reuse it to retry safely."
    ),
    create: str | None = typer.Option(
        None,
        "--create",
        metavar="MACHINE",
        help="With KIND Start: first create execution GROUP of statechart MACHINE (if it does not exist).",
    ),
    definitions: str | None = typer.Option(
        None, "--definitions", "-D", help="With --create: the directory of .stm files that defines MACHINE."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the published event as JSON."),
) -> None:
    """Append an event to a group's queue.

    The group's first message fixes its priority and routing key; `--create MACHINE -D DIR` starts an execution.
    """
    request = publishing.publish_request(
        group,
        kind,
        data,
        priority=priority,
        routing_key=routing_key,
        event_id=event_id,
        create=create,
        definitions=definitions,
    )
    published = publishing.publish(ctx.obj.settings(), request)
    if as_json:
        print(json.dumps(published.as_dict()))
    elif published.duplicate:
        out.print(
            f"duplicate: {kind} {published.event_id} was already published to {group} within "
            "HAREL_EDGE_PUBLISH_WINDOW; nothing was queued",
            markup=False,
        )
    else:
        key = f", routing key {routing_key}" if routing_key else ""
        out.print(
            f"published {kind} {published.event_id} to {group} (priority {priority}{key})", markup=False
        )


# ---- status ---------------------------------------------------------------------------------------


@handled
def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    groups: int = typer.Option(10, "--groups", min=0, help="How many of the deepest groups to list."),
) -> None:
    """Show the queue, the workflows and a replica's lag.

    Depth by priority, routing key and group, in flight, parked, workflows, last sync. Reads only.
    """
    report = collect_status(ctx.obj.settings(), top=groups)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
        return
    queue = report.queue
    totals = queue["totals"]
    oldest = queue["oldest"]
    age = oldest["age_seconds"]
    out.print(
        f"{report.profile} at {report.where} (schema {report.schema_version}): "
        f"{totals['messages']} messages in {totals['groups']} groups, {totals['in_flight']} in flight, "
        f"{totals['parked']} parked",
        markup=False,
    )
    if oldest["seq"] is not None:
        out.print(
            f"oldest message: #{oldest['seq']} of {oldest['group_id']}"
            + (
                f", {age:.1f} s old"
                if age is not None
                else " (age unknown: its publisher did not stamp created_time)"
            ),
            markup=False,
        )
    table = Table(title="queue by priority and routing key")
    for column in ("priority", "routing key", "groups", "messages", "queued", "in flight", "parked"):
        table.add_column(column, justify="right" if column != "routing key" else "left")
    for row in queue["by_priority_and_routing_key"]:
        table.add_row(
            str(row["priority"]),
            row["routing_key"] or "-",
            *(str(row[k]) for k in ("groups", "messages", "queued", "in_flight", "parked")),
        )
    out.print(table)
    if queue["deepest_groups"]:
        deepest = Table(title=f"deepest groups (up to {groups})")
        for column in ("group", "priority", "routing key", "messages", "head"):
            deepest.add_column(column)
        for row in queue["deepest_groups"]:
            deepest.add_row(
                row["group_id"],
                str(row["priority"]),
                row["routing_key"] or "-",
                str(row["messages"]),
                row["head"],
            )
        out.print(deepest)
    workflows = report.workflows
    if workflows is not None and not workflows["namespaces"]:
        out.print(
            f"workflows: none queued ({workflows['finished']} finished, {workflows['claimed']} claimed now)",
            markup=False,
        )
    elif workflows is not None:
        table = Table(
            title=f"workflows ({workflows['finished']} finished, {workflows['claimed']} claimed now)"
        )
        for column in ("namespace", "ready", "sleeping", "claimed", "next wake"):
            table.add_column(column)
        for row in workflows["namespaces"]:
            wake = row["next_wake_in_seconds"]
            table.add_row(
                row["namespace"],
                str(row["ready"]),
                str(row["sleeping"]),
                str(row["claimed"]),
                "-" if wake is None else f"in {wake:.1f} s",
            )
        out.print(table)
    dead = report.dead_letters
    if dead is not None:
        total = dead["messages"] + dead["workflows"]
        out.print(
            f"dead letters: {dead['messages']} messages, {dead['workflows']} workflows"
            + (" (`harel-edge dead-letter list` shows them)" if total else ""),
            markup=False,
        )
    replica = report.replica
    if replica is not None:
        lag = replica.lag_seconds
        out.print(
            f"replica {replica.file}: "
            + (
                "never synced on this machine"
                if lag is None
                else f"last synced {replica.last_sync_at} ({lag:.1f} s ago)"
            )
            + (
                f", sees {replica.messages_seen_locally} messages locally"
                if replica.messages_seen_locally is not None
                else ""
            ),
            markup=False,
        )


# ---- migrate --------------------------------------------------------------------------------------


@handled
def migrate(
    ctx: typer.Context,
    print_sql: bool = typer.Option(False, "--print-sql", help="Print the schema versions as SQL; change nothing."),
    adopt: bool = typer.Option(
        False, "--adopt", help="Add harel_edge's tables to a database that holds other applications' tables."
    ),
) -> None:
    """Create or upgrade the schema.

    Each missing version once, in one transaction; safe while workers run. --print-sql prints
    the versions as SQL and touches nothing.
    """
    settings = ctx.obj.settings()
    if print_sql:
        sys.stdout.write(migration.migration_script(settings.prefix))
        return
    done = migration.migrate(settings, adopt=adopt)
    if done.up_to_date:
        out.print(f"schema version {done.found}: up to date ({done.where})", markup=False)
    else:
        applied = ", ".join(str(number) for number in done.applied)
        out.print(
            f"schema version {done.found} -> {done.version}, applied {applied} for prefix {settings.prefix!r}"
            f" ({done.where})",
            markup=False,
        )


# ---- config ---------------------------------------------------------------------------------------


@handled
def config_show(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Show the settings in effect, the token redacted.

    After the environment, the env file and the global options, in that order of precedence."""
    values = ctx.obj.settings().redacted()
    if as_json:
        print(json.dumps(values, indent=2, default=str))
        return
    table = Table(title="harel_edge settings")
    table.add_column("setting")
    table.add_column("variable")
    table.add_column("value")
    for key, value in values.items():
        table.add_row(key, f"HAREL_EDGE_{key.upper()}", "-" if value is None else str(value))
    out.print(table)


# ---- doctor ---------------------------------------------------------------------------------------


@handled
def doctor(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON.")
) -> None:
    """Check connectivity, credentials, schema, clock skew and sync health.

    Each problem comes with what to do about it. Exits 1 if a check failed. Writes nothing."""
    diagnosis = diagnose(ctx.obj.settings())
    if as_json:
        print(json.dumps(diagnosis.as_dict(), indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for check in diagnosis.checks:
            out.print(f"{marks[check.level]}  {check.name}: {check.detail}", markup=False)
            if check.fix and check.level != "ok":
                out.print(f"      -> {check.fix}", markup=False)
    if diagnosis.failed:
        raise typer.Exit(EXIT_PROBLEM)


# ---- worker ---------------------------------------------------------------------------------------


@handled
def worker(
    ctx: typer.Context,
    definitions: str | None = typer.Option(
        None, "--definitions", "-D", help="A directory of .stm statechart definitions to run."
    ),
    workflow: Annotated[
        list[str] | None,
        typer.Option(
            "--workflow", "-w", help="A durable workflow to run: [namespace=]module:function (repeatable)."
        ),
    ] = None,
    processes: int = typer.Option(1, "--processes", "-n", min=1, max=64, help="Worker processes to run."),
    concurrency: int = typer.Option(
        32, "--concurrency", min=1, help="Statechart events in flight per process."
    ),
    poll: float = typer.Option(1.0, "--poll", min=0.01, help="Seconds between looks for ready workflows."),
    grace: float = typer.Option(
        30.0, "--grace", min=0.0, help="Seconds a stop may take before held work is given back."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics on 127.0.0.1:PORT (+n per process)."
    ),
    no_migrate: bool = typer.Option(
        False, "--no-migrate", help="Only check the schema; a migration tool owns it."
    ),
    adopt: bool = typer.Option(
        False, "--adopt", help="Accept a database holding other applications' tables."
    ),
) -> None:
    """Run an edge worker: statecharts and durable workflows.

    Until SIGTERM or SIGINT; then it finishes or gives back what it holds and exits 0.
    """
    from harel_edge.supervisor import run_processes  # noqa: PLC0415
    from harel_edge.worker import WorkerOptions, load_definitions, parse_workflow, serve  # noqa: PLC0415

    g: Globals = ctx.obj
    settings = g.settings(**({"metrics_port": metrics_port} if metrics_port is not None else {}))
    if "worker_id" not in settings.model_fields_set:
        # The default, hostname-pid, is the same in every container of a scaled service (one
        # host name, pid 1): a suffix tells their log lines and leases apart.
        settings = settings.model_copy(update={"worker_id": f"{settings.worker_id}-{secrets.token_hex(2)}"})
    options = WorkerOptions(
        definitions_dir=definitions,
        workflows=tuple(parse_workflow(w) for w in workflow or ()),
        concurrency=concurrency,
        poll=poll,
        grace=grace,
        migrate=not no_migrate,
        adopt=adopt,
    )
    if not definitions and not options.workflows:
        raise ConfigurationError(
            "nothing to run: give --definitions DIR (statecharts) and/or --workflow NS=module:function"
        )
    load_definitions(definitions)  # a bad directory or machine fails here, before any process starts
    for spec in options.workflows:
        spec.load()
    # A foreign file, a refused or read-only token, an unreachable primary: fail now, clearly.
    check_writable(settings, adopt=adopt)
    if processes == 1:
        report = serve(settings, options)
        if report.error:
            _fail(EXIT_PROBLEM, report.error)
        return
    raise typer.Exit(
        run_processes(settings, options, processes, log_format=g.log_format, log_level=g.log_level)
    )


# ---- demo -----------------------------------------------------------------------------------------


@handled
def demo(
    db: str | None = typer.Option(
        None, "--db", help="Use (and keep) this database file instead of a temporary one."
    ),
    orders: int = typer.Option(12, "--orders", min=1, max=500, help="Statechart executions to run."),
    workflows: int = typer.Option(6, "--workflows", min=0, max=200, help="Durable workflows to run."),
    keep: bool = typer.Option(False, "--keep", help="Keep the temporary directory and print where it is."),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0, help="Give up after this many seconds."),
) -> None:
    """Run the whole job on this machine, in seconds.

    On the local profile, in a temporary directory, with two worker processes. Ignores HAREL_EDGE_*.
    """
    from harel_edge.examples.demo import run_demo  # noqa: PLC0415

    workdir = None if db else Path(tempfile.mkdtemp(prefix="harel-edge-demo-"))
    path = Path(db) if db else workdir / "demo.db"  # type: ignore[operator]
    try:
        ok = run_demo(path, orders=orders, workflows=workflows, timeout=timeout, console=out)
    finally:
        if workdir is not None:
            if keep:
                out.print(f"kept {workdir}", markup=False)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if not ok:
        raise typer.Exit(EXIT_PROBLEM)


# ---- dead letters ---------------------------------------------------------------------------------


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _kind_option(kind: str | None) -> str | None:
    if kind is not None and kind not in dead_letter.KINDS:
        raise ConfigurationError(f"--kind {kind!r}: use {' or '.join(dead_letter.KINDS)}")
    return kind


def _dead_letter_id(value: int) -> int:
    if value < 1:
        raise ConfigurationError(f"ID {value} is not a dead letter's id: `harel-edge dead-letter list` shows them")
    return value


def _not_found(dead_letter_id: int) -> None:
    _fail(EXIT_PROBLEM, f"no dead letter #{dead_letter_id}: `harel-edge dead-letter list` shows the ones there are")


@handled
def dead_letter_list(
    ctx: typer.Context,
    kind: str | None = typer.Option(None, "--kind", help="Only this kind: message or workflow."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the dead letters, oldest first.

    Messages and workflows that failed HAREL_EDGE_MAX_DELIVERIES times, moved aside. Reads only.
    """
    settings = ctx.obj.settings()
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
            letter.target,
            str(what),
            str(letter.attempts),
            _when(letter.dead_at),
            error[:80] + ("..." if len(error) > 80 else ""),
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
    wanted = _dead_letter_id(dead_letter_id)
    letter = dead_letter.read_dead_letter(settings, wanted)
    if letter is None:
        _not_found(wanted)
    if as_json:
        print(json.dumps(letter.as_dict(), indent=2))
        return
    lines = [f"dead letter #{letter.id}: {letter.kind} of {letter.target}"]
    if letter.kind == "message":
        key = letter.routing_key or "-"
        lines.append(f"queue seq {letter.seq}, priority {letter.priority}, routing key {key}")
        lines.append(f"failed deliveries: {letter.attempts}")
    else:
        lines.append(f"failed passes in a row: {letter.attempts}")
    lines.append(f"dead at: {_when(letter.dead_at)}")
    lines.append(f"last error: {letter.last_error or '- (none recorded: its worker may have died handling it)'}")
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
    wanted = _dead_letter_id(dead_letter_id)
    letter = dead_letter.requeue_dead_letter(settings, wanted)
    if letter is None:
        _not_found(wanted)
    if letter.kind == "message":
        out.print(f"requeued message #{letter.id} at the tail of group {letter.target}", markup=False)
    else:
        out.print(f"requeued workflow #{letter.id} ({letter.target}): ready now", markup=False)


@handled
def dead_letter_purge(
    ctx: typer.Context,
    dead_letter_id: int | None = typer.Argument(None, metavar="ID", help="The dead letter's id (from `list`)."),
    everything: bool = typer.Option(False, "--all", help="Every dead letter (of --kind, if given)."),
    kind: str | None = typer.Option(None, "--kind", help="With --all: only this kind, message or workflow."),
) -> None:
    """Delete one dead letter (ID) or all of them (--all), for good."""
    settings = ctx.obj.settings()
    if (dead_letter_id is None) == (not everything):
        raise ConfigurationError("give a dead letter's ID or --all (not both)")
    if kind is not None and not everything:
        raise ConfigurationError("--kind goes with --all")
    if everything:
        count = dead_letter.purge_dead_letters(settings, kind=_kind_option(kind)).count
        out.print(f"purged {count} dead letter{'' if count == 1 else 's'}", markup=False)
        return
    wanted = _dead_letter_id(dead_letter_id)  # type: ignore[arg-type]
    if not dead_letter.purge_dead_letter(settings, wanted).count:
        _not_found(wanted)
    out.print(f"purged dead letter #{wanted}", markup=False)


# ---- the reference ----------------------------------------------------------------------------------


def command_paths() -> list[list[str]]:
    """Every command, as the words after `harel-edge`, the top level first."""
    return [
        [],
        ["demo"],
        ["worker"],
        ["publish"],
        ["status"],
        ["migrate"],
        ["config"],
        ["config", "show"],
        ["dead-letter"],
        ["dead-letter", "list"],
        ["dead-letter", "show"],
        ["dead-letter", "requeue"],
        ["dead-letter", "purge"],
        ["doctor"],
    ]


def help_text(path: list[str]) -> str:
    """Exactly what `harel-edge PATH --help` prints."""
    command = typer.main.get_command(app)
    ctx = command.make_context("harel-edge", [*path, "--help"], resilient_parsing=True)
    for word in path:
        sub = ctx.command.get_command(ctx, word)  # type: ignore[attr-defined]
        ctx = sub.make_context(word, [], parent=ctx, resilient_parsing=True)
    return ctx.get_help() + "\n"


def reference_markdown() -> str:
    """docs/cli.md: generated from the commands' help, so it cannot drift (a test checks)."""
    parts = [
        "# `harel-edge` command reference",
        "",
        "Generated from `--help` by `harel-edge reference > docs/cli.md`; `tests/cli/test_reference.py`",
        "fails when this file and the command disagree. A tour of the commands is in",
        "[quickstart.md](quickstart.md); running workers under compose, in [deploy.md](deploy.md).",
        "",
        "Exit codes: 0 success; 1 the command ran and found a problem (doctor, demo, a worker that",
        "failed); 2 bad configuration or arguments; 3 primary unreachable; 4 credentials refused;",
        "5 the database cannot be used as it is (not a database, another application's, damaged, newer",
        "schema, no schema). Errors are one line on stderr.",
        "",
    ]
    for path in command_paths():
        title = " ".join(["harel-edge", *path])
        parts += [f"## `{title}`", "", "```text", help_text(path).rstrip("\n"), "```", ""]
    return "\n".join(parts)


def reference() -> None:
    """Print docs/cli.md."""
    sys.stdout.write(reference_markdown())


# Registered here, in the order `--help` lists them: the README's first command first.
for _command in (demo, worker, publish, status, migrate, doctor):
    app.command()(_command)
config_app.command("show")(config_show)
for _name, _command in (
    ("list", dead_letter_list),
    ("show", dead_letter_show),
    ("requeue", dead_letter_requeue),
    ("purge", dead_letter_purge),
):
    dead_letter_app.command(_name)(_command)
app.command("reference", hidden=True)(reference)
