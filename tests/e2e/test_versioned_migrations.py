"""Versioned migrations on a real sqld primary: each version is ONE Hrana request, applied once
however many workers start at once, through the sqld and the replica profiles alike.

Why: edge workers start together after a deployment, each against the primary over the network,
and a harel user's queue made by harel 0.9 itself is the common first database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from harel.engine.transport import LibsqlTransport as Harel09LibsqlTransport
from harel.spec.states import Event

from harel_edge import migrations
from harel_edge.errors import SchemaTooNewError
from harel_edge.executor import Stmt, open_executor
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import EdgeSettings, ExplicitSettings
from harel_edge.testing import SqldServer, spawned
from harel_edge.testing.spawned import answers

pytestmark = [pytest.mark.sqld, pytest.mark.timeout(180)]

LATEST = migrations.SCHEMA_VERSION
EVERY = tuple(v.number for v in migrations.VERSIONS)


def sqld_settings(primary: SqldServer, **overrides: Any) -> EdgeSettings:
    return ExplicitSettings.load(profile="sqld", url=primary.http_url, auth_token=primary.rw_token, **overrides)


def on(primary: SqldServer, work: Any, **overrides: Any) -> Any:
    """`await work(executor)` with a Hrana executor for the primary."""

    async def run() -> Any:
        executor = HranaExecutor(sqld_settings(primary, **overrides))
        try:
            return await work(executor)
        finally:
            await executor.aclose()

    return asyncio.run(run())


def rows(primary: SqldServer, sql: str) -> list[tuple]:
    async def read(executor: HranaExecutor) -> list[tuple]:
        return (await executor.execute(Stmt(sql))).rows

    return on(primary, read)


def test_on_a_remote_primary_each_version_is_one_request(fresh_sqld_primary: SqldServer) -> None:
    async def work(executor: HranaExecutor) -> tuple[migrations.Outcome, int]:
        done = await migrations.upgrade_async(executor)
        return done, executor.exchanges

    done, exchanges = on(fresh_sqld_primary, work)
    assert done == migrations.Outcome(0, LATEST, EVERY)
    assert exchanges == len(EVERY) + 1 + len(EVERY), "a read of the state before and after each version, and one request a version"
    assert rows(fresh_sqld_primary, "SELECT user_version FROM pragma_user_version") == [(LATEST,)]


def test_a_second_prefix_on_the_primary_gets_its_tables_and_the_first_is_left_alone(
    fresh_sqld_primary: SqldServer,
) -> None:
    first = on(fresh_sqld_primary, lambda e: migrations.upgrade_async(e, "alpha"))
    listing = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
    before = rows(fresh_sqld_primary, listing)
    second = on(fresh_sqld_primary, lambda e: migrations.upgrade_async(e, "beta"))
    after = rows(fresh_sqld_primary, listing)
    assert (first.applied, second) == (EVERY, migrations.Outcome(LATEST, LATEST, EVERY))
    assert [row for row in after if "beta_" not in row[1]] == before


def test_a_primary_from_a_newer_harel_edge_is_refused_and_left_as_it_was(fresh_sqld_primary: SqldServer) -> None:
    on(fresh_sqld_primary, migrations.upgrade_async)
    rows(fresh_sqld_primary, f"PRAGMA user_version = {LATEST + 1}")
    listing = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
    before = rows(fresh_sqld_primary, listing)
    with pytest.raises(SchemaTooNewError, match="upgrade harel_edge here"):
        on(fresh_sqld_primary, lambda e: migrations.upgrade_async(e, "other"))
    assert rows(fresh_sqld_primary, listing) == before
    assert rows(fresh_sqld_primary, "SELECT user_version FROM pragma_user_version") == [(LATEST + 1,)]


class Lockstep:
    """An executor that waits after each read of the schema state until every peer has read it,
    so all of them plan each version from the same state and race to apply it."""

    def __init__(self, executor: Any, gate: Any) -> None:
        self._executor, self._gate = executor, gate
        self.refused = 0

    async def execute(self, stmt: Stmt) -> Any:
        result = await self._executor.execute(stmt)
        await asyncio.to_thread(self._gate.wait, 60)
        return result

    async def transaction(self, stmts: list[Stmt]) -> Any:
        try:
            return await self._executor.transaction(stmts)
        except Exception:
            self.refused += 1
            raise


def _start(config: dict[str, Any], barrier: Any, gate: Any, results: Any) -> None:
    """One worker's start: the profile's executor (Hrana to the primary, on a replica too)."""

    async def start() -> tuple[tuple[int, ...], int]:
        executor = open_executor(ExplicitSettings.load(**config))
        lockstep = Lockstep(executor, gate)
        try:
            return (await migrations.upgrade_async(lockstep)).applied, lockstep.refused
        finally:
            await executor.aclose()

    try:
        barrier.wait(timeout=60)
        results.put(asyncio.run(start()))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_workers_starting_on_a_harel_09_queue_at_once_apply_each_version_once_and_keep_its_messages(
    fresh_sqld_primary: SqldServer, tmp_path: Path
) -> None:
    primary = fresh_sqld_primary
    # harel 0.9's transport against sqld with auth works as an embedded replica (see test_routing_migration).
    old = Harel09LibsqlTransport(str(tmp_path / "harel09.db"), sync_url=primary.http_url, auth_token=primary.rw_token)
    for index in range(3):
        for group in ("G", "H"):
            old.publish(group, Event(kind=f"{group}{index}"))
    old.close()
    messages = rows(primary, "SELECT seq, group_id, event FROM harel_transport_messages ORDER BY seq")
    configs = [
        {"profile": "sqld", "url": primary.http_url, "auth_token": primary.rw_token},
        {
            "profile": "replica",
            "db_path": str(tmp_path / "edge.db"),
            "sync_url": primary.http_url,
            "auth_token": primary.rw_token,
        },
    ]
    ctx = spawned.context()
    barrier, gate, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    outcomes = answers(ctx, _start, [(config, barrier, gate, results) for config in configs], results, timeout=120)
    assert all(isinstance(outcome, tuple) for outcome in outcomes), outcomes
    applied = sorted(outcomes[0][0] + outcomes[1][0])
    assert applied == list(EVERY), f"each version applied once between them: {outcomes}"
    assert outcomes[0][1] + outcomes[1][1] == len(EVERY), "the loser of each race was refused inside its transaction"
    columns = [row[1] for row in rows(primary, "SELECT cid, name FROM pragma_table_info('harel_transport_groups')")]
    assert columns == [
        "group_id", "last_claimed_at", "priority", "routing_key", "claimable_at",
        "limit_key", "held_key", "leased_until", "delayed",
    ]
    assert rows(primary, "SELECT user_version FROM pragma_user_version") == [(LATEST,)]
    assert rows(primary, "SELECT seq, group_id, event FROM harel_transport_messages ORDER BY seq") == messages
