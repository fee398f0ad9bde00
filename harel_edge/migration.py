"""`harel-edge migrate`: the one schema step from outside a worker, after `access.check_writable`,
or the schema printed for a migration tool."""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge import migrations
from harel_edge.access import open_for_writing
from harel_edge.schema_step import prepare
from harel_edge.settings import EdgeSettings
from harel_edge.status import settings_summary


@dataclass(frozen=True)
class Migration:
    """The schema version a database had, the one it has now, which database it was, and the
    versions applied (for its prefix: a new prefix in a database at 6 gets 4, 5 and 6)."""

    found: int
    version: int
    where: str  # as `settings_summary` says it
    applied: tuple[int, ...] = ()

    @property
    def up_to_date(self) -> bool:
        return not self.applied


def migrate(settings: EdgeSettings, *, adopt: bool = False) -> Migration:
    """Create or upgrade the schema with the one schema step, after `check_writable`; idempotent,
    safe while workers run."""
    connection = open_for_writing(settings, adopt=adopt)
    try:
        done = connection.run(lambda executor: prepare(executor, settings, adopt=adopt))
    finally:
        connection.close()
    return Migration(done.found, done.version, settings_summary(settings), done.applied)


def migration_script(prefix: str) -> str:
    """Every version as SQL, one transaction each, for a team whose migration tool owns the
    schema (`migrate --print-sql`): the same list the workers apply."""
    lines = [
        f"-- harel_edge schema version {migrations.SCHEMA_VERSION}, table prefix {prefix!r}.",
        "-- PRAGMA user_version is the database's version: apply, in order, the versions above it",
        "-- (each refuses to run, with an integer overflow, unless the one before it is there). On a",
        "-- harel 0.9 database (version 0, its tables already there) version 4 creates only what is",
        "-- missing. For a second prefix in a database already migrated, run `harel-edge migrate`.",
    ]
    statements = migrations.migration_sql(prefix)
    number = iter(migrations.VERSIONS)
    for statement in statements:
        if statement == "BEGIN IMMEDIATE":
            version = next(number)
            lines += ["", f"-- version {version.number}: {version.summary}"]
        lines.append(f"{statement};")
    return "\n".join(lines) + "\n"
