"""The transport on every profile: harel's own contract, then what harel_edge adds."""

from __future__ import annotations

import asyncio

import pytest
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract, assert_transport_contract

from harel_edge import AsyncLibsqlTransport, LibsqlTransport, Message
from harel_edge.schema import DB_NOW


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def kinds(transport, worker="w", **claim):
    """Drain what is claimable now, acking each, and return the event kinds in claim order."""
    out = []
    while (lease := transport.claim(worker, 30, **claim)) is not None:
        out.append(lease.event.kind)
        transport.ack(lease)
    return out


def test_harels_transport_contract_holds(make_transport):
    assert_transport_contract(lambda clock: make_transport(clock))


def test_harels_async_transport_contract_holds(edge):
    made = []

    async def make(clock):
        transport = await AsyncLibsqlTransport.from_settings(edge.settings(), clock)
        made.append(transport)
        return transport

    asyncio.run(assert_async_transport_contract(make))
    assert len(made) >= 7, "the contract built a fresh transport for each of its checks"


def test_the_database_clock_is_used_when_no_clock_is_injected(make_transport):
    t = make_transport()
    t.publish("G", Event(kind="e1"))
    lease = t.claim("w", 30)
    assert lease is not None
    # Whole milliseconds: both clocks are exact to the millisecond, so only their difference in
    # ms is meaningful (a float subtraction of two epoch values can be off by 1e-7 s).
    (remaining_ms,), = t.execute(
        f"SELECT CAST(round((lock_expiry - unixepoch('subsec')) * 1000) AS INTEGER)"
        f" FROM {t.settings.prefix}_transport_messages"
    )
    assert 25_000 < remaining_ms <= 30_000, "the lease deadline is the database's now plus the visibility"


def test_the_database_clock_is_exact_to_the_millisecond_like_unixepoch(make_transport):
    t = make_transport()
    for _ in range(200):
        (ours, sqlite_own, below_ms), = t.execute(
            f"SELECT {DB_NOW}, unixepoch('subsec'), {DB_NOW} * 1000 - round({DB_NOW} * 1000)"
        )
        assert ours == sqlite_own, "one statement's 'now' is the same instant whichever function asks"
        assert below_ms == 0, "no float noise below the millisecond"


def test_a_claim_with_routing_keys_only_takes_groups_with_those_keys(make_transport):
    t = make_transport(Clock())
    t.publish("eu-1", Event(kind="eu"), routing_key="eu")
    t.publish("us-1", Event(kind="us"), routing_key="us")
    t.publish("any-1", Event(kind="unrouted"))
    assert kinds(t, routing_keys=["us"]) == ["us"]
    assert kinds(t, routing_keys=["eu", "ap"]) == ["eu"]
    assert kinds(t) == ["unrouted"], "a claim without keys takes any group, unrouted ones included"


def test_a_groups_first_publish_fixes_its_routing_key_and_priority(make_transport):
    t = make_transport(Clock())
    t.publish("G", Event(kind="first"), priority=3, routing_key="eu")
    t.publish("G", Event(kind="second"), priority=0, routing_key="us")
    assert kinds(t, routing_keys=["us"]) == []
    assert kinds(t, routing_keys=["eu"], min_priority=3) == ["first", "second"]


def test_routing_keys_from_the_settings_are_the_default_for_claims(make_transport):
    t = make_transport(Clock(), routing_keys=("edge-a",))
    t.publish("a", Event(kind="a"), routing_key="edge-a")
    t.publish("b", Event(kind="b"), routing_key="edge-b")
    assert kinds(t) == ["a"]
    assert kinds(t, routing_keys=()) == ["b"], "an explicit empty list claims any group"


def test_the_priority_floor_skips_lower_groups_but_keeps_their_messages(make_transport):
    t = make_transport(Clock())
    for p in range(5):
        t.publish(f"p{p}", Event(kind=f"k{p}"), priority=p)
    assert sorted(kinds(t, min_priority=3)) == ["k3", "k4"]
    assert sorted(kinds(t)) == ["k0", "k1", "k2"]


