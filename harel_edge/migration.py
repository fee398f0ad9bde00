"""Creating or upgrading the schema from outside a worker, or printing it for a migration tool:
the workers' own schema step, after `access.check_writable`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harel_edge import migrations, retry
from harel_edge.access import open_for_writing
from harel_edge.executor import open_executor
from harel_edge.inspection import check_usable, database_facts
from harel_edge.settings import EdgeSettings
from harel_edge.status import settings_summary
from harel_edge.sync_sql import Statements


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
    """Create or upgrade the schema with the workers' `prepare`; idempotent, safe while workers run."""
    connection = open_for_writing(settings, adopt=adopt)
    try:
        done = _prepare(connection, migrate=True, adopt=adopt)
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


def prepare(connection: Any, *, migrate: bool, adopt: bool = False) -> int:
    """Refuse a foreign or newer database, then create or upgrade every table the worker uses.

    Returns the version found; under the retry policy, idempotent and safe when workers start at once.
    """
    return _prepare(connection, migrate=migrate, adopt=adopt).found


def _prepare(connection: Any, *, migrate: bool, adopt: bool) -> migrations.Outcome:
    settings: EdgeSettings = connection.settings
    where = settings.server or settings.db_path

    def work() -> migrations.Outcome:
        facts = database_facts(connection.execute)
        check_usable(facts, settings.prefix, where, adopt=adopt)
        if not migrate:
            return migrations.Outcome(facts.user_version, facts.user_version)
        return upgrade(connection)

    return retry.call_with_retry(settings, "migrate", work, recover=getattr(connection, "recover", None))


def upgrade(connection: Any) -> migrations.Outcome:
    """The versions the database or the prefix lacks, each one transaction: through the
    connection's own `transaction` (a `Statements` face, one unit of its executor), on a local
    file's one connection, or else on the primary (an EdgeConnection or Hrana stream elsewhere)."""
    settings: EdgeSettings = connection.settings
    if hasattr(connection, "transaction"):
        units = connection.transaction
        return migrations.upgrade(connection.execute, settings.prefix, atomic=lambda s: units([(x, ()) for x in s]))
    if settings.profile == "local":
        return migrations.upgrade(connection.execute, settings.prefix)
    done = on_primary(settings)
    if done.applied:
        connection.sync()  # a replica's file sees the new tables before anything reads them
    return done


def on_primary(settings: EdgeSettings) -> migrations.Outcome:
    """`migrations.upgrade_async` on the primary of a sqld or replica profile, each version one
    Hrana request, from a loop of its own (sync callers may be on a thread of a running loop)."""

    async def work() -> migrations.Outcome:
        executor = open_executor(settings)
        try:
            return await migrations.upgrade_async(executor, settings.prefix)
        finally:
            await executor.aclose()

    with ThreadPoolExecutor(1, thread_name_prefix="harel-edge-migrate") as thread:
        return thread.submit(asyncio.run, work()).result()


def prepare_database(settings: EdgeSettings, *, adopt: bool = False) -> int:
    """`prepare` on the profile's executor, opened for the purpose: create or upgrade every table."""
    connection = Statements(settings)
    try:
        return prepare(connection, migrate=True, adopt=adopt)
    finally:
        connection.close()
