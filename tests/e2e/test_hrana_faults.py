"""Bad answers from the primary, on every face, on a real sqld.

`FaultyRelay` (a real HTTP server on loopback) stands between the client and sqld: it forwards
each request, or fails it as armed: before sqld sees it, or after sqld applied it and before
the answer comes back, which is the ambiguous case. The same tests run on the async core (the
worker's `EventTransport` and `EventStore` on one event path) and on the sync faces
(`LibsqlTransport`, `EdgeStore`), on the sqld and replica profiles (both send their writes to the
primary over Hrana), and the CLI's `publish` goes through the same relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _fault_relay import AMBIGUOUS, FaultyRelay
from harel.engine.execution import Execution
from harel.spec.states import Event
from prometheus_client import REGISTRY

from harel_edge.durable import LibsqlCheckpointer, LibsqlScheduler, SqlEffect, connect, migrate
from harel_edge.errors import AuthError
from harel_edge.executor import Stmt, remote
from harel_edge.executor.hrana import UNIT_SAVEPOINT
from harel_edge.executor.remote import HranaExecutor
from harel_edge.migration import migrate as migrate_schema
from harel_edge.queue import AsyncLibsqlTransport, EventTransport, LibsqlTransport
from harel_edge.retry import Backoff
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore, EventStore

pytestmark = pytest.mark.sqld

FACES = ["core", "sync"]
PROFILES = ["sqld", "replica"]
_prefixes = itertools.count()
# For the single-lease operations: a status, a garbled body and a cut one. A connection dropped
# before any answer ("closed after") is tried on the commit, claim_many and publish.
LOST = ["500 after", "garbage after", "truncated after"]


@pytest.fixture
def relay(sqld_primary):
    with FaultyRelay(sqld_primary.http_url) as relay:
        yield relay


def _settings(server, url: str | None = None, *, profile: str = "sqld", tmp_path: Path | None = None, **overrides):
    """Settings that reach `server` (through `url`, a relay, when given), with a prefix of their own."""
    values: dict[str, Any] = {
        "auth_token": server.rw_token,
        "prefix": f"f{next(_prefixes)}_{uuid.uuid4().hex[:6]}",
        "retry_initial_delay": 0.01,
        "retry_deadline": 20.0,
    }
    if profile == "sqld":
        values.update(profile="sqld", url=url or server.http_url)
    else:
        values.update(profile="replica", sync_url=url or server.http_url, db_path=str(tmp_path / f"{values['prefix']}.db"))
    values.update(overrides)
    return ExplicitSettings.load(**values)


def _direct(server, settings):
    """The same database and prefix, straight to sqld (no relay): to read what really landed."""
    return ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=settings.prefix)


class Blocking:
    """An async object's coroutine methods as plain calls, run on `loop` in this thread, so one
    test body drives the async core and the sync faces alike."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target, self._loop = target, loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):
            return lambda *args, **kwargs: self._loop.run_until_complete(value(*args, **kwargs))
        return value


@contextlib.contextmanager
def opened(face: str, settings):
    """(transport, store) of `face` on `settings`, each call blocking until it is answered."""
    if face == "sync":
        with LibsqlTransport(settings=settings) as transport, EdgeStore(settings) as store:
            yield transport, store
        return
    loop = asyncio.new_event_loop()
    try:
        core = loop.run_until_complete(AsyncLibsqlTransport.from_settings(settings))
        try:
            yield Blocking(core, loop), Blocking(EventStore(core.path.executor, settings, events=core), loop)
        finally:
            loop.run_until_complete(core.close())
    finally:
        loop.close()


@pytest.fixture(params=[(face, profile) for face in FACES for profile in PROFILES], ids=lambda p: f"{p[0]}-{p[1]}")
def faced(request, sqld_primary, relay, tmp_path):
    """The relay, and a transport and store of one face on one profile that reach sqld through it."""
    face, profile = request.param
    settings = _settings(sqld_primary, relay.url, profile=profile, tmp_path=tmp_path)
    with opened(face, settings) as (transport, store):
        yield relay, transport, store


