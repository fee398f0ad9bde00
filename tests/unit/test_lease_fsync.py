"""On a local file, a commit that only leases skips its fsync; every other commit keeps it."""

from __future__ import annotations

import asyncio

import pytest
from harel.spec.states import Event

from harel_edge.connection import EdgeConnection
from harel_edge.executor import Stmt
from harel_edge.executor.local import LocalExecutor
from harel_edge.migration import migrate
from harel_edge.queue import EventTransport, LibsqlTransport
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EventStore

FULL, NORMAL = 2, 1  # what `PRAGMA synchronous` reads back
SYNC = Stmt("PRAGMA synchronous")


def local(tmp_path, durability="full"):
    return ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"), durability=durability)


class RecordingExecutor(LocalExecutor):
    """A real LocalExecutor that notes which statements were sent as volatile."""

    def __init__(self, settings):
        super().__init__(settings)
        self.sent: list[tuple[str, bool]] = []

    async def execute(self, stmt, *, volatile=False):
        self.sent.append((stmt.sql, volatile))
        return await super().execute(stmt, volatile=volatile)

    async def transaction(self, stmts):
        self.sent.extend((stmt.sql, False) for stmt in stmts)
        return await super().transaction(stmts)


def test_a_volatile_unit_commits_at_normal_and_the_next_unit_is_back_at_full(tmp_path):
    async def main():
        executor = LocalExecutor(local(tmp_path))
        try:
            first = await executor.execute(SYNC)
            leased = await executor.execute(SYNC, volatile=True)
            after = await executor.execute(SYNC)
        finally:
            await executor.aclose()
        return first.rows, leased.rows, after.rows

    assert asyncio.run(main()) == ([(FULL,)], [(NORMAL,)], [(FULL,)])


def test_one_durable_unit_makes_the_commit_it_shares_with_a_volatile_one_fsync(tmp_path):
    async def main():
        executor = LocalExecutor(local(tmp_path), linger=0.0)
        try:
            await executor.execute(Stmt("SELECT 1"))  # the connection is open: both below queue together
            before = executor.exchanges
            leased, durable = await asyncio.gather(executor.execute(SYNC, volatile=True), executor.execute(SYNC))
            return leased.rows, durable.rows, executor.exchanges - before
        finally:
            await executor.aclose()

    leased, durable, commits = asyncio.run(main())
    assert commits == 1, "the two units shared one commit"
    assert leased == durable == [(FULL,)]


def test_a_file_at_normal_durability_stays_at_normal(tmp_path):
    async def main():
        executor = LocalExecutor(local(tmp_path, durability="normal"))
        try:
            return [(await executor.execute(SYNC, volatile=v)).rows for v in (True, False)]
        finally:
            await executor.aclose()

    assert asyncio.run(main()) == [[(NORMAL,)], [(NORMAL,)]]


def test_skip_fsync_inside_an_open_transaction_changes_nothing(tmp_path):
    connection = EdgeConnection(local(tmp_path))
    try:
        connection.execute("BEGIN IMMEDIATE")
        with connection.skip_fsync():
            inside = connection.execute("PRAGMA synchronous")
        connection.execute("COMMIT")
        with connection.skip_fsync():
            outside = connection.execute("PRAGMA synchronous")
        assert (inside, outside, connection.execute("PRAGMA synchronous")) == ([(FULL,)], [(NORMAL,)], [(FULL,)])
    finally:
        connection.close()


def test_skip_fsync_restores_full_durability_when_the_statement_fails(tmp_path):
    connection = EdgeConnection(local(tmp_path))
    try:
        with pytest.raises(ValueError, match="no such table"), connection.skip_fsync():
            connection.execute("SELECT * FROM no_such_table")
        assert connection.execute("PRAGMA synchronous") == [(FULL,)]
    finally:
        connection.close()


def test_the_event_path_sends_only_its_claims_as_volatile(tmp_path):
    settings = local(tmp_path)
    migrate(settings)
    LibsqlTransport(settings=settings).publish("g", Event(kind="go"))

    async def main():
        executor = RecordingExecutor(settings)
        transport = EventTransport(executor, settings)
        store = EventStore(executor, settings, events=transport)
        try:
            lease = await transport.claim("w", 30)
            await transport.nack(lease)
            lease = await transport.claim("w", 30)
            await store.load(lease.group_id)
            await transport.ack(lease)
        finally:
            await executor.aclose()
        return executor.sent

    sent = asyncio.run(main())
    claims = [volatile for sql, volatile in sent if "claimed_at = " in sql]
    others = [volatile for sql, volatile in sent if "claimed_at = " not in sql]
    assert claims == [True, True]
    assert others and not any(others)


def test_a_commit_left_open_inside_skip_fsync_is_rolled_back_and_full_durability_restored(tmp_path):
    connection = EdgeConnection(local(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="the commit failed"), connection.skip_fsync():
            connection.execute("BEGIN IMMEDIATE")
            raise RuntimeError("the commit failed and could not roll back")
        assert not connection.in_transaction
        assert connection.execute("PRAGMA synchronous") == [(FULL,)]
    finally:
        connection.close()


def test_a_database_not_in_wal_mode_never_skips_its_fsync(tmp_path):
    connection = EdgeConnection(ExplicitSettings.load(profile="local", db_path=":memory:"))
    try:
        assert connection.execute("PRAGMA journal_mode") != [("wal",)]
        with connection.skip_fsync():
            assert connection.execute("PRAGMA synchronous") == [(FULL,)]
    finally:
        connection.close()


def test_ack_many_answers_a_stale_lease_and_a_repeated_one_false(tmp_path):
    settings = local(tmp_path)
    migrate(settings)
    publisher = LibsqlTransport(settings=settings)
    publisher.publish("a", Event(kind="one"))
    publisher.publish("b", Event(kind="two"))

    async def main():
        executor = LocalExecutor(settings)
        transport = EventTransport(executor, settings)
        try:
            a, b = await transport.claim_many("w", 30, 2)
            stale = type(a)(a.seq, a.group_id, a.event, token="w#not-this-claim")
            return await transport.ack_many([a, stale, b, b])
        finally:
            await executor.aclose()

    assert asyncio.run(main()) == [True, False, True, False]


def test_ack_many_of_more_leases_than_one_statement_holds_acks_every_one(tmp_path, monkeypatch):
    monkeypatch.setattr("harel_edge.queue.statements.ACK_ROWS", 3)
    settings = local(tmp_path)
    migrate(settings)
    LibsqlTransport(settings=settings).publish_many([(f"g{i}", Event(kind="go")) for i in range(7)])

    async def main():
        executor = LocalExecutor(settings)
        transport = EventTransport(executor, settings)
        try:
            leases = await transport.claim_many("w", 30, 7)
            acked = await transport.ack_many(leases)
            return len(leases), acked, await transport.depth()
        finally:
            await executor.aclose()

    assert asyncio.run(main()) == (7, [True] * 7, 0)
