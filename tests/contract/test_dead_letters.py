"""Poison messages end in the dead-letter table, on every profile, with time moved by hand."""

from __future__ import annotations

import asyncio
import contextlib

from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import dead_letter
from harel_edge.executor import open_executor
from harel_edge.migration import migrate
from harel_edge.queue import EventTransport
from harel_edge.store import EventStore
from harel_edge.sync_sql import Statements
from harel_edge.worker_loops import EdgeAsyncWorker

LIMIT = 3
RECHECK = 5.0  # harel's suspend_recheck: how long a failed message stays parked


@contextlib.asynccontextmanager
async def event_path(settings, clock, max_deliveries=LIMIT):
    migrate(settings)
    executor = open_executor(settings)
    transport = EventTransport(executor, settings, clock=clock, prefetch=True, max_deliveries=max_deliveries)
    try:
        yield transport, EventStore(executor, settings, events=transport)
    finally:
        await executor.aclose()


@contextlib.contextmanager
def on_primary(settings):
    """A plain connection deciding on the primary (a replica's own file may lag it)."""
    if settings.profile == "replica":
        settings = settings.model_copy(update={"profile": "sqld", "url": settings.sync_url, "sync_url": None})
    primary = Statements(settings)
    try:
        yield primary.execute
    finally:
        primary.close()


async def fail_until_buried(transport, now, limit=LIMIT):
    """Claim, fail and park the head `limit` times, then the claim that finds it over the limit."""
    for attempt in range(limit):
        lease = await transport.claim("w", 30)
        assert lease is not None and transport.deliveries(lease) == attempt + 1
        transport.failed(lease, RuntimeError(f"boom {attempt + 1}"))
        assert await transport.nack(lease, delay=RECHECK) is True
        now[0] += RECHECK + 1
    return await transport.claim("w", 30)


def test_a_message_whose_handling_always_fails_is_dead_lettered_after_n_deliveries_with_its_last_error(edge):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with event_path(settings, lambda: now[0]) as (transport, store):
            # A Start whose execution cannot be read: every handling raises. (One of a machine the
            # worker does not run is dead-lettered at once: tests/cli/test_worker.py.)
            await store.save(Execution(id="poison", definition_id="no-such-machine"))
            await transport.publish("poison", Event(kind="Start"))

            async def unreadable(execution_id, event_id):  # noqa: ANN001, ANN202
                raise LookupError(f"{execution_id} is unreadable")

            store.load_for_event = unreadable
            worker = EdgeAsyncWorker(store, transport, {}, worker_id="w", suspend_recheck=RECHECK, concurrency=4)
            nacked, buried = asyncio.Queue(), asyncio.Queue()
            nack, bury = transport.nack, transport.bury

            async def nack_and_tell(lease, delay=0.0):
                done = await nack(lease, delay)
                nacked.put_nowait(delay)
                return done

            async def bury_and_tell(lease, deliveries=None):
                done = await bury(lease, deliveries)
                buried.put_nowait(done)
                return done

            transport.nack, transport.bury = nack_and_tell, bury_and_tell
            stop = asyncio.Event()
            running = asyncio.create_task(worker.run(stop, idle_sleep=0.001))
            try:
                for _ in range(LIMIT):
                    assert await asyncio.wait_for(nacked.get(), 60) == RECHECK, "harel parks a failure"
                    now[0] += RECHECK + 1  # the park lapses: the next claim delivers it again
                assert await asyncio.wait_for(buried.get(), 60) is True
            finally:
                stop.set()
                await asyncio.wait_for(running, 60)
            assert nacked.empty(), "the delivery over the limit was never handled"
            assert await transport.depth() == 0, "not in the queue any more"
            now[0] += 3600
            assert await transport.claim("w", 30) is None, "and never delivered again"
        with on_primary(settings) as execute:
            (letter,) = dead_letter.list_dead_letters(execute, settings.prefix)
        assert (letter.kind, letter.group_id, letter.event["kind"], letter.attempts) == ("message", "poison", "Start", LIMIT)
        assert letter.last_error == "LookupError: poison is unreadable"
        assert letter.dead_at == now[0] - 3600, "dead at the claim's clock"

    asyncio.run(main())