def test_a_parked_message_blocks_its_group_until_the_delay_passes(make_transport):
    clock = Clock()
    t = make_transport(clock)
    t.publish("G", Event(kind="g1"))
    t.publish("G", Event(kind="g2"))
    t.publish("H", Event(kind="h1"))
    lease = t.claim("w", 30)
    assert lease.event.kind == "g1"
    assert t.nack(lease, delay=10) is True
    assert kinds(t) == ["h1"], "the parked group yields nothing, another group proceeds"
    clock.now += 11
    assert kinds(t) == ["g1", "g2"], "after the delay the parked message comes back first"


def test_a_group_served_once_with_a_long_visibility_is_not_starved_by_busy_groups(make_transport):
    clock = Clock()
    t = make_transport(clock)
    for i in range(4):
        for group in ("long", "busy-1", "busy-2"):
            t.publish(group, Event(kind=f"{group}:{i}"))
    lease = t.claim("slow-worker", 300)  # a worker with a long visibility serves it once
    assert lease.group_id == "long"
    t.ack(lease)
    served = []
    for _ in range(3):
        clock.now += 1
        lease = t.claim("fast-worker", 5)
        served.append(lease.group_id)
        t.ack(lease)
    assert served == ["busy-1", "busy-2", "long"], "its next message comes round in turn, by claim time"


def test_a_park_does_not_move_its_group_back_in_the_round_robin(make_transport):
    clock = Clock()
    t = make_transport(clock)
    for group in ("parked", "other"):
        t.publish(group, Event(kind=f"{group}:1"))
        t.publish(group, Event(kind=f"{group}:2"))
    parked = t.claim("w", 5)
    assert parked.group_id == "parked"
    assert t.nack(parked, delay=10) is True  # claimed at 1000, parked until 1010
    clock.now += 1
    other = t.claim("w", 5)
    assert other.group_id == "other"
    t.ack(other)  # claimed at 1001
    clock.now += 20
    assert t.claim("w", 5).group_id == "parked", "its last claim (1000) is older than the other's (1001)"


def test_a_lapsed_lease_is_claimable_and_its_old_holder_can_no_longer_ack(make_transport):
    clock = Clock()
    t = make_transport(clock)
    t.publish("G", Event(kind="e1"))
    t.publish("G", Event(kind="e2"))
    old = t.claim("w1", 10)
    clock.now += 11
    new = t.claim("w2", 10)
    assert new is not None and new.seq == old.seq, "the same head is delivered again"
    assert t.ack(old) is False, "the lapsed holder's ack is refused: the message is another's now"
    assert t.nack(old) is False
    assert t.ack(new) is True
    assert kinds(t) == ["e2"], "nothing was lost by the refused ack"


def test_a_lapsed_lease_that_nobody_took_can_still_be_acked_by_its_holder(make_transport):
    clock = Clock()
    t = make_transport(clock)
    t.publish("G", Event(kind="e1"))
    lease = t.claim("w1", 10)
    clock.now += 60
    assert t.ack(lease) is True
    assert t.depth() == 0


def test_ack_is_idempotent(make_transport):
    t = make_transport(Clock())
    t.publish("G", Event(kind="e1"))
    t.publish("G", Event(kind="e2"))
    lease = t.claim("w", 30)
    assert t.ack(lease) is True
    assert t.ack(lease) is False, "a second ack finds nothing and removes nothing else"
    assert kinds(t) == ["e2"]


def test_an_acked_groups_row_is_dropped_once_its_last_message_goes(make_transport):
    t = make_transport(Clock())
    t.publish("G", Event(kind="e1"), priority=4)
    t.ack(t.claim("w", 30))
    (count,), = t.execute(f"SELECT count(*) FROM {t.settings.prefix}_transport_groups")
    assert count == 0
    t.publish("G", Event(kind="e2"), priority=1)
    assert kinds(t, min_priority=2) == [], "a recycled group takes the priority of its new first publish"
    assert kinds(t, min_priority=1) == ["e2"]


