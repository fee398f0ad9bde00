"""Creating or upgrading the schema from outside a worker, or printing it for a migration tool:
the workers' own schema step, after `access.check_writable`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge import retry, schema
from harel_edge.access import open_for_writing
from harel_edge.connection import EdgeConnection
from harel_edge.inspection import check_usable, database_facts
from harel_edge.settings import EdgeSettings
from harel_edge.status import settings_summary
from harel_edge.store import store_tables


@dataclass(frozen=True)
class Migration:
    """The schema version a database had, the one it has now, and which database it was."""

    found: int
    version: int
    where: str  # as `settings_summary` says it

    @property
    def up_to_date(self) -> bool:
        return self.found == self.version


def migrate(settings: EdgeSettings, *, adopt: bool = False) -> Migration:
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


def prepare(connection: EdgeConnection, *, migrate: bool, adopt: bool = False) -> int:
    """Refuse a foreign or newer database, then create or upgrade every table the worker uses.

    Returns the version found; under the retry policy, idempotent and safe when workers start at once.
    """
    settings = connection.settings
    where = settings.server or settings.db_path

    def work() -> int:
        facts = database_facts(connection.execute)
        check_usable(facts, settings.prefix, where, adopt=adopt)
        if not migrate:
            return facts.user_version
        found = schema.migrate(connection.execute, settings.prefix)
        for statement in store_tables(settings.prefix):
            connection.execute(statement)
        return found

    return retry.call_with_retry(settings, "migrate", work, recover=connection.recover)


def prepare_database(settings: EdgeSettings, *, adopt: bool = False) -> int:
    """`prepare` on a connection opened for the purpose: create or upgrade every table."""
    connection = EdgeConnection(settings)
    try:
        return prepare(connection, migrate=True, adopt=adopt)
    finally:
        connection.close()
