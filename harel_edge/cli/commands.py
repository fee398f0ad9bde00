"""The top-level commands: parse, call the library, render; the work is in the library modules."""


from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harel_edge.cli.app import (
    EXIT_PROBLEM,
    Globals,
    fail,
    handled,
    out,
    shown,
)
from harel_edge.cli.databases import migrate_each, migrated
from harel_edge.errors import (
    ConfigurationError,
)

# The library modules are imported by the commands that use them, once the settings are read: they
# pull in harel, libsql and the metrics, which `--help` and a refused configuration do not need.

# ---- migrate --------------------------------------------------------------------------------------


@handled
def migrate(
    ctx: typer.Context,
    print_sql: bool = typer.Option(False, "--print-sql", help="Print the schema versions as SQL; change nothing."),
    adopt: bool = typer.Option(
        False, "--adopt", help="Add harel_edge's tables to a database that holds other applications' tables."
    ),
    database: str | None = typer.Option(None, "--database", metavar="NAME", help="Which of the deployment's databases."),
    all_databases: bool = typer.Option(False, "--all", help="Every database of HAREL_EDGE_DATABASES, one after another."),
) -> None:
    """Create or upgrade the schema.

    Each missing version once, in one transaction; safe while workers run. --print-sql prints
    the versions as SQL and touches nothing. --all migrates each database of the deployment.
    """
    from harel_edge import migration  # noqa: PLC0415

    if all_databases:
        settings = ctx.obj.settings(deployment=True)
        if print_sql:
            raise typer.BadParameter("--print-sql prints the same SQL for every database: leave out --all")
        migrate_each(settings, adopt)
        return
    settings = ctx.obj.settings(database=database)
    if print_sql:
        sys.stdout.write(migration.migration_script(settings.prefix))
        return
    out.print(migrated(migration.migrate(settings, adopt=adopt), settings.prefix), markup=False)


# ---- config ---------------------------------------------------------------------------------------


