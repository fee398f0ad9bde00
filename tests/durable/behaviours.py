"""The durable stores' behaviours, one function each, runnable on any profile.

Why a module of plain async functions rather than test functions: the same behaviours must
hold on the local file, on sqld and through an embedded replica. `test_behaviours_local.py`
runs each of them on the local profile and `tests/e2e/test_durable_sqld.py` on the other two,
so the three can never drift apart. Each function's name is the behaviour it checks.

Time is a `Clock` the test moves by hand, injected into both stores: the behaviours are about
what the SQL does with time, not about waiting for it (the e2e tests also check the database's
own clock).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from harel_edge.durable import (
    Delivery,
    FencedError,
    LibsqlCheckpointer,
    LibsqlDurable,
    LibsqlScheduler,
    Pass,
    SqlEffect,
    connect,
    migrate,
)
from harel_edge.durable.database import Database
from harel_edge.errors import ConfigurationError, NotFoundError
from harel_edge.executor import StatementError
from harel_edge.settings import EdgeSettings

HOUR = timedelta(hours=1)
BUDGET = timedelta(minutes=10)
ALIVE = timedelta(seconds=30)
LEASE = timedelta(seconds=60)


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.current = datetime(2031, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.current

    def advance(self, **span: float) -> datetime:
        self.current += timedelta(**span)
        return self.current


@dataclass
class Stores:
    database: Database
    checkpointer: LibsqlCheckpointer
    scheduler: LibsqlScheduler
    durable: LibsqlDurable
    clock: Clock

    def workflow(self) -> str:
        """A workflow id of this test alone (a remote database is shared by the session)."""
        return f"wf-{uuid.uuid4().hex[:12]}"

    async def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Read through the primary on every profile (a replica syncs first)."""

        def work(connection):  # noqa: ANN001
            connection.sync()
            return connection.execute(sql, params)

        return await self.database.run(work)

    async def effects(self, workflow: str) -> list[tuple]:
        return await self.rows("SELECT step FROM durable_effects WHERE workflow = ? ORDER BY id", (workflow,))

    async def queue_row(self, workflow: str) -> float | None:
        rows = await self.rows(
            "SELECT visible_at FROM workflow_queue WHERE namespace = ? AND workflow = ?",
            (self.scheduler.namespace, workflow),
        )
        return rows[0][0] if rows else None


