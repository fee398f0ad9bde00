"""Units of work reuse the primary's Hrana streams (a request on an open stream costs sqld a
fraction of one that opens a stream), and a reused stream never changes what a unit does."""

from __future__ import annotations

import asyncio

import pytest

from harel_edge.executor import Stmt
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import ExplicitSettings

pytestmark = pytest.mark.sqld


def settings_for(server):
    return ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, retry_deadline=20.0)


def count(server) -> int:
    async def main():
        executor = HranaExecutor(settings_for(server))
        try:
            return (await executor.execute(Stmt("SELECT count(*) FROM t"))).rows[0][0]
        finally:
            await executor.aclose()

    return asyncio.run(main())


def test_units_one_after_another_go_on_one_stream_and_each_is_applied(fresh_sqld_primary):
    async def main():
        executor = HranaExecutor(settings_for(fresh_sqld_primary))
        try:
            await executor.execute(Stmt("CREATE TABLE t (x)"))
            batons = set()
            for i in range(5):
                await executor.transaction([Stmt("INSERT INTO t VALUES (?)", (i,))])
                [stream] = executor._idle
                batons.add(stream.baton)
            assert len(batons) == 5, "each answer hands on a new baton of the same stream"
            return executor.exchanges
        finally:
            await executor.aclose()

    assert asyncio.run(main()) == 6
    assert count(fresh_sqld_primary) == 5


def test_a_stream_the_restarted_primary_forgot_is_replaced_and_the_unit_runs_once(fresh_sqld_primary):
    async def main():
        executor = HranaExecutor(settings_for(fresh_sqld_primary))
        try:
            await executor.execute(Stmt("CREATE TABLE t (x)"))
            await executor.execute(Stmt("INSERT INTO t VALUES (1)"))
            assert len(executor._idle) == 1
            fresh_sqld_primary.kill()
            fresh_sqld_primary.restart()  # same data; the stream is gone with the old process
            before = executor.exchanges
            await executor.execute(Stmt("INSERT INTO t VALUES (2)"))
            assert executor.exchanges == before + 2, "refused on the old stream, then sent on a new one"
        finally:
            await executor.aclose()

    asyncio.run(main())
    assert count(fresh_sqld_primary) == 2, "the unit the old stream refused ran once"


def test_a_unit_that_leaves_a_transaction_open_does_not_hand_its_stream_to_the_next_unit(fresh_sqld_primary):
    async def main():
        executor = HranaExecutor(settings_for(fresh_sqld_primary))
        try:
            await executor.execute(Stmt("CREATE TABLE t (x)"))
            await executor.execute(Stmt("BEGIN"))  # a caller's own statement, left open
            assert executor._idle == [], "a stream inside a transaction is closed, not kept"
            await executor.execute(Stmt("INSERT INTO t VALUES (1)"))
        finally:
            await executor.aclose()

    asyncio.run(main())
    assert count(fresh_sqld_primary) == 1, "the insert committed on its own, outside the open BEGIN"
