"""Flow control on every profile: delayed publish and per-key concurrency and rate limits, each
decided inside the claim statement on the primary, with time moved by hand (an injected clock)."""

from __future__ import annotations

import contextlib
import time

from harel.spec.states import Event

from harel_edge import LibsqlTransport, limits
from harel_edge.access import Statements, primary_settings
from harel_edge.testing import spawned
from harel_edge.testing.spawned import answers

VISIBILITY = 30.0


@contextlib.contextmanager
def on_primary(settings, transport):
    """Statements decided on the primary: a local file's own transport, else the primary over Hrana
    (a replica's own file may lag it)."""
    if settings.profile == "local":
        yield transport.execute
        return
    primary = Statements(primary_settings(settings))
    try:
        yield primary.execute
    finally:
        primary.close()


def kinds(leases) -> list[str]:
    return sorted(lease.event.kind for lease in leases)


def test_a_delayed_head_holds_its_group_back_and_is_claimed_after_its_time(make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    t.publish("g", Event(kind="later"), delay=10)
    t.publish("g", Event(kind="after-it"))
    t.publish("h", Event(kind="now"))
    t.publish("k", Event(kind="at-1005"), at=1005.0)
    assert kinds(t.claim_many("w", VISIBILITY, 10)) == ["now"], "nothing of g or k before its time"
    now[0] = 1005.5
    assert kinds(t.claim_many("w", VISIBILITY, 10)) == ["at-1005"]
    now[0] = 1010.5
    lease = t.claim("w", VISIBILITY)
    assert lease is not None and lease.event.kind == "later", "the delayed head first: FIFO holds"
    assert t.claim("w", VISIBILITY) is None, "its group has one in flight"
    assert t.ack(lease)
    assert kinds([t.claim("w", VISIBILITY)]) == ["after-it"]


def test_a_delayed_message_that_becomes_its_groups_head_still_waits_for_its_time(make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    t.publish("g", Event(kind="first"))
    t.publish("g", Event(kind="second"), delay=20)
    first = t.claim("w", VISIBILITY)
    assert first is not None and first.event.kind == "first"
    assert t.ack(first)
    now[0] = 1019.0
    assert t.claim("w", VISIBILITY) is None, "second is not due before 1020 by the clock the claim uses"
    now[0] = 1020.5
    assert kinds([t.claim("w", VISIBILITY)]) == ["second"]


def _claim_in_a_process(settings, barrier, results) -> None:
    """One worker process: claim three times at once with the others, report what it leased."""
    transport = LibsqlTransport(settings=settings)
    try:
        barrier.wait(timeout=60)
        got = []
        for _ in range(3):
            got += [lease.group_id for lease in transport.claim_many("w", 120, 10)]
        results.put(got)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        results.put(repr(exc))
    finally:
        transport.close()


def test_a_concurrency_limit_of_2_holds_with_several_transports_claiming_at_once(edge):
    t = LibsqlTransport(settings=edge.settings())
    with contextlib.closing(t), on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "tenant", concurrency=2)
        t.publish_many(
            [
                *((f"t{i}", Event(kind=f"t{i}"), 0, None, "tenant") for i in range(20)),
                *((f"o{i}", Event(kind=f"o{i}"), 0, None, "other") for i in range(5)),
            ]
        )
        ctx = spawned.context()
        barrier, results = ctx.Barrier(3), ctx.Queue()
        arguments = [(edge.peer(t.settings), barrier, results) for _ in range(3)]
        claimed = answers(ctx, _claim_in_a_process, arguments, results, timeout=120)
        assert all(isinstance(got, list) for got in claimed), claimed
        leased = [group for got in claimed for group in got]
        tenant = [group for group in leased if group.startswith("t")]
        assert len(tenant) == 2, f"two of the tenant's messages in flight, not {tenant}"
        assert sorted(group for group in leased if group.startswith("o")) == [f"o{i}" for i in range(5)], (
            "the other key is not held back"
        )
        (limit,) = limits.list_limits(execute, t.settings.prefix)
        assert (limit.key, limit.concurrency, limit.in_flight) == ("tenant", 2, 2), "counted on the primary"
        assert limit.waiting == 18, "the rest of the tenant's groups wait because of the limit"


HOT_GROUPS, EACH = 20, 3  # the limited key's groups, and the messages in each


def _drain_and_time(settings, barrier, results) -> None:
    """One worker process: claim, handle (a few milliseconds of work), ack, until nothing is left;
    report each handled message with its handler's entry and exit on the machine's monotonic clock."""
    transport = LibsqlTransport(settings=settings)
    try:
        barrier.wait(timeout=60)
        handled, idle, deadline = [], 0, time.monotonic() + 90  # a hang guard, not a measurement
        while idle < 3 and time.monotonic() < deadline:
            lease = transport.claim("w", VISIBILITY)
            if lease is None:
                idle = idle + 1 if transport.depth() == 0 else 0
                time.sleep(0.02)  # polling pace while the others finish; no verdict rests on it
                continue
            entered = time.monotonic()
            time.sleep(0.005)  # the handler's work
            handled.append((lease.group_id, lease.event.kind, entered, time.monotonic()))
            assert transport.ack(lease), f"the lease of {lease.group_id} held until its ack"
        results.put(handled)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        results.put(repr(exc))
    finally:
        transport.close()


def most_at_once(spans) -> int:
    """The largest number of (entry, exit) spans open at one instant."""
    edges = sorted([(entered, 1) for entered, _ in spans] + [(left, -1) for _, left in spans])
    open_, most = 0, 0
    for _, step in edges:
        open_ += step
        most = max(most, open_)
    return most


def test_three_processes_draining_run_at_most_2_of_a_limited_key_at_once_and_every_message_once_in_order(edge):
    t = LibsqlTransport(settings=edge.settings())
    with contextlib.closing(t), on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "tenant", concurrency=2)
        hot = [(f"t{g}", Event(kind=f"t{g}.{i}"), 0, None, "tenant") for i in range(EACH) for g in range(HOT_GROUPS)]
        other = [(f"o{g}", Event(kind=f"o{g}.{i}"), 0, None, "other") for i in range(EACH) for g in range(10)]
        t.publish_many(hot + other)
        ctx = spawned.context()
        barrier, results = ctx.Barrier(3), ctx.Queue()
        arguments = [(edge.peer(t.settings), barrier, results) for _ in range(3)]
        reports = answers(ctx, _drain_and_time, arguments, results, timeout=180)
        assert all(isinstance(report, list) for report in reports), reports
        handled = [row for report in reports for row in report]
        kinds_handled = sorted(kind for _, kind, _, _ in handled)
        assert kinds_handled == sorted(message[1].kind for message in hot + other), "every message handled once"
        tenant = [(entered, left) for group, _, entered, left in handled if group.startswith("t")]
        assert most_at_once(tenant) <= 2, "never more than 2 of the limited key's handlers at once"
        for group in {group for group, *_ in handled}:
            mine = sorted((entered, kind) for g, kind, entered, _ in handled if g == group)
            assert [kind for _, kind in mine] == [f"{group}.{i}" for i in range(EACH)], f"{group} in order"
        assert limits.list_limits(execute, t.settings.prefix)[0].in_flight == 0, "every slot given back"


