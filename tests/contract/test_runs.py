"""A group's run (its head and the events queued after it, under one lease) on every profile: what
stops a run, what is never part of one, and what a run counts against the limits. The worker is
stepped by hand, with the queue's clock moved by hand."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_edge.executor import open_executor
from harel_edge.limits import set_key_limit
from harel_edge.migration import migrate
from harel_edge.queue import EventTransport
from harel_edge.store import EventStore
from harel_edge.testing.machines import COUNTER
from harel_edge.worker import load_definitions
from harel_edge.worker_loops import EdgeAsyncWorker

LIMIT = 3  # deliveries before a failing event is dead-lettered
RECHECK = 5.0  # how long a failed (or suspended) event stays parked
MAX_RUN = 16


@contextlib.asynccontextmanager
async def hot_worker(settings, tmp_path: Path, now: list[float]):
    """A worker as `harel-edge worker` builds it, on the counter machine, with the queue's clock `now`."""
    migrate(settings)
    directory = tmp_path / "definitions"
    directory.mkdir(exist_ok=True)
    (directory / "counter.stm").write_text(COUNTER)
    executor = open_executor(settings)
    transport = EventTransport(
        executor, settings, clock=lambda: now[0], concurrency=8, prefetch=True, max_deliveries=LIMIT, max_run=MAX_RUN
    )
    worker = EdgeAsyncWorker(
        EventStore(executor, settings, events=transport), transport, load_definitions(str(directory)), worker_id="w", suspend_recheck=RECHECK, concurrency=8
    )
    try:
        yield worker
    finally:
        await executor.aclose()


async def counting(worker, group: str, ticks: int, **flow) -> list[Event]:
    """A counter execution with its Start and `ticks` Ticks queued; returns the events in order."""
    await worker.store.save(Execution(id=group, definition_id="counter", context={"n": 0}))
    events = [Event(kind="Start"), *(Event(kind="Tick") for _ in range(ticks))]
    for event in events:
        await worker.transport.publish(group, event, **flow)
    return events


async def count(worker, group: str) -> int:
    return (await worker.store.load(group)).context["n"]


async def queued(worker, group: str) -> list[tuple[str, int, bool]]:
    """The group's messages in order: event id, deliveries, and whether anyone holds or parks it."""
    sql = f"SELECT json_extract(event, '$.id'), deliveries, locked_by IS NOT NULL FROM {worker.transport.path.settings.prefix}_transport_messages WHERE group_id = ? ORDER BY seq"
    return [(row[0], row[1], bool(row[2])) for row in (await worker.transport.path.execute(sql, group)).rows]


async def drained(worker) -> int:
    steps = 0
    while await worker.step():
        steps += 1
    return steps


def failing_on(worker, event_id: str) -> None:
    """Handling the event `event_id` raises, every time (as when its execution cannot be read)."""
    load_for_event = worker.store.load_for_event

    async def load(execution_id, loaded_event_id):  # noqa: ANN001, ANN202
        if str(loaded_event_id) == event_id:
            raise LookupError(f"{execution_id} cannot be read for {event_id}")
        return await load_for_event(execution_id, loaded_event_id)

    worker.store.load_for_event = load


def test_a_poison_event_in_a_run_lets_the_ones_before_it_commit_and_holds_the_ones_after_it_in_order(edge, tmp_path):
    async def main():
        now = [1000.0]
        async with hot_worker(edge.settings(), tmp_path, now) as worker:
            events = await counting(worker, "c", 5)
            poison = str(events[3].id)  # the third Tick
            failing_on(worker, poison)
            assert await worker.step() is True
            assert await count(worker, "c") == 2, "the Start and two Ticks before the poison committed"
            after = [(str(e.id), 0, False) for e in events[4:]]
            assert await queued(worker, "c") == [(poison, 1, True), *after], "it is parked, the ones after it free"
            assert await worker.step() is False, "the ones after a parked head wait behind it"
            for delivery in range(2, LIMIT + 1):
                now[0] += RECHECK + 1
                assert await worker.step() is True
                # A head delivered before comes alone: the ones after it are never handled meanwhile.
                assert await queued(worker, "c") == [(poison, delivery, True), *after]
                assert await count(worker, "c") == 2
            now[0] += RECHECK + 1
            await drained(worker)
            assert await count(worker, "c") == 4, "dead-lettered, the poison let the rest through in order"
            assert await queued(worker, "c") == []
            letters = f"SELECT json_extract(event, '$.id') FROM {worker.transport.path.settings.prefix}_dead_letters"
            assert [row[0] for row in (await worker.transport.path.execute(letters)).rows] == [poison]

    asyncio.run(main())