@handled
def config_show(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Show the settings in effect, each with where it came from, the token redacted.

    The global options win over the environment, which wins over the env file."""
    values = ctx.obj.settings().redacted()
    sources = ctx.obj.sources()
    if as_json:
        print(json.dumps({key: {"value": value, "source": sources[key]} for key, value in values.items()}, indent=2, default=str))
        return
    table = Table(title="harel_edge settings")
    table.add_column("setting")
    table.add_column("variable")
    table.add_column("value")
    table.add_column("from")
    for key, value in values.items():
        table.add_row(key, f"HAREL_EDGE_{key.upper()}", "-" if value is None else shown(value), sources[key])
    out.print(table)


# ---- doctor ---------------------------------------------------------------------------------------


@handled
def doctor(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON.")
) -> None:
    """Check connectivity, credentials, schema, clock skew and sync health.

    Each problem comes with what to do about it. Exits 1 if a check failed. Writes nothing."""
    settings = ctx.obj.settings()
    from harel_edge.doctor import diagnose  # noqa: PLC0415

    diagnosis = diagnose(settings)
    if as_json:
        print(json.dumps(diagnosis.as_dict(), indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for check in diagnosis.checks:
            out.print(f"{marks[check.level]}  {check.name}: {shown(check.detail)}", markup=False)
            if check.fix and check.level != "ok":
                out.print(f"      -> {shown(check.fix)}", markup=False)
    if diagnosis.failed:
        raise typer.Exit(EXIT_PROBLEM)


# ---- worker ---------------------------------------------------------------------------------------


@handled
def worker(
    ctx: typer.Context,
    definitions: str | None = typer.Option(
        None, "--definitions", "-D", metavar="DIR", help="A directory of .stm statechart definitions to run."
    ),
    workflow: Annotated[
        list[str] | None,
        typer.Option(
            "--workflow", "-w", metavar="[NS=]MODULE:FUNCTION", help="A durable workflow to run: [namespace=]module:function (repeatable)."
        ),
    ] = None,
    processes: int = typer.Option(1, "--processes", "-n", min=1, max=64, help="Worker processes to run."),
    max_in_flight: int | None = typer.Option(
        None,
        "--max-in-flight",
        min=1,
        metavar="N",
        help="Most statechart events in flight per process (HAREL_EDGE_MAX_IN_FLIGHT, default 1024).",
    ),
    max_workflow_passes: int | None = typer.Option(
        None,
        "--max-workflow-passes",
        min=1,
        metavar="N",
        help="Most durable-workflow passes at once per process (HAREL_EDGE_MAX_WORKFLOW_PASSES, default 32).",
    ),
    poll: float = typer.Option(1.0, "--poll", min=0.01, help="Seconds between looks for ready workflows."),
    grace: float = typer.Option(
        30.0, "--grace", min=0.0, help="Seconds a stop may take before held work is given back."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", metavar="PORT", help="Serve Prometheus metrics on 127.0.0.1:PORT (+n per process)."
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
    from harel_edge.access import check_writable  # noqa: PLC0415
    from harel_edge.supervisor import run_processes  # noqa: PLC0415
    from harel_edge.worker import WorkerOptions, load_definitions, parse_workflow  # noqa: PLC0415
    from harel_edge.worker_process import serve  # noqa: PLC0415

    g: Globals = ctx.obj
    settings = g.settings(
        deployment=True, metrics_port=metrics_port, max_in_flight=max_in_flight, max_workflow_passes=max_workflow_passes
    )
    if "worker_id" not in settings.model_fields_set:
        # The default, hostname-pid, is the same in every container of a scaled service (one
        # host name, pid 1): a suffix tells their log lines and leases apart.
        settings = settings.model_copy(update={"worker_id": f"{settings.worker_id}-{secrets.token_hex(2)}"})
    options = WorkerOptions(
        definitions_dir=definitions,
        workflows=tuple(parse_workflow(w) for w in workflow or ()),
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
    if not settings.is_deployment:
        # A foreign file, a refused or read-only token, an unreachable primary: fail now, clearly.
        # (A deployment's databases are each reported and retried on their own instead.)
        check_writable(settings, adopt=adopt)
    if processes == 1:
        report = serve(settings, options)
        if report.error:
            fail(EXIT_PROBLEM, report.error)
        return
    raise typer.Exit(
        run_processes(settings, options, processes, log_format=g.log_format, log_level=g.log_level)
    )


# ---- demo -----------------------------------------------------------------------------------------


@handled
def demo(
    db: str | None = typer.Option(
        None, "--db", metavar="FILE", help="Use (and keep) this database file instead of a temporary one."
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


# ---- dashboard ------------------------------------------------------------------------------------


@handled
def dashboard(
    ctx: typer.Context,
    port: int = typer.Option(8800, "--port", min=1, max=65535, metavar="PORT", help="The port to listen on, on 127.0.0.1."),
    write: bool = typer.Option(False, "--write", help="Allow requeueing dead letters from the page."),
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", metavar="NAME",
        help="Another host name the page may be reached by (a forwarded or proxied name); repeatable. "
        "127.0.0.1, localhost and ::1 always are; any other Host is refused.",
    )] = None,  # fmt: skip
) -> None:
    """Serve a web view of the deployment on 127.0.0.1 until Ctrl-C.

    Queue, keys, workers, executions, workflows and dead letters; read-only unless --write. On a
    deployment of many databases (HAREL_EDGE_DATABASES) without --database, the list of its
    databases, each one's pages under /db/NAME/."""
    settings = ctx.obj.settings(deployment=True)
    from harel_edge.dashboard import serve  # noqa: PLC0415
    from harel_edge.status import collect_status  # noqa: PLC0415

    mode = "write mode: dead letters can be requeued" if write else "read-only"
    if settings.is_deployment:  # each database is read when its page is, not all of them now
        mode += f"; {len(settings.databases)} databases, each under /db/NAME/"
    else:
        collect_status(settings, top=0)  # refuses, as `status` does, what it cannot read
    out.print(f"dashboard on http://127.0.0.1:{port}/ ({mode}); Ctrl-C stops it", markup=False)
    serve(settings, port=port, write=write, hosts=allow_host or ())
