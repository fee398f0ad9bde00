"""The one schema step (`prepare`) every caller goes through on its own executor: the worker, the
faces, the durable stores and `harel-edge migrate`. harel's tables come only through the
numbered versions (`migrations.py`)."""

from __future__ import annotations

import asyncio

from harel_edge import migrations, retry
from harel_edge.errors import SchemaError
from harel_edge.executor import Executor, Stmt
from harel_edge.inspection import TABLES_SQL, VERSION_SQL, check_usable, facts_of
from harel_edge.settings import EdgeSettings


async def prepare(
    executor: Executor, settings: EdgeSettings, *, migrate: bool = True, adopt: bool = False
) -> migrations.Outcome:
    """The one schema step: read the database's facts through `executor`, refuse one harel_edge
    must not use (newer, or another application's unless `adopt`), then apply each numbered
    version it lacks as one unit of work, or with `migrate=False` refuse it if it lacks any.
    Under the retry policy; idempotent, and safe when workers start at once."""
    where = settings.server or settings.db_path

    async def rows(sql: str) -> list[tuple]:
        return (await executor.execute(Stmt(sql))).rows

    async def attempt() -> migrations.Outcome:
        # Read at once, so one exchange with a remote primary: a deployment starts this per database.
        version, tables, state = await asyncio.gather(
            rows(VERSION_SQL), rows(TABLES_SQL), rows(migrations.state_sql(settings.prefix))
        )
        facts = facts_of(version, tables)
        check_usable(facts, settings.prefix, where, adopt=adopt)
        if migrate:
            return await migrations.upgrade_async(executor, settings.prefix, state=state)
        lacking = migrations.lacking(state)
        if lacking:
            raise SchemaError(
                f"the tables under prefix {settings.prefix!r} at {where} lack schema version(s) "
                f"{', '.join(map(str, lacking))}, and create_schema=False: run `harel-edge migrate` "
                "(or `harel-edge migrate --print-sql` for your migration tool)"
            )
        return migrations.Outcome(facts.user_version, facts.user_version)

    return await retry.acall_with_retry(settings, "migrate", attempt)