def _fired(relay, fault):
    """The fault armed was applied, once (a test whose fault never fired would prove nothing)."""
    assert relay.fired == [fault] and relay.armed == [], "the fault was applied, once"
    relay.fired.clear()


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_commit_whose_answer_was_lost_is_looked_up_and_never_applied_twice(faced, fault):
    relay, transport, store = faced
    store.save(Execution(id="x", definition_id="d"))
    transport.publish("x", Event(kind="go"))
    lease = transport.claim("w", 30)
    loaded, _ = store.load_for_event("x", lease.event.id)
    relay.arm(fault)
    sent_before = relay.transactions
    seqs = store.commit(loaded, [(None, Event(kind="out"))], processed_event_id=lease.event.id)
    _fired(relay, fault)
    assert relay.transactions == sent_before + 1, "the commit went once, then was looked up, not resent"
    assert loaded.version == 2 and len(seqs) == 1 and seqs[0] > 0
    assert transport.ack(lease) is True
    assert transport.depth() == 0
    assert [e.event.kind for e in store.pending_outbox()] == ["out"], "one outbox entry, not two"
    assert store.load("x").version == 2
    assert store.is_processed("x", lease.event.id)


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_claim_many_whose_answer_was_lost_returns_the_leases_it_took(faced, fault):
    relay, transport, _store = faced
    transport.publish("a", Event(kind="a1"))
    transport.publish("b", Event(kind="b1"))
    relay.arm(fault)
    leases = transport.claim_many("w", 30, 2)
    _fired(relay, fault)
    assert sorted(lease.event.kind for lease in leases) == ["a1", "b1"]
    assert [transport.deliveries(lease) for lease in leases] == [1, 1], "each leased once"
    assert transport.claim_many("w", 30, 2) == [], "nothing was leased twice"
    assert transport.ack_many(leases) == [True, True]
    assert transport.depth() == 0


@pytest.mark.parametrize("fault", LOST)
def test_a_claim_whose_answer_was_lost_returns_the_lease_it_took(faced, fault):
    relay, transport, _store = faced
    transport.publish("a", Event(kind="a1"))
    relay.arm(fault)
    lease = transport.claim("w", 30)
    _fired(relay, fault)
    assert lease is not None and lease.event.kind == "a1" and transport.deliveries(lease) == 1
    assert transport.claim("w", 30) is None, "the group is leased once, to this claim"
    assert transport.ack(lease) is True


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_publish_whose_answer_was_lost_is_queued_once(faced, fault):
    relay, transport, _store = faced
    relay.arm(fault)
    transport.publish("a", Event(kind="a1"))
    _fired(relay, fault)
    assert transport.depth() == 1
    relay.arm(fault)
    assert transport.publish_many([("b", Event(kind="b1")), ("b", Event(kind="b2")), ("c", Event(kind="c1"))]) == 3
    _fired(relay, fault)
    assert transport.depth() == 4, "the batch is queued once"
    kinds = sorted(lease.event.kind for lease in transport.claim_many("w", 30, 10))
    assert kinds == ["a1", "b1", "c1"], "the heads of three groups, each message once"


@pytest.mark.parametrize("fault", LOST)
def test_an_ack_whose_answer_was_lost_reports_true_once(faced, fault):
    relay, transport, _store = faced
    transport.publish("a", Event(kind="a1"))
    transport.publish("a", Event(kind="a2"))
    lease = transport.claim("w", 30)
    relay.arm(fault)
    assert transport.ack(lease) is True, "the ack landed, and says so"
    _fired(relay, fault)
    assert transport.ack(lease) is False, "a second ack of the same lease removes nothing"
    assert transport.depth() == 1
    following = transport.claim("w", 30)
    assert following.event.kind == "a2", "the group moved on by one message"
    relay.arm(fault)
    assert transport.ack_many([following]) == [True]
    assert transport.depth() == 0


@pytest.mark.parametrize("fault", LOST)
def test_a_nack_whose_answer_was_lost_gives_the_message_back_once(faced, fault):
    relay, transport, _store = faced
    transport.publish("a", Event(kind="a1"))
    lease = transport.claim("w", 30)
    relay.arm(fault)
    assert transport.nack(lease) is True
    _fired(relay, fault)
    again = transport.claim("w", 30)
    assert again is not None and again.seq == lease.seq, "claimable again at once"
    assert transport.deliveries(again) == 1, "the clean give-back was not counted (nor taken back twice)"
    assert transport.nack(lease) is False, "the old lease no longer holds it"
    assert transport.ack(again) is True and transport.depth() == 0


@pytest.mark.parametrize("fault", ["500 before", "stream expired"])
def test_a_request_the_primary_failed_before_applying_is_retried_and_applied_once(faced, fault):
    relay, transport, store = faced
    exe = Execution(id="x", definition_id="d")
    relay.arm(fault)
    store.save(exe)
    _fired(relay, fault)
    assert exe.version == 1 and store.load("x").version == 1
    relay.arm(fault)
    transport.publish("x", Event(kind="go"))
    assert transport.depth() == 1


