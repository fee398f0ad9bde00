"""`harel-edge databases create` and the commands' `--all`: a deployment's databases, each in turn."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from harel_edge.cli.app import EXIT_PROBLEM, command_group, fail, handled, out, shown

databases_app = command_group("A deployment's databases (HAREL_EDGE_DATABASES): make a tenant's database and its schema.")


def migrated(done: Any, prefix: str) -> str:
    """One line for a migration: what it found and what it applied."""
    if done.up_to_date:
        return f"schema version {done.found}: up to date ({shown(done.where)})"
    applied = ", ".join(str(number) for number in done.applied)
    return f"schema version {done.found} -> {done.version}, applied {applied} for prefix {prefix!r} ({shown(done.where)})"


def migrate_each(settings: Any, adopt: bool) -> None:
    """`migrate --all`: each database in turn (and the doorbell's), a failed one said and the others migrated; exit 1 if any failed."""
    from harel_edge import migration  # noqa: PLC0415
    from harel_edge.deployment import each_database  # noqa: PLC0415

    results = each_database(settings, lambda one: migration.migrate(one, adopt=adopt), doorbell=True)
    for each in results:
        said = migrated(each.value, settings.prefix) if each.error is None else f"FAILED: {shown(each.error)}"
        out.print(f"{each.database}: {said}", markup=False)
    failed = [each.database for each in results if each.error is not None]
    if failed:
        fail(EXIT_PROBLEM, f"{len(failed)} of {len(results)} databases not migrated: {', '.join(failed)}")


@handled
def databases_create(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(metavar="NAME", help="The databases to make (sqld namespaces, or files).")
    ] = None,
    every: bool = typer.Option(
        False, "--all", help="Make every database of HAREL_EDGE_DATABASES (and the doorbell's) instead of NAMEs."
    ),
    no_migrate: bool = typer.Option(False, "--no-migrate", help="Make the database only; do not create the schema."),
) -> None:
    """Make a tenant's database and its schema in one step.

    On sqld, a namespace through the admin API (HAREL_EDGE_ADMIN_URL); on the local profile, a
    file (HAREL_EDGE_DB_PATH with {database}). One already there is migrated. Add the names to
    HAREL_EDGE_DATABASES for workers to serve them."""
    settings = ctx.obj.settings(deployment=True)
    if every == bool(names):
        raise typer.BadParameter("give the NAMEs of the databases to make, or --all for those of HAREL_EDGE_DATABASES")
    if every:
        if not settings.databases:
            raise typer.BadParameter("--all makes the databases HAREL_EDGE_DATABASES names, and it is not set")
        names = [*settings.databases, *([settings.doorbell] if settings.doorbell not in (None, *settings.databases) else [])]
    from harel_edge import migration  # noqa: PLC0415
    from harel_edge.database_names import check_name  # noqa: PLC0415
    from harel_edge.deployment import create_database  # noqa: PLC0415

    for name in names:
        try:
            check_name("NAME", name)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    for name in names:
        made = create_database(settings, name)
        line = f"{name}: {'made' if made else 'already there'}"
        if not no_migrate:
            line += "; " + migrated(migration.migrate(settings.for_database(name)), settings.prefix)
        out.print(line, markup=False)
