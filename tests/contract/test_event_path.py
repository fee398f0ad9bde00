"""The worker's event path (executor, claim_many, commit with its ack) on every profile."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from harel.engine.execution import Execution
from harel.engine.store import StoreConflict
from harel.spec.states import Event
from harel.testing import (
    assert_async_listing_contract,
    assert_async_outbox_contract,
    assert_async_purge_contract,
    assert_async_transport_contract,
)

from harel_edge.executor import open_executor
from harel_edge.migration import migrate
from harel_edge.queue import EventTransport
from harel_edge.store import EventStore


@contextlib.asynccontextmanager
async def event_path(settings, clock=None, concurrency=32, prefetch=False):
    migrate(settings)
    executor = open_executor(settings)
    transport = EventTransport(executor, settings, clock=clock, concurrency=concurrency, prefetch=prefetch)
    try:
        yield transport, EventStore(executor, settings, events=transport)
    finally:
        await executor.aclose()


def test_harels_async_transport_contract_holds_on_the_event_path(edge):
    opened = []

    async def make(clock):
        cm = event_path(edge.settings(), clock=clock)
        transport, _store = await cm.__aenter__()
        opened.append(cm)
        return transport

    async def main():
        try:
            await assert_async_transport_contract(make)
        finally:
            for cm in opened:
                await cm.__aexit__(None, None, None)

    asyncio.run(main())
    assert len(opened) >= 7, "the contract built a fresh transport for each of its checks"


@pytest.mark.parametrize(
    "contract",
    [
        lambda store: assert_async_listing_contract(store, ordered=True, ns="l-"),
        lambda store: assert_async_purge_contract(store, ns="p-"),
        lambda store: assert_async_outbox_contract(store, ns="o-"),
    ],
    ids=["listing", "purge", "outbox"],
)
def test_harels_async_store_contracts_hold_on_the_event_path(edge, contract):
    async def main():
        async with event_path(edge.settings()) as (_transport, store):
            await contract(store)

    asyncio.run(main())


def test_claim_many_leases_the_heads_of_distinct_groups_in_one_statement(edge):
    async def main():
        async with event_path(edge.settings()) as (transport, _store):
            for g in range(5):
                for i in range(3):
                    await transport.publish(f"g{g}", Event(kind=f"e{i}"))
            before = transport.path.executor.exchanges
            leases = await transport.claim_many("w", 30, 4)
            assert transport.path.executor.exchanges == before + 1, "one unit of work, one exchange"
            assert len(leases) == 4 and len({lease.group_id for lease in leases}) == 4
            assert all(lease.event.kind == "e0" for lease in leases), "only each group's head"
            rest = await transport.claim_many("w", 30, 10)
            assert [lease.group_id for lease in rest] == [g for g in ("g0", "g1", "g2", "g3", "g4") if g not in {x.group_id for x in leases}]
            assert await transport.claim_many("w", 30, 10) == [], "every group has one in flight"
            assert await transport.ack_many([*leases, *rest]) == [True] * 5
            again = await transport.claim_many("w", 30, 10)
            assert sorted(lease.event.kind for lease in again) == ["e1"] * 5

    asyncio.run(main())


def test_a_publish_on_the_event_path_whose_answer_was_lost_is_delivered_once(edge, monkeypatch):
    async def main():
        async with event_path(edge.settings(retry_initial_delay=0.01)) as (transport, _store):
            executor, event, delivered = transport.path.executor, Event(kind="once"), []
            send = executor.execute

            async def applied_then_lost(stmt, **how):
                result = await send(stmt, **how)
                if stmt.sql.startswith("INSERT") and not delivered:  # landed; consumed in the back-off
                    lease = await transport.claim("consumer", 30)
                    delivered.append(lease.event.id)
                    await transport.ack(lease)
                    raise ConnectionResetError("connection reset: the answer was lost on the way back")
                return result

            monkeypatch.setattr(executor, "execute", applied_then_lost)
            await transport.publish("G", event)
            monkeypatch.undo()
            while (lease := await transport.claim("consumer", 30)) is not None:
                delivered.append(lease.event.id)
                await transport.ack(lease)
            assert delivered == [event.id], "the retry found its publish landed and sent nothing again"

    asyncio.run(main())


def test_a_commit_carries_the_ack_of_the_event_it_marks_processed(edge):
    async def main():
        async with event_path(edge.settings()) as (transport, store):
            exe = Execution(id="x", definition_id="d")
            await store.save(exe)
            await transport.publish("x", Event(kind="go"))
            lease = await transport.claim("w", 30)
            loaded, processed = await store.load_for_event("x", lease.event.id)
            assert loaded is not None and loaded.version == 1 and processed is False
            before = transport.path.executor.exchanges
            await store.commit(loaded, [], processed_event_id=lease.event.id)
            assert await transport.ack(lease) is True
            assert transport.path.executor.exchanges == before + 1, "the ack went out with the commit"
            assert await transport.depth() == 0
            assert (await store.load("x")).version == 2
            assert await store.is_processed("x", lease.event.id)

    asyncio.run(main())


def test_a_stale_commit_raises_store_conflict_and_changes_nothing(edge):
    async def main():
        async with event_path(edge.settings()) as (transport, store):
            exe = Execution(id="x", definition_id="d")
            await store.save(exe)
            stale = exe.model_copy()
            await store.commit(exe, [], processed_event_id="e1")
            await transport.publish("x", Event(kind="go"))
            lease = await transport.claim("w", 30)
            with pytest.raises(StoreConflict):
                await store.commit(stale, [(None, Event(kind="out"))], processed_event_id=lease.event.id)
            assert stale.version == 1, "a failed commit leaves the version as it was"
            assert await store.pending_outbox() == [] or all(
                e.event.kind != "out" for e in await store.pending_outbox()
            )
            assert await transport.depth() == 1, "the message was not acked by the failed commit"
            assert await transport.nack(lease) is True

    asyncio.run(main())


def test_a_commit_whose_lease_was_lost_keeps_the_message_for_its_new_holder(edge):
    async def main():
        now = [1000.0]
        settings = edge.settings()
        async with (
            event_path(settings, clock=lambda: now[0]) as (first, store),
            event_path(edge.peer(settings), clock=lambda: now[0]) as (second, second_store),
        ):
            exe = Execution(id="x", definition_id="d")
            await store.save(exe)
            await first.publish("x", Event(kind="go"))
            lease = await first.claim("w1", 5)
            now[0] += 10  # the lease lapsed
            other = await second.claim("w2", 5)
            assert other is not None and other.seq == lease.seq
            loaded, _ = await store.load_for_event("x", lease.event.id)
            await store.commit(loaded, [], processed_event_id=lease.event.id)
            assert await first.ack(lease) is False, "a lapsed lease is never acked as held"
            assert await first.depth() == 1
            _, processed = await second_store.load_for_event("x", other.event.id)
            assert processed is True, "the new holder sees the event applied, and only acks it"
            assert await second.ack(other) is True

    asyncio.run(main())


def test_the_workers_claim_brings_each_execution_so_loading_it_costs_no_round_trip(edge):
    async def main():
        async with event_path(edge.settings(), concurrency=8, prefetch=True) as (transport, store):
            for g in range(3):
                await store.save(Execution(id=f"x{g}", definition_id="d"))
                await transport.publish(f"x{g}", Event(kind="go"))
            before = transport.path.executor.exchanges
            leases = [await transport.claim("w", 30) for _ in range(3)]
            assert transport.path.executor.exchanges == before + 1, "one claim statement leased all three"
            for lease in leases:
                loaded, processed = await store.load_for_event(lease.group_id, lease.event.id)
                assert loaded is not None and loaded.id == lease.group_id and processed is False
            assert transport.path.executor.exchanges == before + 1, "the executions came with the claim"
            assert await transport.release_held() == 3, "leases not yet handled are given back at shutdown"
            assert await transport.depth() == 3

    asyncio.run(main())


@pytest.mark.parametrize("max_run", [1, 128])
def test_the_workers_commit_carries_the_next_claim_and_a_groups_queued_events_share_one_commit(edge, max_run):
    """On every profile, to a primary: with runs of one, one exchange an event; with longer runs,
    the group's four queued events are handled as one run and cost one exchange together."""
    from pathlib import Path  # noqa: PLC0415

    import harel_edge.examples.actions as actions  # noqa: PLC0415
    from harel_edge.worker import load_definitions, statechart_worker  # noqa: PLC0415

    settings = edge.settings(max_run=max_run)
    migrate(settings)
    definitions = load_definitions(str(Path(actions.__file__).parent))

    async def main():
        executor = open_executor(settings)
        try:
            worker = statechart_worker(executor, settings, definitions)
            assert worker.store.events is worker.transport, "the store's commits go through the worker's transport"
            await worker.store.save(Execution(id="order", definition_id="order"))
            for kind, data in (("Start", {}), ("Pay", {"amount": 3.0}), ("Ship", {}), ("Deliver", {})):
                await worker.transport.publish("order", Event(kind=kind, data=data))
            assert await worker.step() is True  # the first claim is an exchange of its own
            before, steps = executor.exchanges, 1
            while await worker.step():
                steps += 1
            if max_run == 1:
                # Each commit carried its ack and the claim of the group's next event; the last found none.
                assert steps == 4
                assert executor.exchanges - before == 3 + 1
            else:
                # One run: its one commit carried the four events, their acks and a claim that found none.
                assert steps == 1
                assert executor.exchanges - before == 1
            assert await worker.transport.depth() == 0
            assert (await worker.store.load("order")).active_path == "Delivered"
        finally:
            await executor.aclose()

    asyncio.run(main())