def test_a_commit_the_primary_refused_for_its_write_lock_is_retried_not_taken_for_a_conflict(faced):
    relay, transport, store = faced
    store.save(Execution(id="x", definition_id="d"))
    transport.publish("x", Event(kind="go"))
    lease = transport.claim("w", 30)
    loaded, _ = store.load_for_event("x", lease.event.id)
    relay.arm("write lock held", when="UPDATE")  # as a checkpointing primary refuses a writer
    store.commit(loaded, [], processed_event_id=lease.event.id)
    _fired(relay, "write lock held")
    assert loaded.version == 2 and store.load("x").version == 2
    assert store.is_processed("x", lease.event.id)


# ---- the CLI, through the same relay ----------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("fault", ["500 after", "truncated after"])
def test_the_cli_publish_whose_answer_was_lost_exits_0_and_queues_once(sqld_primary, relay, tmp_path, fault, profile):
    settings = _settings(sqld_primary, relay.url, profile=profile, tmp_path=tmp_path)
    migrate_schema(_direct(sqld_primary, settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAREL_", "RUST_LOG"))}
    env.update(
        HAREL_EDGE_PROFILE=profile,
        HAREL_EDGE_AUTH_TOKEN=sqld_primary.rw_token,
        HAREL_EDGE_PREFIX=settings.prefix,
        HAREL_EDGE_RETRY_INITIAL_DELAY="0.01",
    )
    if profile == "sqld":
        env["HAREL_EDGE_URL"] = relay.url
    else:
        env.update(HAREL_EDGE_SYNC_URL=relay.url, HAREL_EDGE_DB_PATH=settings.db_path)
    relay.arm(fault, when=f"{settings.prefix}_transport_publish_once")
    command = str(Path(sys.executable).parent / "harel-edge")
    done = subprocess.run([command, "publish", "order-1", "Pay"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "published Pay" in done.stdout
    _fired(relay, fault)
    with LibsqlTransport(settings=_direct(sqld_primary, settings), create_schema=False) as direct:
        assert direct.depth() == 1, "queued once"


# ---- the token ---------------------------------------------------------------------------------


def test_a_refused_token_fails_at_once_with_what_to_do_and_without_the_token(sqld_primary):
    async def main():
        good = _settings(sqld_primary)
        migrate_schema(good)
        bad = _settings(sqld_primary, auth_token="not-a-valid-token", prefix=good.prefix)
        executor = HranaExecutor(bad)
        try:
            with pytest.raises(AuthError) as raised:
                await EventTransport(executor, bad).publish("a", Event(kind="a1"))
            assert "HAREL_EDGE_AUTH_TOKEN" in str(raised.value)
            assert "not-a-valid-token" not in str(raised.value) and "not-a-valid-token" not in repr(executor)
        finally:
            await executor.aclose()
        executor = HranaExecutor(good)
        try:
            assert await EventTransport(executor, good).depth() == 0, "nothing was queued"
        finally:
            await executor.aclose()

    asyncio.run(main())


def test_a_token_with_a_trailing_newline_is_used_without_it(sqld_primary):
    async def main():
        settings = _settings(sqld_primary)
        migrate_schema(settings)
        newline = _settings(sqld_primary, auth_token=sqld_primary.rw_token + "\n", prefix=settings.prefix)
        executor = HranaExecutor(newline)
        try:
            assert await EventTransport(executor, newline).depth() == 0
        finally:
            await executor.aclose()

    asyncio.run(main())


# ---- the durable stores, through the same relay -------------------------------------------------


@contextlib.asynccontextmanager
async def durable_relayed(server, relay):
    """The durable stores on `server` through the relay."""
    database = connect(_settings(server, relay.url))
    try:
        await migrate(database)
        await database.execute("test.effects", "CREATE TABLE IF NOT EXISTS fault_effects (workflow TEXT)")
        yield database
    finally:
        await database.aclose()


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_an_sql_effect_whose_answer_was_lost_is_looked_up_and_applied_once(sqld_primary, relay, fault):
    async def main():
        async with durable_relayed(sqld_primary, relay) as database:
            checkpointer = LibsqlCheckpointer(database)
            workflow = f"wf-{fault}-{uuid.uuid4().hex[:8]}"
            holder = await checkpointer.claim(workflow, timedelta(minutes=5), timedelta(minutes=5))
            effect = SqlEffect(("INSERT INTO fault_effects (workflow) VALUES (?)", (workflow,)), value="done")
            relay.arm(fault)
            sent_before = relay.transactions
            assert await checkpointer.transact(holder, "charge", effect) == "done"
            _fired(relay, fault)
            assert relay.transactions == sent_before + 1, "sent once, then looked up, not resent"
            rows = await database.execute("test.read", "SELECT count(*) FROM fault_effects WHERE workflow = ?", (workflow,))
            assert rows == [(1,)], "the effect was applied exactly once"

    asyncio.run(main())


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_delivery_extend_whose_answer_was_lost_returns_the_receipt_it_wrote(sqld_primary, relay, fault):
    async def main():
        async with durable_relayed(sqld_primary, relay) as database:
            namespace = f"ns-{fault}-{uuid.uuid4().hex[:8]}"
            scheduler = LibsqlScheduler(database, namespace=namespace)
            await scheduler.make_ready("wf")
            delivery = await scheduler.next_ready(timedelta(0))
            relay.arm(fault)
            extended = await scheduler.extend(delivery, timedelta(seconds=60))
            _fired(relay, fault)
            assert extended.receipt != delivery.receipt, "the receipt the landed extend wrote"
            await scheduler.done(extended)
            rows = await database.execute("test.read", "SELECT count(*) FROM workflow_queue WHERE namespace = ?", (namespace,))
            assert rows == [(0,)], "done with that receipt removed the row"

    asyncio.run(main())


def _shared_writes(server, relay, refusals: int, writers: int = 12) -> tuple[list, int, list[int]]:
    """`writers` one-insert units sent together through the relay, the first `refusals` shared
    transactions answered as a primary checkpointing its WAL answers them; returns the units'
    results, the transactions sqld ran for them, and the keys that landed (read straight from sqld)."""
    settings = _settings(server, relay.url)
    direct = _direct(server, settings)
    table = f"{settings.prefix}_rows"

    async def run() -> tuple[list, int, list[int]]:
        straight = HranaExecutor(direct)
        executor = HranaExecutor(settings, linger=0.05)  # long enough for every unit to join one batch
        try:
            await straight.execute(Stmt(f"CREATE TABLE {table} (k INTEGER)"))
            for _ in range(refusals):
                relay.arm("write lock held", when=UNIT_SAVEPOINT)
            batches = relay.batches
            insert = f"INSERT INTO {table} (k) VALUES (?)"
            results = await asyncio.gather(*(executor.transaction([Stmt(insert, (k,))]) for k in range(writers)))
            ran = relay.batches - batches
            rows = (await straight.execute(Stmt(f"SELECT k FROM {table} ORDER BY k"))).rows
            return results, ran, [k for (k,) in rows]
        finally:
            await executor.aclose()
            await straight.aclose()

    return asyncio.run(run())


def test_a_shared_transaction_refused_for_the_write_lock_goes_again_whole_and_commits_each_unit_once(sqld_primary, relay):
    counted = {"operation": "executor.write_lock"}
    before = REGISTRY.get_sample_value("harel_edge_retries_total", counted) or 0.0
    results, transactions, keys = _shared_writes(sqld_primary, relay, refusals=2)
    assert relay.fired == ["write lock held"] * 2 and not relay.armed
    assert REGISTRY.get_sample_value("harel_edge_retries_total", counted) == before + 2
    assert transactions == 1, f"the units went again in {transactions} transactions, not together"
    assert [[r.affected for r in result] for result in results] == [[1]] * 12
    assert keys == list(range(12))


def test_a_shared_transaction_refused_past_its_tries_goes_again_one_transaction_a_unit(sqld_primary, relay, monkeypatch):
    monkeypatch.setattr(remote, "WRITE_LOCK_HELD", Backoff(0.01, 0.1, tries=2))
    results, transactions, keys = _shared_writes(sqld_primary, relay, refusals=2)
    assert relay.fired == ["write lock held"] * 2
    assert transactions == 12  # as after any shared transaction that ended before its units ran
    assert [[r.affected for r in result] for result in results] == [[1]] * 12
    assert keys == list(range(12))


def test_an_operators_command_that_meets_the_primarys_write_lock_goes_again_instead_of_failing(sqld_primary, relay):
    """sqld refuses a writer at once while it checkpoints (SQLITE_BUSY): a command such as
    `workflows cancel`, run while workers are busy, waits it out under the retry policy."""
    from harel_edge.workflow_control import cancel_workflow

    settings = _settings(sqld_primary, relay.url)
    migrate_schema(settings)

    async def queued() -> None:
        database = connect(settings)
        await LibsqlScheduler(database, namespace="ops").make_ready("locked-out")
        await database.aclose()

    asyncio.run(queued())
    relay.arm("write lock held", when=f"{settings.prefix}_workflow_cancel")
    change = cancel_workflow(settings, "locked-out")
    assert relay.fired == ["write lock held"]
    assert (change.before, change.after, change.changed) == ("ready", "cancelled", True)