def test_a_lapsed_lease_frees_its_slot(edge, make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    with on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "k", concurrency=1)
        for group in ("a", "b"):
            t.publish(group, Event(kind=group), limit_key="k")
        held = t.claim("w", 10)
        assert held is not None
        assert t.claim("w", 10) is None, "the key's one slot is taken"
        now[0] = 1011.0  # the lease has lapsed, unacked (its worker died)
        assert limits.list_limits(execute, t.settings.prefix, now=now[0])[0].in_flight == 0
        again = t.claim("w", 10)
        assert again is not None, "the lapsed lease's slot is free"
        assert t.claim("w", 10) is None, "and only the one"


def test_a_rate_limit_admits_n_per_period_then_none_until_the_period_passes(edge, make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    with on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "api", rate=3, period=10.0)
        t.publish_many((f"g{i}", Event(kind=f"e{i}"), 0, "api") for i in range(10))
        first = t.claim_many("w", VISIBILITY, 10)
        assert len(first) == 3, "three claims in the period, in one claim_many"
        assert t.ack_many(first) == [True] * 3
        now[0] = 1009.0
        assert t.claim_many("w", VISIBILITY, 10) == [], "none more until the period has passed"
        assert limits.list_limits(execute, t.settings.prefix, now=now[0])[0].claims_in_period == 3
        now[0] = 1010.5
        one_by_one = [t.claim("w", VISIBILITY) for _ in range(4)]
        assert [lease is not None for lease in one_by_one] == [True, True, True, False]


