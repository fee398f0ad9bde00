"""What only a remote primary raises for the durable stores: the primary's clock deciding when a
claim lapses, and the guarantees holding on the primary whatever a replica has seen."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import behaviours
import pytest

from harel_edge.connection import connect as open_connection
from harel_edge.durable import FencedError, connect, migrate
from harel_edge.durable.runtime import Context, DurableWorker, Finished, Sleeping, run_durably
from harel_edge.errors import SchemaTooNewError
from harel_edge.settings import EdgeSettings
from harel_edge.testing import SqldServer, SqldStartError, SqldUnavailable, start_sqld_primary
from harel_edge.testing.fixtures import sqld_unavailable

pytestmark = pytest.mark.sqld





def start_primary() -> SqldServer:
    """A sqld primary with authentication on, on loopback."""
    try:
        return start_sqld_primary()
    except (SqldUnavailable, SqldStartError, ImportError) as exc:
        sqld_unavailable(str(exc))


@pytest.fixture(scope="module")
def primary() -> Iterator[SqldServer]:
    server = start_primary()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqld", "replica"])
def remote(request, primary: SqldServer, tmp_path) -> EdgeSettings:  # noqa: ANN001
    """Settings for one remote profile against the module's primary (read-write token)."""
    if request.param == "sqld":
        return EdgeSettings(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    return EdgeSettings(
        profile="replica",
        sync_url=primary.http_url,
        auth_token=primary.rw_token,
        db_path=str(tmp_path / "r.db"),
    )


def replica(primary: SqldServer, path: Path) -> EdgeSettings:
    return EdgeSettings(
        profile="replica", sync_url=primary.http_url, auth_token=primary.rw_token, db_path=str(path)
    )


def test_fencing_holds_on_the_primary_whatever_a_stale_replica_has_seen(
    primary: SqldServer, tmp_path
) -> None:  # noqa: ANN001
    async def scenario() -> None:
        one = await behaviours.open_stores(replica(primary, tmp_path / "one.db"))
        two = await behaviours.open_stores(replica(primary, tmp_path / "two.db"))
        two.checkpointer.now = one.clock  # one clock for both, moved by hand
        workflow = one.workflow()
        old = await one.checkpointer.claim(workflow, behaviours.BUDGET, behaviours.ALIVE)
        # An embedded replica of the same database, synced now (it sees the old claim)...
        stale = await asyncio.to_thread(open_connection, replica(primary, tmp_path / "stale.db"))
        one.clock.advance(seconds=31)
        new = await two.checkpointer.claim(workflow, behaviours.BUDGET, behaviours.ALIVE)
        assert new is not None and new.token == old.token + 1
        # ...has not synced the takeover: its local file still shows the old claim...
        local = stale.execute("SELECT token FROM workflow_claim WHERE workflow = ?", (workflow,))
        stale.close()
        assert local == [(old.token,)]
        # ...but the stores' writes are decided on the primary.
        with pytest.raises(FencedError):
            await one.checkpointer.record(old, "step", "old")
        with pytest.raises(FencedError):
            await one.checkpointer.transact(old, "effect", behaviours.insert_effect(workflow, "effect"))
        assert (await two.checkpointer.record(new, "step", "new")).fresh
        assert await one.effects(workflow) == []
        for stores in (one, two):
            await stores.database.aclose()

    asyncio.run(scenario())


def test_a_step_recorded_through_one_replica_is_not_performed_again_through_another(
    primary: SqldServer,
    tmp_path,  # noqa: ANN001
) -> None:
    async def scenario() -> None:
        one = await behaviours.open_stores(replica(primary, tmp_path / "one.db"))
        two = await behaviours.open_stores(replica(primary, tmp_path / "two.db"))
        two.checkpointer.now = one.clock
        workflow = one.workflow()
        first = await one.checkpointer.claim(workflow, behaviours.BUDGET, behaviours.ALIVE)
        row = await one.checkpointer.transact(first, "charge", behaviours.insert_effect(workflow, "charge"))
        await one.checkpointer.release(first)
        second = await two.checkpointer.claim(workflow, behaviours.BUDGET, behaviours.ALIVE)
        calls = []

        def effect(tx):  # noqa: ANN001
            calls.append(1)
            return behaviours.insert_effect(workflow, "charge")(tx)

        assert await two.checkpointer.transact(second, "charge", effect) == row
        assert calls == [] and await two.effects(workflow) == [("charge",)]
        for stores in (one, two):
            await stores.database.aclose()

    asyncio.run(scenario())


def test_a_workflow_sleeps_and_is_finished_by_a_worker_on_the_primarys_clock(remote: EdgeSettings) -> None:
    async def scenario() -> None:
        stores = await behaviours.open_stores(remote)
        # The database's clock everywhere, as in production.
        stores.checkpointer.now = None
        stores.scheduler.now = None
        workflow = stores.workflow()

        async def flow(ctx: Context) -> str:
            await ctx.step("before", lambda: "x")
            await ctx.sleep_until(ctx.now() + timedelta(seconds=0.2))
            return "after"

        assert isinstance(await run_durably(stores.durable, workflow, flow), Sleeping)
        worker = DurableWorker(stores.durable, flow)
        assert await worker.run_once(timedelta(seconds=30)) == Finished("after")
        await stores.database.aclose()

    asyncio.run(scenario())


def test_a_remote_database_from_a_newer_harel_edge_is_refused() -> None:
    server = start_primary()
    try:
        settings = EdgeSettings(profile="sqld", url=server.http_url, auth_token=server.rw_token)

        async def scenario() -> None:
            database = connect(settings)
            await database.run(lambda c: c.execute("PRAGMA user_version = 99"))
            with pytest.raises(SchemaTooNewError):
                await migrate(database)
            tables = await database.run(lambda c: c.execute("SELECT count(*) FROM sqlite_master"))
            assert tables == [(0,)]
            await database.aclose()

        asyncio.run(scenario())
    finally:
        server.close()