def settings_for(profile: str, request: pytest.FixtureRequest, tmp_path) -> EdgeSettings:  # noqa: ANN001
    """Settings for `profile`: a file of this test's own, or the session's sqld primary (directly or
    through an embedded replica)."""
    if profile == "local":
        return EdgeSettings(db_path=str(tmp_path / "durable.db"))
    primary = request.getfixturevalue("sqld_primary")
    if profile == "sqld":
        return EdgeSettings(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    return EdgeSettings(
        profile="replica", sync_url=primary.http_url, auth_token=primary.rw_token, db_path=str(tmp_path / "r.db")
    )


async def open_stores(settings: EdgeSettings, **scheduler: object) -> Stores:
    """Both stores on one migrated Database, both on one hand-moved clock."""
    clock = Clock()
    database = connect(settings)
    await migrate(database)
    await database.run(
        lambda c: c.execute(
            "CREATE TABLE IF NOT EXISTS durable_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"
        )
    )
    checkpointer = LibsqlCheckpointer(database, now=clock)
    options = {"lease": LEASE, "poll": timedelta(milliseconds=50)} | scheduler
    sched = LibsqlScheduler(database, namespace=f"ns-{uuid.uuid4().hex[:8]}", now=clock, **options)
    return Stores(database, checkpointer, sched, LibsqlDurable(checkpointer, sched), clock)


def insert_effect(workflow: str, step: str) -> Callable:
    """An effect that writes one row of its own, the thing exactly-once is about."""
    return lambda tx: tx.execute(
        "INSERT INTO durable_effects (workflow, step) VALUES (?, ?) RETURNING id", (workflow, step)
    )[0][0]


# ---- claims and fencing ----------------------------------------------------------------------


async def a_held_workflow_cannot_be_claimed_and_each_new_claim_gets_a_larger_token(s: Stores) -> None:
    wf = s.workflow()
    first = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    assert first is not None
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is None
    await s.checkpointer.release(first)
    second = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    assert second is not None and second.token > first.token


async def a_pass_whose_claim_lapsed_and_was_taken_over_can_write_nothing(s: Stores) -> None:
    wf = s.workflow()
    old = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    s.clock.advance(seconds=31)
    new = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    assert old is not None and new is not None and new.token == old.token + 1
    ran = []
    with pytest.raises(FencedError):
        await s.checkpointer.record(old, "step", "old")
    with pytest.raises(FencedError):
        await s.checkpointer.transact(old, "effect", lambda tx: ran.append(1))
    assert not await s.checkpointer.renew(old, ALIVE)
    assert not await s.checkpointer.extend(old, BUDGET, ALIVE)
    assert ran == []
    assert (await s.checkpointer.record(new, "step", "new")).value == "new"
    assert await s.checkpointer.load(wf) == {"step": "new"}


async def a_lapsed_claim_nobody_took_over_is_still_its_holders(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    s.clock.advance(seconds=45)
    assert (await s.checkpointer.record(holder, "late", 1)).fresh
    # ...and the record was a sign of life: nobody can take it for another ALIVE.
    s.clock.advance(seconds=29)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is None


async def a_renewal_keeps_the_claim_but_never_past_its_budget(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, timedelta(seconds=60), ALIVE)
    s.clock.advance(seconds=25)
    assert await s.checkpointer.renew(holder, ALIVE)
    s.clock.advance(seconds=25)  # 50 s: alive thanks to the renewal
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is None
    assert await s.checkpointer.renew(holder, timedelta(minutes=5))  # asks for 5 min, gets 10 s
    s.clock.advance(seconds=10)  # 60 s: the budget is spent
    assert not await s.checkpointer.renew(holder, ALIVE)
    with pytest.raises(FencedError):
        await s.checkpointer.record(holder, "after-budget", 1)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is not None


async def a_renewal_cannot_revive_a_released_claim(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    await s.checkpointer.release(holder)
    assert not await s.checkpointer.renew(holder, ALIVE)
    with pytest.raises(FencedError):
        await s.checkpointer.record(holder, "after-release", 1)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is not None


async def extending_a_claim_gives_it_a_new_budget_from_now(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, timedelta(seconds=40), ALIVE)
    s.clock.advance(seconds=20)
    assert await s.checkpointer.extend(holder, timedelta(seconds=100), ALIVE)
    s.clock.advance(seconds=25)  # 45 s: past the first budget, inside the second
    assert await s.checkpointer.renew(holder, ALIVE)
    assert (await s.checkpointer.record(holder, "k", "v")).fresh


# ---- records ---------------------------------------------------------------------------------


async def the_first_record_of_a_key_wins_and_a_second_returns_it(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    first = await s.checkpointer.record(holder, "quote", {"price": 10})
    s.clock.advance(seconds=1)
    second = await s.checkpointer.record(holder, "quote", {"price": 99})
    assert first.fresh and not second.fresh
    assert second.value == {
        "price": 10
    } and second.written_at == first.written_at == s.clock.current - timedelta(seconds=1)
    history = await s.checkpointer.history(wf)
    assert history["quote"].value == {"price": 10}
    assert history["quote"].written_at == first.written_at


async def load_returns_records_in_the_order_they_were_written(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    for key in ("z", "a", "m"):
        await s.checkpointer.record(holder, key, key.upper())
    assert list((await s.checkpointer.load(wf)).items()) == [("z", "Z"), ("a", "A"), ("m", "M")]


async def a_transact_runs_its_effect_and_records_it_in_one_commit(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    row_id = await s.checkpointer.transact(holder, "charge", insert_effect(wf, "charge"))
    assert await s.effects(wf) == [("charge",)]
    assert await s.checkpointer.load(wf) == {"charge": row_id}


async def a_replayed_transact_performs_nothing_and_returns_the_first_result(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    first = await s.checkpointer.transact(holder, "charge", insert_effect(wf, "charge"))
    s.clock.advance(seconds=31)
    later = await s.checkpointer.claim(wf, BUDGET, ALIVE)  # a new pass replays the workflow
    calls = []

    def effect(tx):  # noqa: ANN001
        calls.append(1)
        return insert_effect(wf, "charge")(tx)

    assert await s.checkpointer.transact(later, "charge", effect) == first
    assert calls == []
    assert await s.effects(wf) == [("charge",)]


async def an_effect_that_raises_leaves_neither_its_writes_nor_a_record(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)

    def failing(tx):  # noqa: ANN001
        insert_effect(wf, "charge")(tx)
        raise RuntimeError("card declined")

    with pytest.raises(RuntimeError, match="card declined"):
        await s.checkpointer.transact(holder, "charge", failing)
    assert await s.effects(wf) == []
    assert await s.checkpointer.load(wf) == {}
    assert await s.checkpointer.transact(holder, "charge", insert_effect(wf, "charge")) is not None
    assert await s.effects(wf) == [("charge",)]


async def a_transact_whose_budget_runs_out_during_its_effect_is_rolled_back(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, timedelta(seconds=60), ALIVE)

    def slow(tx):  # noqa: ANN001
        insert_effect(wf, "slow")(tx)
        s.clock.advance(seconds=61)  # the effect outlived the claim's budget

    with pytest.raises(FencedError):
        await s.checkpointer.transact(holder, "slow", slow)
    assert await s.effects(wf) == []
    assert await s.checkpointer.load(wf) == {}


async def a_transact_is_a_sign_of_life_measured_when_it_ends(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)

    def long(tx):  # noqa: ANN001
        s.clock.advance(seconds=40)  # longer than ALIVE: the claim lapsed while it ran

    await s.checkpointer.transact(holder, "long", long)
    s.clock.advance(seconds=29)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is None


async def executemany_in_a_transact_effect_commits_every_row_with_the_step_or_none(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    insert = "INSERT INTO durable_effects (workflow, step) VALUES (?, ?)"

    def failing(tx):  # noqa: ANN001
        tx.executemany(insert, [(wf, "lost-1"), (wf, "lost-2")])
        raise RuntimeError("card declined")

    with pytest.raises(RuntimeError, match="card declined"):
        await s.checkpointer.transact(holder, "batch", failing)
    assert await s.effects(wf) == []
    await s.checkpointer.transact(holder, "batch", lambda tx: tx.executemany(insert, [(wf, "a"), (wf, "b")]))
    assert await s.effects(wf) == [("a",), ("b",)]
    assert await s.checkpointer.load(wf) == {"batch": None}


async def supplied_values_and_inbox_entries_need_no_claim_and_the_first_wins(s: Stores) -> None:
    wf = s.workflow()
    assert await s.checkpointer.supply(wf, "approval", "yes") == "yes"
    assert await s.checkpointer.supply(wf, "approval", "no") == "yes"
    one = await s.checkpointer.append(wf, "first")
    two = await s.checkpointer.append(wf, "second")
    again = await s.checkpointer.append(wf, "duplicate send", key=two.key)
    assert one.key != two.key and again.value == "second"
    records = await s.checkpointer.load(wf)
    assert [records[key] for key in records if key.startswith("inbox/")] == ["first", "second"]
    assert records["approval"] == "yes"


async def discard_forgets_the_records_and_fences_the_pass_in_flight(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    await s.checkpointer.record(holder, "a", 1)
    await s.checkpointer.record(holder, "b", 2)
    assert await s.checkpointer.discard(wf) == 2
    assert await s.checkpointer.load(wf) == {}
    with pytest.raises(FencedError):
        await s.checkpointer.record(holder, "a", 1)
    fresh = await s.checkpointer.claim(wf, BUDGET, ALIVE)  # free at once, with a larger number
    assert fresh is not None and fresh.token == holder.token + 2
    assert await s.checkpointer.discard(s.workflow()) == 0


# ---- the scheduler ---------------------------------------------------------------------------

NOW = timedelta(0)


async def a_ready_workflow_is_delivered_once_until_its_lease_ends(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    assert delivery is not None and delivery.workflow == wf
    assert await s.scheduler.next_ready(NOW) is None
    s.clock.advance(seconds=61)
    again = await s.scheduler.next_ready(NOW)
    assert again is not None and again.workflow == wf and again.receipt != delivery.receipt


async def wake_at_with_the_current_receipt_puts_the_workflow_to_sleep(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    await s.scheduler.wake_at(delivery, s.clock.current + HOUR)
    s.clock.advance(minutes=59)
    assert await s.scheduler.next_ready(NOW) is None
    s.clock.advance(minutes=1)
    assert (await s.scheduler.next_ready(NOW)).workflow == wf


async def a_wakeup_during_a_pass_outlives_its_wake_at_and_its_done(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    s.clock.advance(seconds=1)
    await s.scheduler.make_ready(wf)  # a message arrives while the pass runs
    await s.scheduler.wake_at(delivery, s.clock.current + HOUR)  # the pass, unaware, sleeps
    await s.scheduler.done(delivery)
    assert (await s.scheduler.next_ready(NOW)).workflow == wf  # the wakeup was kept


async def extend_renames_the_delivery_and_the_old_receipt_goes_stale(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    s.clock.advance(seconds=30)
    extended = await s.scheduler.extend(delivery, timedelta(seconds=60))
    assert extended.receipt != delivery.receipt and extended.workflow == wf
    s.clock.advance(seconds=45)  # past the first lease, inside the extension
    assert await s.scheduler.next_ready(NOW) is None
    await s.scheduler.done(delivery)  # the old name changes nothing
    assert await s.queue_row(wf) is not None
    await s.scheduler.done(extended)
    assert await s.queue_row(wf) is None


async def takes_within_one_tick_never_share_a_receipt_so_a_stale_delivery_changes_nothing(s: Stores) -> None:
    # The clock stands still, so every take falls in one tick. Were receipts drawn from 4,096
    # values (a random sub-millisecond jitter), 400 of them all distinct would be a 1 in 10^8 chance.
    wf = s.workflow()
    deliveries = []
    for _ in range(400):
        await s.scheduler.make_ready(wf)  # a wakeup during the pass: the next take supersedes it
        deliveries.append(await s.scheduler.next_ready(NOW))
    assert len(set(deliveries)) == len(deliveries)
    stale, current = deliveries[-2], deliveries[-1]
    await s.scheduler.wake_at(stale, s.clock.current + HOUR)
    await s.scheduler.done(stale)
    assert await s.queue_row(wf) == current.receipt
    await s.scheduler.done(current)
    assert await s.queue_row(wf) is None


async def extending_a_delivery_that_was_rescheduled_hands_it_back_unchanged(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    s.clock.advance(seconds=1)
    await s.scheduler.make_ready(wf)
    assert await s.scheduler.extend(delivery, LEASE) == delivery
    assert await s.queue_row(wf) == pytest.approx(s.clock.current.timestamp())


async def drop_removes_a_workflow_and_a_pass_in_flight_cannot_put_it_back(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    await s.scheduler.drop(wf)
    await s.scheduler.wake_at(delivery, s.clock.current + HOUR)
    assert await s.scheduler.extend(delivery, LEASE) == delivery
    assert await s.queue_row(wf) is None
    sleeping = s.workflow()
    await s.scheduler.schedule(sleeping, s.clock.current + HOUR)
    await s.scheduler.drop(sleeping)
    assert await s.queue_row(sleeping) is None


async def make_ready_never_delays_and_schedule_sets_the_time_it_is_given(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.schedule(wf, s.clock.current + HOUR)
    await s.scheduler.make_ready(wf)  # wakes it early
    assert await s.queue_row(wf) == s.clock.current.timestamp()
    s.clock.advance(seconds=5)
    await s.scheduler.make_ready(wf)  # already due earlier: unchanged
    assert await s.queue_row(wf) == s.clock.current.timestamp() - 5
    await s.scheduler.schedule(wf, s.clock.current + HOUR)  # schedule is the exact time
    assert await s.queue_row(wf) == (s.clock.current + HOUR).timestamp()


async def the_earliest_visible_workflow_is_delivered_first(s: Stores) -> None:
    late, early = s.workflow(), s.workflow()
    await s.scheduler.schedule(late, s.clock.current - timedelta(seconds=1))
    await s.scheduler.schedule(early, s.clock.current - timedelta(seconds=2))
    assert [(await s.scheduler.next_ready(NOW)).workflow for _ in range(2)] == [early, late]


async def take_ready_leases_up_to_its_limit_oldest_first_in_one_statement_and_none_twice(s: Stores) -> None:
    ready = [s.workflow() for _ in range(5)]
    for age, wf in enumerate(ready):
        await s.scheduler.schedule(wf, s.clock.current - timedelta(seconds=10 - age))
    first = await s.scheduler.take_ready(3, NOW)
    rest = await s.scheduler.take_ready(3, NOW)
    assert sorted(d.workflow for d in first) == sorted(ready[:3]), "the three that waited longest"
    assert sorted(d.workflow for d in rest) == sorted(ready[3:])
    assert await s.scheduler.take_ready(3, NOW) == []
    for delivery in first:
        await s.scheduler.done(delivery)
    s.clock.advance(seconds=61)
    assert sorted(d.workflow for d in await s.scheduler.take_ready(5, NOW)) == sorted(ready[3:]), (
        "a lapsed lease hands the workflow out again; the finished ones are gone"
    )


async def sleepers_and_abandoned_work_need_no_sweeping(s: Stores) -> None:
    sleeper, abandoned = s.workflow(), s.workflow()
    await s.scheduler.schedule(sleeper, s.clock.current + HOUR)
    await s.scheduler.make_ready(abandoned)
    taken = await s.scheduler.next_ready(NOW)
    assert taken is not None and taken.workflow == abandoned  # ...and its worker vanishes
    assert await s.scheduler.next_ready(NOW) is None  # one asleep, one out with a worker
    # Nothing sweeps from here on: each comes back by its own time.
    s.clock.advance(seconds=61)  # past the lease (60 s)
    again = await s.scheduler.next_ready(NOW)
    assert again is not None and again.workflow == abandoned, "abandoned work is visible after its lease"
    await s.scheduler.done(again)  # the worker that took it over finishes it
    assert await s.scheduler.next_ready(NOW) is None, "the sleeper's time has not come"
    s.clock.advance(hours=1)
    woke = await s.scheduler.next_ready(NOW)
    assert woke is not None and woke.workflow == sleeper, "a sleeper is visible when its time comes"


async def next_ready_wakes_at_once_on_a_wakeup_made_in_this_process(s: Stores) -> None:
    # The poll is an hour: only the in-process signal can end this wait.
    s.scheduler.poll_seconds = 3600.0
    wf = s.workflow()
    waiting = asyncio.create_task(s.scheduler.next_ready(HOUR))
    await asyncio.sleep(0)  # let it start looking (and find nothing)
    await s.scheduler.make_ready(wf)
    delivery = await asyncio.wait_for(waiting, timeout=60)
    assert isinstance(delivery, Delivery) and delivery.workflow == wf


# ---- one commit ------------------------------------------------------------------------------


async def arrive_records_the_value_and_makes_the_workflow_ready_in_one_commit(s: Stores) -> None:
    wf = s.workflow()
    assert await s.durable.arrive(wf, "approval", "yes") == "yes"
    assert await s.durable.arrive(wf, "approval", "no") == "yes"
    assert await s.checkpointer.load(wf) == {"approval": "yes"}
    assert (await s.scheduler.next_ready(NOW)).workflow == wf
    # All or nothing: when the queue half fails, the record is not there either.
    other = s.workflow()
    await _refuse_queue_writes(s, other)
    with pytest.raises(Exception, match="refused"):
        await s.durable.arrive(other, "approval", "yes")
    assert await s.checkpointer.load(other) == {}


async def deliver_appends_to_the_inbox_and_makes_the_workflow_ready_in_one_commit(s: Stores) -> None:
    wf = s.workflow()
    first = await s.durable.deliver(wf, {"n": 1})
    second = await s.durable.deliver(wf, {"n": 2})
    records = await s.checkpointer.load(wf)
    assert [key for key in records] == [first.key, second.key]
    assert (await s.scheduler.next_ready(NOW)).workflow == wf
    other = s.workflow()
    await _refuse_queue_writes(s, other)
    with pytest.raises(Exception, match="refused"):
        await s.durable.deliver(other, "lost?")
    assert await s.checkpointer.load(other) == {}


async def delete_drops_wakeups_records_and_raises_the_fence_in_one_commit(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    await s.checkpointer.record(holder, "a", 1)
    await s.scheduler.schedule(wf, s.clock.current + HOUR)
    assert await s.durable.delete(wf) == 1
    assert await s.checkpointer.load(wf) == {}
    assert await s.queue_row(wf) is None
    with pytest.raises(FencedError):
        await s.checkpointer.record(holder, "b", 2)
    # All or nothing: when dropping the wakeup fails, records and fence stay as they were.
    other = s.workflow()
    kept = await s.checkpointer.claim(other, BUDGET, ALIVE)
    await s.checkpointer.record(kept, "a", 1)
    await s.scheduler.schedule(other, s.clock.current + HOUR)
    await _refuse_queue_writes(s, other)
    with pytest.raises(Exception, match="refused"):
        await s.durable.delete(other)
    assert await s.checkpointer.load(other) == {"a": 1}
    assert (await s.checkpointer.record(kept, "b", 2)).fresh


async def _refuse_queue_writes(s: Stores, workflow: str) -> None:
    """Make any write of this workflow's queue row fail, with a real trigger, not a mock."""
    name = f"refuse_{workflow.replace('-', '_')}"
    for event in ("INSERT", "UPDATE", "DELETE"):
        row = "OLD" if event == "DELETE" else "NEW"
        await s.database.run(
            lambda c, event=event, row=row: c.execute(
                f"CREATE TRIGGER IF NOT EXISTS {name}_{event.lower()} BEFORE {event} ON workflow_queue"
                f" WHEN {row}.workflow = '{workflow}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        )


Behaviour = Callable[[Stores], Awaitable[None]]

async def a_transact_whose_effect_is_sql_applies_it_with_its_record_once(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    effect = SqlEffect(("INSERT INTO durable_effects (workflow, step) VALUES (?, 'charge')", (wf,)), value={"id": 7})
    assert await s.checkpointer.transact(holder, "charge", effect) == {"id": 7}
    s.clock.advance(seconds=31)
    later = await s.checkpointer.claim(wf, BUDGET, ALIVE)  # a new pass replays the workflow
    assert await s.checkpointer.transact(later, "charge", effect) == {"id": 7}
    assert await s.effects(wf) == [("charge",)]
    assert await s.checkpointer.load(wf) == {"charge": {"id": 7}}


async def an_sql_effect_whose_statement_fails_applies_nothing_and_can_be_tried_again(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    insert = ("INSERT INTO durable_effects (workflow, step) VALUES (?, 'charge')", (wf,))
    with pytest.raises(StatementError, match="statement 1 of the effect of step 'charge'"):
        await s.checkpointer.transact(holder, "charge", SqlEffect(insert, "INSERT INTO no_such_table VALUES (1)"))
    assert await s.effects(wf) == [] and await s.checkpointer.load(wf) == {}
    assert await s.checkpointer.transact(holder, "charge", SqlEffect(insert, value=1)) == 1
    assert await s.effects(wf) == [("charge",)]


async def an_sql_effect_of_a_superseded_pass_is_fenced_and_applies_nothing(s: Stores) -> None:
    wf = s.workflow()
    old = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    s.clock.advance(seconds=31)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is not None
    with pytest.raises(FencedError):
        await s.checkpointer.transact(
            old, "charge", SqlEffect(("INSERT INTO durable_effects (workflow, step) VALUES (?, 'charge')", (wf,)))
        )
    assert await s.effects(wf) == [] and await s.checkpointer.load(wf) == {}


async def a_failing_sql_effect_fails_alone_and_the_operations_sent_with_it_succeed(s: Stores) -> None:
    wf = s.workflow()
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    others = [s.workflow() for _ in range(8)]
    bad = SqlEffect("INSERT INTO full_orders_that_do_not_exist VALUES (1)")  # "full": not a disk-full error
    results = await asyncio.gather(
        s.checkpointer.transact(holder, "bad", bad),
        *(s.checkpointer.claim(other, BUDGET, ALIVE) for other in others),
        return_exceptions=True,
    )
    assert isinstance(results[0], StatementError) and "statement 0 of the effect" in str(results[0])
    assert all(isinstance(r, Pass) for r in results[1:]), results


# ---- the operator's commands: cancel, resume, fork ----------------------------------------


async def _dead_letters(s: Stores, workflow: str) -> list[tuple]:
    prefix = s.database.settings.prefix
    return await s.rows(f"SELECT id FROM {prefix}_dead_letters WHERE kind = 'workflow' AND workflow = ?", (workflow,))


async def a_cancel_fences_off_the_running_pass_and_no_claim_is_granted_until_resume(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    await s.checkpointer.record(holder, "before", 1)
    change = await s.durable.cancel(wf)
    assert (change.before, change.after, change.changed) == ("running", "cancelled", True)
    with pytest.raises(FencedError):
        await s.checkpointer.record(holder, "after", 2)
    with pytest.raises(FencedError):
        await s.checkpointer.transact(holder, "effect", insert_effect(wf, "effect"))
    with pytest.raises(FencedError):
        await s.checkpointer.transact(holder, "sql", SqlEffect(("INSERT INTO durable_effects (workflow, step) VALUES (?, 'sql')", (wf,))))
    assert not await s.checkpointer.renew(holder, ALIVE)
    assert await s.effects(wf) == [] and list(await s.checkpointer.load(wf)) == ["before"]
    assert await s.checkpointer.cancelled(wf)
    assert await s.checkpointer.claim(wf, BUDGET, ALIVE) is None
    # Nothing makes it ready while it is cancelled; an arrival is kept for when it resumes.
    await s.scheduler.make_ready(wf)
    await s.scheduler.schedule(wf, s.clock.current)
    assert await s.durable.arrive(wf, "payment", 5) == 5
    assert await s.queue_row(wf) is None and await s.scheduler.take_ready(10, NOW) == []
    resumed = await s.durable.resume(wf)
    assert (resumed.before, resumed.after) == ("cancelled", "ready")
    assert await s.queue_row(wf) == pytest.approx(s.clock.current.timestamp())
    again = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    assert again is not None and again.token > holder.token
    assert await s.checkpointer.load(wf) == {"before": 1, "payment": 5}


async def of_two_cancels_at_once_one_says_it_changed_it(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.schedule(wf, s.clock.current + HOUR)
    changes = await asyncio.gather(s.durable.cancel(wf), s.durable.cancel(wf))
    assert sorted(c.changed for c in changes) == [False, True]
    assert {c.before for c in changes} == {"sleeping", "cancelled"}, "the sleeper's timer is gone"
    assert await s.queue_row(wf) is None
    resumed = await asyncio.gather(s.durable.resume(wf), s.durable.resume(wf))
    assert sorted(c.changed for c in resumed) == [False, True]


async def a_command_that_does_not_apply_changes_nothing_and_says_so(s: Stores) -> None:
    done = s.workflow()
    holder = await s.checkpointer.claim(done, BUDGET, ALIVE)
    await s.checkpointer.record(holder, "$result", "ok")
    await s.checkpointer.release(holder)
    before = await s.rows("SELECT * FROM workflow_claim WHERE workflow = ?", (done,))
    for command in (s.durable.cancel, s.durable.resume):
        change = await command(done)
        assert (change.before, change.after, change.changed) == ("finished", "finished", False)
    assert await s.rows("SELECT * FROM workflow_claim WHERE workflow = ?", (done,)) == before
    waiting = s.workflow()
    await s.scheduler.make_ready(waiting)
    assert not (await s.durable.resume(waiting)).changed, "only a cancelled or dead workflow resumes"
    with pytest.raises(NotFoundError, match="workflows list"):
        await s.durable.cancel(s.workflow())
    with pytest.raises(NotFoundError):
        await s.durable.resume(s.workflow())
    with pytest.raises(ConfigurationError, match="no step 'nope'.*its steps are none yet"):
        await s.durable.fork(waiting, "nope")


async def resume_brings_back_a_dead_workflow_ready_with_its_failed_passes_forgotten(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    delivery = await s.scheduler.next_ready(NOW)
    assert await s.scheduler.failed(delivery, "boom", 1) == (1, True)
    assert len(await _dead_letters(s, wf)) == 1
    change = await s.durable.resume(wf)
    assert (change.before, change.after) == ("dead", "ready")
    assert await _dead_letters(s, wf) == []
    rows = await s.rows("SELECT failures, last_error FROM workflow_queue WHERE workflow = ?", (wf,))
    assert rows == [(0, None)]
    # A dead workflow cancelled instead: its dead letter goes, so no requeue brings it back.
    await s.scheduler.drop(wf)  # so the next delivery is the other one's
    other = s.workflow()
    await s.scheduler.make_ready(other)
    delivery = await s.scheduler.next_ready(NOW)
    await s.scheduler.failed(delivery, "boom", 1)
    assert (await s.durable.cancel(other)).before == "dead"
    assert await _dead_letters(s, other) == [] and await s.queue_row(other) is None


async def a_fork_copies_the_records_before_its_step_and_leaves_the_original_as_it_was(s: Stores) -> None:
    wf = s.workflow()
    await s.scheduler.make_ready(wf)
    holder = await s.checkpointer.claim(wf, BUDGET, ALIVE)
    for step in ("one", "two", "three"):
        await s.checkpointer.transact(holder, step, insert_effect(wf, step))
    await s.checkpointer.record(holder, "$result", "done")
    await s.checkpointer.release(holder)
    await s.scheduler.drop(wf)
    original = await s.checkpointer.history(wf)
    change = await s.durable.fork(wf, "two", f"{wf}-again")
    assert (change.workflow, change.before, change.after, change.forked_from) == (f"{wf}-again", "absent", "ready", wf)
    assert list(await s.checkpointer.load(f"{wf}-again")) == ["one"], "the steps before it, never the result"
    assert await s.queue_row(f"{wf}-again") == pytest.approx(s.clock.current.timestamp())
    assert await s.checkpointer.history(wf) == original
    with pytest.raises(ConfigurationError, match="exists already"):
        await s.durable.fork(wf, "one", f"{wf}-again")
    retried = await s.durable.fork(wf, "two", f"{wf}-again")
    assert not retried.changed, "a fork retried after it landed makes nothing twice"
    unnamed = await s.durable.fork(wf, "three")
    assert unnamed.workflow.startswith(f"{wf}.fork-") and list(await s.checkpointer.load(unnamed.workflow)) == ["one", "two"]


ALL: list[Behaviour] = [
    value
    for name, value in list(globals().items())
    if asyncio.iscoroutinefunction(value)
    and value.__module__ == __name__
    and not name.startswith("_")
    and name != "open_stores"
]