def test_a_limited_key_does_not_starve_an_unlimited_one_and_gets_its_share_when_its_slot_frees(edge, make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    with on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "busy", concurrency=1)
    # The busy key's groups come first in round-robin order: they were published first.
    t.publish_many((f"b{i}", Event(kind=f"b{i}"), 0, "busy") for i in range(20))
    t.publish_many((f"f{i}", Event(kind=f"f{i}"), 0, "free") for i in range(6))
    # A claim_many takes no more of a key than its room: one of busy's twenty groups.
    first = t.claim_many("w", VISIBILITY, 3)
    assert [lease.group_id for lease in first] == ["b0"]
    # With busy at its limit, the claims skip its groups and take the next eligible ones.
    assert [lease.group_id for lease in t.claim_many("w", VISIBILITY, 3)] == ["f0", "f1", "f2"]
    rest = [t.claim("w", VISIBILITY) for _ in range(4)]
    assert [lease.group_id if lease else None for lease in rest] == ["f3", "f4", "f5", None]
    assert t.ack(first[0])
    share = t.claim("w", VISIBILITY)
    assert share is not None and share.group_id == "b1", "the freed slot goes to the key's next group"


def test_a_limit_cleared_lets_the_key_run_freely_again(edge, make_transport):
    t = make_transport(lambda: 1000.0)
    with on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "k", concurrency=0)
        t.publish("g", Event(kind="held"), limit_key="k")
        assert t.claim("w", VISIBILITY) is None, "a concurrency of 0 holds the key back"
        assert limits.clear_limit(execute, t.settings.prefix, "k") is True
        assert limits.clear_limit(execute, t.settings.prefix, "k") is False
        assert limits.list_limits(execute, t.settings.prefix) == []
        assert kinds([t.claim("w", VISIBILITY)]) == ["held"]


def test_a_limit_set_while_transports_claim_holds_from_their_next_claim(edge, make_transport):
    t = make_transport(lambda: 1000.0)
    t.publish_many((f"g{i}", Event(kind=f"e{i}"), 0, "k") for i in range(4))
    first = t.claim("w", VISIBILITY)
    assert first is not None, "claimed while no limit is set"
    with on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "k", concurrency=2)
        assert len(t.claim_many("w", VISIBILITY, 10)) == 1, "the limit counts the lease taken before it"
        assert limits.clear_limit(execute, t.settings.prefix, "k")
    assert len(t.claim_many("w", VISIBILITY, 10)) == 2, "cleared: the key's other groups are claimed"