async def seed_groups(transport: EventTransport, store, kinds: tuple[str, ...]) -> None:
    """Eight groups of `kinds` each, for a prefetching transport whose commits carry claims."""
    for group in "abcdefgh":
        await store.save(Execution(id=group, definition_id="d"))
        for kind in kinds:
            await transport.publish(group, Event(kind=kind))


async def finish(transport: EventTransport, store, lease) -> None:
    """What the worker does with a lease: commit its execution with the event processed, ack it."""
    exe, _ = await store.load_for_event(lease.group_id, lease.event.id)
    await store.commit(exe, [], processed_event_id=lease.event.id)
    assert await transport.ack(lease) is True


def test_commits_in_flight_together_claim_no_more_than_the_slots_they_free(edge):
    async def main():
        async with event_path(edge.settings(), concurrency=3, prefetch=True) as (transport, store):
            await seed_groups(transport, store, ("one", "two"))
            leases = [await transport.claim("w", 30) for _ in range(3)]
            assert transport.buffered == 0 and len(transport.held) == 3
            await asyncio.gather(*(finish(transport, store, lease) for lease in leases))
            assert len(transport.held) == 3, "three acks freed three slots, and the claims took three"
            assert transport.buffered == 3

    asyncio.run(main())


def test_a_commit_carries_the_claim_of_the_slot_it_frees_while_leases_still_wait_in_the_buffer(edge):
    """Far from the primary, a claim that waited for the buffer to empty would idle the link."""

    async def main():
        async with event_path(edge.settings(), concurrency=4, prefetch=True) as (transport, store):
            await seed_groups(transport, store, ("one",))
            lease = await transport.claim("w", 30)
            assert transport.buffered == 3 and len(transport.held) == 4
            await finish(transport, store, lease)
            assert transport.buffered == 4, "the commit's claim took the slot its ack freed"
            assert len(transport.held) == 4
            assert await transport.depth() == 7

    asyncio.run(main())


def test_a_claim_with_nothing_buffered_takes_the_lease_a_commits_claim_brings_instead_of_claiming_alone(edge):
    """Far from the primary a claim of its own would hold up the worker's next launch for a
    round trip, while the commit's claim brought leases that then wait in the buffer."""

    async def main():
        async with event_path(edge.settings(), concurrency=1, prefetch=True) as (transport, store):
            await seed_groups(transport, store, ("one",))
            lease = await transport.claim("w", 30)
            committing = asyncio.ensure_future(finish(transport, store, lease))
            claiming = asyncio.ensure_future(transport.claim("w", 30))
            await committing
            second = await claiming
            assert second is not None and second.group_id != lease.group_id
            assert transport.buffered == 0, "the claim took the lease the commit's claim brought"
            assert list(transport.held.values()) == [second], "and claimed nothing of its own"
            assert await transport.depth() == 7

    asyncio.run(main())