def test_prefixes_isolate_two_queues_in_one_database(edge):
    first = LibsqlTransport(settings=edge.settings(prefix="alpha"), clock=Clock())
    second = LibsqlTransport(settings=edge.settings(prefix="beta"), clock=Clock())
    try:
        # Same database for both (the settings differ only by prefix on sqld; locally the file).
        if edge.profile == "local":
            second.close()
            second = LibsqlTransport(settings=first.settings.model_copy(update={"prefix": "beta"}), clock=Clock())
        first.publish("G", Event(kind="alpha"))
        second.publish("G", Event(kind="beta"))
        assert kinds(first) == ["alpha"]
        assert kinds(second) == ["beta"]
    finally:
        first.close()
        second.close()


def test_a_publish_whose_answer_was_lost_is_delivered_once_though_consumed_before_the_retry(
    edge, make_transport, monkeypatch
):
    clock = Clock()
    t = make_transport(clock, retry_initial_delay=0.01)
    consumer = LibsqlTransport(settings=edge.peer(t.settings), clock=clock, create_schema=False)
    event, delivered = Event(kind="once"), []
    executor = t.core.path.executor
    send = executor.execute

    async def applied_then_lost(stmt, **kwargs):
        result = await send(stmt, **kwargs)
        if stmt.sql.startswith("INSERT") and not delivered:  # the publish landed; during the back-off
            lease = consumer.claim("consumer", 30)  # another worker handles it (its own loop thread)
            delivered.append(lease.event.id)
            consumer.ack(lease)
            raise ConnectionResetError("connection reset: the answer was lost on the way back")
        return result

    try:
        monkeypatch.setattr(executor, "execute", applied_then_lost)
        t.publish("G", event)
        monkeypatch.undo()
        while (lease := consumer.claim("consumer", 30)) is not None:
            delivered.append(lease.event.id)
            consumer.ack(lease)
    finally:
        consumer.close()
    assert delivered == [event.id], "the retry found its publish landed and sent nothing again"
    assert t.depth() == 0


def test_an_event_sent_to_its_group_again_within_the_window_is_queued_once(make_transport):
    clock = Clock()
    t = make_transport(clock, publish_window=3600)
    event = Event(kind="e")
    t.publish("G", event)
    assert kinds(t) == ["e"]
    clock.now += 3599
    t.publish("G", event)
    assert t.publish_many([Message("G", event), Message("G", Event(kind="new"))]) == 1, "it says how many it queued"
    assert kinds(t) == ["new"], "the same id within the window is not queued again; the batch's others are"
    t.publish("H", event)
    assert kinds(t) == ["e"], "the window is per group: the event sent to another group is queued"
    clock.now += 1
    t.publish("G", event)
    assert kinds(t) == ["e"], "after the window, the id is forgotten and queued again"
    (count,), = t.execute(f"SELECT count(*) FROM {t.settings.prefix}_transport_published")
    assert count == 3, "every id sent is kept once per group until its window ends"


def test_a_batch_publish_keeps_order_across_chunks_and_groups(make_transport, monkeypatch):
    import harel_edge.queue.messages as transport_module

    monkeypatch.setattr(transport_module, "BATCH_ROWS", 20)  # 121 messages: 7 statements
    t = make_transport(Clock())
    batch = [Message(f"g{i % 3}", Event(kind=f"{i % 3}:{i}"), priority=i % 3) for i in range(121)]
    assert t.publish_many([*batch, batch[0]]) == 121, "the id given twice is queued once, and counted once"
    assert t.depth() == 121
    seen: dict[str, list[int]] = {}
    while leases := t.claim_many("w", 30, 3):  # each group's head in turn
        for lease in leases:
            group, number = lease.event.kind.split(":")
            seen.setdefault(group, []).append(int(number))
        assert all(t.ack_many(leases))
    assert {g: len(v) for g, v in seen.items()} == {"0": 41, "1": 40, "2": 40}
    assert all(v == sorted(v) for v in seen.values()), "FIFO within each group"


