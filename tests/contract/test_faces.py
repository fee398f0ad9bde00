"""The sync face and the async core are one queue: the same operations leave the same rows."""

from __future__ import annotations

import asyncio
import threading

from harel.spec.states import Event

from harel_edge import AsyncLibsqlTransport, LibsqlTransport
from harel_edge.schema import dead_letters_table


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows_of(execute, prefix: str) -> dict[str, list[tuple]]:
    """What a user can see of the queue: its messages with their counts, dead letters, window."""
    return {
        "messages": execute(
            f"SELECT group_id, json_extract(event, '$.kind'), deliveries, last_error, locked_by IS NULL"
            f" FROM {prefix}_transport_messages ORDER BY seq"
        ),
        "dead": execute(
            f"SELECT group_id, json_extract(event, '$.kind'), attempts, last_error FROM {dead_letters_table(prefix)} ORDER BY id"
        ),
        "published": execute(f"SELECT group_id, event_id FROM {prefix}_transport_published ORDER BY group_id, event_id"),
    }


EVENTS = {name: Event(kind=name) for name in ("a1", "a2", "b1", "c1")}


def script_sync(t: LibsqlTransport, clock: Clock) -> list:
    """Give-backs, a failure, a park, a dead letter, a duplicate publish; every answer returned."""
    answers = [t.publish_many([("a", EVENTS["a1"]), ("a", EVENTS["a2"]), ("b", EVENTS["b1"]), ("c", EVENTS["c1"])])]
    t.publish("a", EVENTS["a1"])  # within the window: not queued again
    for _ in range(3):  # clean give-backs do not count toward dead-lettering
        lease = t.claim("w", 30, routing_keys=())
        answers += [lease.group_id, t.deliveries(lease), t.nack(lease)]
    lease = t.claim("w", 30)
    t.failed(lease, RuntimeError("boom"))
    answers += [lease.group_id, t.nack(lease, delay=5)]
    clock.now += 6
    leases = t.claim_many("w", 30, 3)
    answers += [[x.group_id for x in leases], t.ack_many(leases[:1])]
    t.failed(leases[1], "bad data")
    answers += [t.nack(leases[1]), t.bury(leases[2]), t.depth()]
    return answers


async def script_async(t: AsyncLibsqlTransport, clock: Clock) -> list:
    answers = [await t.publish_many([("a", EVENTS["a1"]), ("a", EVENTS["a2"]), ("b", EVENTS["b1"]), ("c", EVENTS["c1"])])]
    await t.publish("a", EVENTS["a1"])
    for _ in range(3):
        lease = await t.claim("w", 30, routing_keys=())
        answers += [lease.group_id, t.deliveries(lease), await t.nack(lease)]
    lease = await t.claim("w", 30)
    t.failed(lease, RuntimeError("boom"))
    answers += [lease.group_id, await t.nack(lease, delay=5)]
    clock.now += 6
    leases = await t.claim_many("w", 30, 3)
    answers += [[x.group_id for x in leases], await t.ack_many(leases[:1])]
    t.failed(leases[1], "bad data")
    answers += [await t.nack(leases[1]), await t.bury(leases[2]), await t.depth()]
    return answers


def test_the_sync_and_async_faces_give_the_same_answers_and_leave_the_same_rows(edge):
    sync_clock, async_clock = Clock(), Clock()
    sync_settings, async_settings = edge.settings(), edge.settings()
    with LibsqlTransport(settings=sync_settings, clock=sync_clock) as t:
        sync_answers = script_sync(t, sync_clock)
        sync_rows = rows_of(t.execute, sync_settings.prefix)

    async def run() -> tuple[list, dict]:
        t = await AsyncLibsqlTransport.from_settings(async_settings, async_clock)
        try:
            answers = await script_async(t, async_clock)
            rows = {}
            for name, found in rows_of(lambda sql: sql, async_settings.prefix).items():
                rows[name] = await t.execute(found)
            return answers, rows
        finally:
            await t.close()

    async_answers, async_rows = asyncio.run(run())
    assert sync_answers == async_answers
    assert sync_rows == async_rows
    messages = {(group, kind): (deliveries, error) for group, kind, deliveries, error, _free in sync_rows["messages"]}
    assert messages[("a", "a2")] == (0, None), "a message never claimed has no deliveries"
    assert any(error == "bad data" for _d, error in messages.values()), "a failed delivery keeps its error"
    assert len(sync_rows["dead"]) == 1 and len(sync_rows["published"]) == 4


def test_one_sync_transport_is_safe_to_share_between_threads(make_transport):
    t = make_transport(Clock())
    t.publish_many([(f"g{i}", Event(kind="go")) for i in range(40)])
    acked: list[str] = []
    lock = threading.Lock()

    def drain() -> None:
        while (lease := t.claim("w", 30)) is not None:
            assert t.ack(lease)
            with lock:
                acked.append(lease.group_id)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(acked) == sorted(f"g{i}" for i in range(40)), "every message acked once, by one thread"
    assert t.depth() == 0