def test_a_burst_of_debounced_publishes_runs_once_with_the_last_ones_data(make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    t.publish("s", Event(kind="before"))
    for i in range(100):
        t.publish("s", Event(kind="reading", data={"i": i}), debounce=5)
        now[0] += 0.01
    first = t.claim("w", VISIBILITY)
    assert first is not None and first.event.kind == "before", "what was queued before the burst goes first"
    assert t.ack(first)
    assert t.claim("w", VISIBILITY) is None, "the burst waits for 5 s without a publish"
    now[0] += 5.0
    reading = t.claim("w", VISIBILITY)
    assert reading is not None and reading.event.data == {"i": 99}, "once, with the last one's data"
    assert t.ack(reading)
    assert t.depth() == 0, "the 99 others were replaced, not queued"


def test_a_debounced_publish_waits_no_longer_than_its_longest_wait(make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    for i in range(4):  # one a second, each pushing the time back by 5 s
        t.publish("s", Event(kind="reading", data={"i": i}), debounce=5, max_wait=3.5)
        assert t.claim("w", VISIBILITY) is None
        now[0] += 1.0
    now[0] = 1003.6
    reading = t.claim("w", VISIBILITY)
    assert reading is not None and reading.event.data == {"i": 3}, "claimable 3.5 s after the burst began"


def test_a_debounced_message_behind_its_groups_head_does_not_hold_the_head_back(make_transport):
    now = [1000.0]
    t = make_transport(lambda: now[0])
    t.publish("s", Event(kind="head"))
    t.publish("s", Event(kind="reading", data={"i": 0}), debounce=5)
    t.publish("s", Event(kind="reading", data={"i": 1}), debounce=5)
    head = t.claim("w", VISIBILITY)
    assert head is not None and head.event.kind == "head"


RATE, MESSAGES = 20, 60  # a rate of 20 a second, and three seconds' worth of work


def _claim_until_none_left(settings, barrier, results) -> None:
    """One worker process: claim (never ack, so each group is leased once) until every message
    has been leased by someone; report how many it leased."""
    transport = LibsqlTransport(settings=settings)
    try:
        barrier.wait(timeout=60)
        mine, deadline = 0, time.monotonic() + 60  # a hang guard, not a measurement
        while time.monotonic() < deadline:
            mine += len(transport.claim_many("w", 600, 5))
            if transport.depth() == 0 or _all_leased(transport):
                break
        results.put(mine)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        results.put(repr(exc))
    finally:
        transport.close()


def _all_leased(transport) -> bool:
    q = transport.settings.prefix
    return transport.execute(f"SELECT count(*) FROM {q}_transport_messages WHERE claimed_at IS NULL")[0][0] == 0


def test_three_worker_processes_under_a_rate_limit_never_claim_more_than_its_rate_in_any_second(edge):
    t = LibsqlTransport(settings=edge.settings())
    with contextlib.closing(t), on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "api", rate=RATE, period=1.0)
        t.publish_many((f"g{i}", Event(kind=f"e{i}"), 0, "api") for i in range(MESSAGES))
        ctx = spawned.context()
        barrier, results = ctx.Barrier(3), ctx.Queue()
        arguments = [(edge.peer(t.settings), barrier, results) for _ in range(3)]
        leased = answers(ctx, _claim_until_none_left, arguments, results, timeout=120)
        assert all(isinstance(n, int) for n in leased), leased
        assert sum(leased) == MESSAGES, f"every message leased once: {leased}"
        # When each was claimed, by the primary's clock: no second ever holds more than RATE.
        times = sorted(
            row[0] for row in execute(f"SELECT claimed_at FROM {t.settings.prefix}_transport_messages")
        )
        busiest = max(sum(1 for u in times if t0 - 1.0 < u <= t0) for t0 in times)
        assert busiest <= RATE, f"{busiest} claims within one second, the limit is {RATE}"
        assert times[-1] - times[0] >= (MESSAGES - RATE) / RATE - 0.01, "the work took at least the time the rate allows"


def _hold_then_wait(settings, results) -> None:
    """A worker process that leases what it can and holds it until it is killed."""
    transport = LibsqlTransport(settings=settings)
    results.put(sorted(lease.group_id for lease in transport.claim_many("doomed", 3.0, 10)))
    time.sleep(600)  # killed by the test long before


def test_the_slots_of_a_killed_worker_come_back_when_its_leases_lapse_and_no_sooner(edge):
    t = LibsqlTransport(settings=edge.settings())
    with contextlib.closing(t), on_primary(t.settings, t) as execute:
        limits.set_limit(execute, t.settings.prefix, "tenant", concurrency=2)
        t.publish_many((f"t{i}", Event(kind=f"t{i}"), 0, None, "tenant") for i in range(6))
        ctx = spawned.context()
        results = ctx.Queue()
        doomed = ctx.Process(target=_hold_then_wait, args=(edge.peer(t.settings), results))
        doomed.start()
        try:
            held = results.get(timeout=60)
        finally:
            doomed.kill()
            doomed.join(30)
        assert len(held) == 2, f"the killed worker held the tenant's two slots: {held}"
        meanwhile = t.claim_many("w", VISIBILITY, 10)
        ((now, lapse),) = execute(
            f"SELECT unixepoch('subsec'), min(lock_expiry) FROM {t.settings.prefix}_transport_messages"
            " WHERE locked_by LIKE 'doomed#%'"
        )
        if now < lapse:  # the claim above ran while the killed worker's leases still held (as it does but on a stalled machine)
            assert meanwhile == [], "its slots are taken while its leases last"
        deadline = time.monotonic() + 60  # a hang guard: the leases lapse after 3 s
        again = meanwhile
        while not again and time.monotonic() < deadline:
            again = t.claim_many("w", VISIBILITY, 10)
            if not again:
                time.sleep(0.1)  # polling pace; the verdict is what the claim returns
        assert len(again) == 2, "both slots came back, and only two"
        assert t.claim_many("w", VISIBILITY, 10) == []
