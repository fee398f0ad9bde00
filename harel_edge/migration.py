"""Creating or upgrading the schema from outside a worker, or printing it for a migration tool.

What `harel-edge migrate` does, as functions: the schema is made by the workers' own schema step,
after `access.check_writable`, so a database a command migrates is the one a worker would make.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harel_edge import schema
from harel_edge.access import open_for_writing
from harel_edge.connection import EdgeConnection
from harel_edge.settings import EdgeSettings
from harel_edge.status import settings_summary
from harel_edge.store import store_tables

# The workers' schema step: refuse a foreign or newer database, create or upgrade every table,
# return the version found (`prepare(connection, migrate=True, adopt=...)`).
Prepare = Callable[..., int]


@dataclass(frozen=True)
class Migration:
    """The schema version a database had, the one it has now, and which database it was."""

    found: int
    version: int
    where: str  # as `settings_summary` says it

    @property
    def up_to_date(self) -> bool:
        return self.found == self.version


def migrate(settings: EdgeSettings, prepare: Prepare, *, adopt: bool = False) -> Migration:
    """Create or upgrade the schema with the workers' `prepare`; idempotent, safe while workers run."""
    connection: EdgeConnection = open_for_writing(settings, adopt=adopt)
    try:
        found = prepare(connection, migrate=True, adopt=adopt)
    finally:
        connection.close()
    return Migration(found, schema.SCHEMA_VERSION, settings_summary(settings))


def migration_script(prefix: str) -> str:
    """The whole schema as SQL for a team whose migration tool owns it (`migrate --print-sql`)."""
    lines = [
        f"-- harel_edge schema version {schema.SCHEMA_VERSION}, table prefix {prefix!r}.",
        "-- Run once on a NEW database, in this order. On a database made by harel 0.9 (its transport",
        "-- tables without routing_key), run this first, once:",
        f"--   {schema.routing_upgrade(prefix)};",
        "",
    ]
    lines += [f"{statement};" for statement in schema.migration_sql(prefix)]
    lines += ["", "-- harel's execution store (the worker's EdgeStore), as harel creates it:"]
    lines += [f"{statement};" for statement in store_tables(prefix)]
    return "\n".join(lines) + "\n"