def test_a_delayed_event_is_never_part_of_a_run_before_its_time_and_the_ones_after_it_wait(edge, tmp_path):
    async def main():
        now = [1000.0]
        async with hot_worker(edge.settings(), tmp_path, now) as worker:
            await counting(worker, "c", 2)
            later = Event(kind="Tick")
            await worker.transport.publish("c", later, at=now[0] + 60)
            await worker.transport.publish("c", Event(kind="Tick"))
            assert await worker.step() is True
            assert await count(worker, "c") == 2, "the run ended before the delayed event"
            assert [row[0] for row in await queued(worker, "c")][0] == str(later.id)
            assert await worker.step() is False
            now[0] += 61
            await drained(worker)
            assert await count(worker, "c") == 4

    asyncio.run(main())


def test_each_event_of_a_key_with_a_rate_limit_is_claimed_on_its_own(edge, tmp_path):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with hot_worker(settings, tmp_path, now) as worker:
            set_key_limit(settings, "metered", rate=1000, period=60)
            await counting(worker, "c", 3, limit_key="metered")
            for handled in range(1, 5):
                assert await worker.step() is True
                assert len(await queued(worker, "c")) == 4 - handled, "one event a claim: each claim counts"
            claims = f"SELECT count(*) FROM {settings.prefix}_transport_limit_claims WHERE key = 'metered'"
            assert (await worker.transport.path.execute(claims)).rows[0][0] == 4
            assert await count(worker, "c") == 3

    asyncio.run(main())


def test_a_concurrency_limit_counts_a_groups_run_as_one_slot(edge, tmp_path):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with hot_worker(settings, tmp_path, now) as worker:
            set_key_limit(settings, "one-at-a-time", concurrency=1)
            await counting(worker, "a", 2, limit_key="one-at-a-time")
            await counting(worker, "b", 2, limit_key="one-at-a-time")
            head = await worker._claim()
            run = worker.transport.path.run_of(head)
            assert run is not None and len(run.members) == 3, "the group's whole queue came as one run"
            held = {lease.group_id for lease in worker.transport.path.held.values()}
            assert held == {head.group_id}, "and the other group of the key waits for the slot"
            await worker.handle_run(head)
            await drained(worker)
            assert (await count(worker, "a"), await count(worker, "b")) == (2, 2)

    asyncio.run(main())


def test_a_suspended_executions_events_stay_parked_until_it_is_resumed(edge, tmp_path):
    async def main():
        now = [1000.0]
        async with hot_worker(edge.settings(), tmp_path, now) as worker:
            await counting(worker, "c", 0)
            assert await drained(worker) == 1
            exe = await worker.store.load("c")
            exe.status = Status.SUSPENDED
            await worker.store.save(exe)
            for _ in range(4):
                await worker.transport.publish("c", Event(kind="Tick"))
            assert await worker.step() is True
            rows = await queued(worker, "c")
            assert len(rows) == 4 and rows[0][2], "its head is parked"
            assert [row[1:] for row in rows[1:]] == [(0, False)] * 3, "the ones after it free, never handled"
            assert await worker.step() is False
            exe = await worker.store.load("c")
            exe.status = Status.RUNNING
            await worker.store.save(exe)
            now[0] += RECHECK + 1
            await drained(worker)
            assert await count(worker, "c") == 4 and await queued(worker, "c") == []

    asyncio.run(main())


def test_an_event_published_while_its_groups_run_is_in_hand_is_claimed_after_the_run_commits(edge, tmp_path):
    async def main():
        now = [1000.0]
        async with hot_worker(edge.settings(), tmp_path, now) as worker:
            events = await counting(worker, "c", 3)
            load_for_event, late = worker.store.load_for_event, Event(kind="Tick")

            async def publishing_meanwhile(execution_id, event_id):  # noqa: ANN001, ANN202
                if str(event_id) == str(events[2].id):
                    await worker.transport.publish("c", late)
                return await load_for_event(execution_id, event_id)

            worker.store.load_for_event = publishing_meanwhile
            assert await worker.step() is True
            assert await count(worker, "c") == 3
            # Not part of the run in hand: the claim the run's commit carried took it, after the run.
            assert await queued(worker, "c") == [(str(late.id), 1, True)] and worker.transport.buffered == 1
            assert await worker.step() is True
            assert await count(worker, "c") == 4

    asyncio.run(main())