def test_a_batch_larger_than_one_statement_is_published_in_one_transaction(make_transport, monkeypatch):
    import harel_edge.queue.messages as transport_module

    monkeypatch.setattr(transport_module, "BATCH_ROWS", 7)  # 50 messages: 8 statements
    t = make_transport(Clock())
    assert t.publish_many(Message(f"g{i % 2}", Event(kind=f"{i}")) for i in range(50)) == 50
    assert t.depth() == 50
    assert [t.claim("w", 30).event.kind for _ in range(2)] == ["0", "1"], "each group's head is its first"


def test_a_batch_publish_accepts_plain_tuples(make_transport):
    t = make_transport(Clock())
    assert t.publish_many([("G", Event(kind="a")), ("H", Event(kind="b"), 2, "eu")]) == 2
    assert kinds(t, routing_keys=["eu"], min_priority=2) == ["b"]


def test_a_bad_message_in_a_batch_is_refused_before_anything_is_written(make_transport):
    t = make_transport(Clock())
    with pytest.raises(ValueError, match="priority must be a whole number from 0 to 4"):
        t.publish_many([("G", Event(kind="a")), ("G", Event(kind="b"), 9)])
    assert t.depth() == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: t.publish("G", Event(kind="x"), priority=-1), "priority must be"),
        (lambda t: t.publish("", Event(kind="x")), "group_id must be a non-empty string"),
        (lambda t: t.publish("G", {"kind": "x"}), "event must be a harel Event"),
        (lambda t: t.claim("w", 0), "visibility must be a positive"),
        (lambda t: t.claim("w#1", 30), "worker_id must be"),
    ],
)
def test_bad_arguments_get_a_clear_error(make_transport, call, message):
    t = make_transport(Clock())
    with pytest.raises((ValueError, TypeError), match=message):
        call(t)


def test_two_workers_never_hold_the_same_group(edge, make_transport):
    first = make_transport(Clock())
    second = LibsqlTransport(settings=edge.peer(first.settings), clock=first.clock, create_schema=False)
    try:
        for i in range(4):
            first.publish(f"G{i % 2}", Event(kind=f"e{i}"))
        a = first.claim("w1", 30)
        b = second.claim("w2", 30)
        assert a is not None and b is not None
        assert a.group_id != b.group_id, "the second worker got the other group"
        assert first.claim("w1", 30) is None and second.claim("w2", 30) is None
    finally:
        second.close()


def test_claim_many_gives_every_tied_group_its_turn_equally(make_transport):
    t = make_transport(Clock())
    counts = {f"g{i}": 0 for i in range(8)}
    for group in counts:
        t.publish_many([(group, Event(kind=f"{group}-{n}")) for n in range(30)])
    for _ in range(60):
        leases = t.claim_many("w", 30, 3)
        assert len(leases) == 3
        for lease in leases:
            counts[lease.group_id] += 1
        assert all(t.ack_many(leases))
    assert max(counts.values()) - min(counts.values()) <= 1, f"round-robin across a batch's ties: {counts}"


def test_a_claim_takes_any_number_of_routing_keys(make_transport):
    t = make_transport(Clock())
    keys = [f"tenant-{i}" for i in range(40_000)]
    t.publish("last", Event(kind="wanted"), routing_key=keys[-1])
    t.publish("other", Event(kind="unwanted"), routing_key="not-listed")
    lease = t.claim("w", 30, routing_keys=keys)
    assert lease is not None and lease.event.kind == "wanted"
    assert t.claim("w", 30, routing_keys=keys[:1200]) is None, "a group whose key is not listed is not taken"