def test_the_group_behind_a_dead_lettered_message_is_delivered_in_order(edge):
    async def main():
        now = [1000.0]
        async with event_path(edge.settings(), lambda: now[0]) as (transport, _store):
            for kind in ("bad", "second", "third"):
                await transport.publish("g", Event(kind=kind), priority=2, routing_key="eu")
            nxt = await fail_until_buried(transport, now)
            assert nxt is not None and nxt.event.kind == "second", "the claim that buried the head leased the next"
            assert transport.deliveries(nxt) == 1
            assert await transport.ack(nxt) is True
            third = await transport.claim("w", 30)
            assert third.event.kind == "third" and await transport.ack(third) is True

    asyncio.run(main())


def test_requeue_makes_a_dead_letter_deliverable_again_once_with_its_count_reset(edge):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with event_path(settings, lambda: now[0]) as (transport, _store):
            await transport.publish("g", Event(kind="bad"), priority=3, routing_key="eu")
            assert await fail_until_buried(transport, now) is None, "the group had nothing else"
            with on_primary(settings) as execute:
                (letter,) = dead_letter.list_dead_letters(execute, settings.prefix)
                assert letter.last_error == f"RuntimeError: boom {LIMIT}"
                assert dead_letter.requeue(execute, settings.prefix, letter.id) == letter
                assert dead_letter.list_dead_letters(execute, settings.prefix) == []
                assert dead_letter.requeue(execute, settings.prefix, letter.id) is None, "only once"
            again = await transport.claim("w", 30, min_priority=3, routing_keys=["eu"])
            assert again is not None and again.event.id == letter.event["id"], (
                "the same event, in a group with the priority and routing key it had"
            )
            assert transport.deliveries(again) == 1, "its count starts again"
            assert await transport.ack(again) is True
            now[0] += 3600
            assert await transport.claim("w", 30) is None, "delivered once, acked, gone"

    asyncio.run(main())


def test_purge_removes_dead_letters_for_good(edge):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with event_path(settings, lambda: now[0], max_deliveries=1) as (transport, _store):
            for group in ("a", "b", "c"):
                await transport.publish(group, Event(kind="bad"))
            while await transport.depth():  # each fails once and is buried by its next claim
                lease = await transport.claim("w", 30)
                if lease is not None:
                    transport.failed(lease, "bad")
                    await transport.nack(lease, delay=RECHECK)
                now[0] += RECHECK + 1
        with on_primary(settings) as execute:
            letters = dead_letter.list_dead_letters(execute, settings.prefix)
            assert sorted(letter.group_id for letter in letters) == ["a", "b", "c"]
            assert dead_letter.purge(execute, settings.prefix, letters[0].id) is True
            assert dead_letter.purge(execute, settings.prefix, letters[0].id) is False
            assert dead_letter.get_dead_letter(execute, settings.prefix, letters[0].id) is None
            assert dead_letter.purge_all(execute, settings.prefix, kind="workflow") == 0
            assert dead_letter.purge_all(execute, settings.prefix) == 2
            assert dead_letter.list_dead_letters(execute, settings.prefix) == []
            assert dead_letter.requeue(execute, settings.prefix, letters[1].id) is None

    asyncio.run(main())


def test_a_clean_give_back_is_not_counted_but_a_lease_that_lapsed_is(edge):
    async def main():
        now = [1000.0]
        async with event_path(edge.settings(), lambda: now[0], max_deliveries=2) as (transport, _store):
            await transport.publish("g", Event(kind="e"))
            # A suspended execution, a conflict or a stop gives the message back cleanly.
            for _ in range(5):
                lease = await transport.claim("w", 30)
                assert transport.deliveries(lease) == 1
                assert await transport.nack(lease, delay=1.0) is True
                now[0] += 2
            # A worker that died holding it (its lease lapsed) gave nothing back: counted.
            lease = await transport.claim("w", 30)
            now[0] += 31
            lapsed = await transport.claim("w", 30)
            assert lapsed.seq == lease.seq and transport.deliveries(lapsed) == 2
            now[0] += 31
            assert await transport.claim("w", 30) is None, "the third delivery is over the limit of 2"
            assert await transport.depth() == 0

    asyncio.run(main())


def test_without_a_limit_a_transport_never_dead_letters(edge):
    async def main():
        now = [1000.0]
        async with event_path(edge.settings(), lambda: now[0], max_deliveries=0) as (transport, _store):
            await transport.publish("g", Event(kind="bad"))
            for attempt in range(12):
                lease = await transport.claim("w", 30)
                assert lease is not None and transport.deliveries(lease) == attempt + 1
                transport.failed(lease, "still failing")
                await transport.nack(lease, delay=RECHECK)
                now[0] += RECHECK + 1

    asyncio.run(main())
