"""The queue's invariants over random sequences of operations and clock moves.

A model says what the queue must hold: per group, the messages not yet acked, in publish order,
per message the lock it carries, and per group what the transport spec's claim selects by: its
priority and routing key (fixed by the publish that created the group), when it was last
claimed (0: never), and when it arrived. After every step the transport must agree: a claim
takes, among the groups with nothing in flight, priority >= the floor and (if keys are given)
a routing key in the list, the one whose last claim is oldest, ties by arrival; each claim's
stamp is later than every earlier one, and a claim of several stamps each group a step after
the one before it, so groups served together keep that order; it takes that
group's head (FIFO, at most one in flight per group); it claims nothing only when no group
qualifies; a claim of up to n groups takes the first n in that order; an ack or nack succeeds
exactly when the lease is still the holder's; and nothing is lost or delivered after it was
acked.

The model is the spec's, not the implementation's: "nothing in flight" is checked over every
message of the group, "last claimed" is the claim's own time, and a park (nack with a delay)
leaves it as it was. Claims mix visibilities (5, 30 and 300 s) and parks mix delays, so leases
and parks of different lengths lapse in every order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from harel.engine.transport import Lease
from harel.spec.states import Event
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from harel_edge import LibsqlTransport
from harel_edge.queue.statements import RANK_STEP, claim_params, claim_sql, lease_from_row
from harel_edge.schema import EdgeNames

GROUPS = st.sampled_from(["a", "b", "c", "d"])
ROUTING_KEYS = st.sampled_from([None, "eu", "us"])
VISIBILITIES = st.sampled_from([5.0, 30.0, 300.0])
FLOORS = st.sampled_from([0, 0, 1, 3])
KEYS = st.sampled_from([(), (), ("eu",), ("eu", "us"), ("us", "eu", "us")])


@dataclass
class Lock:
    token: str | None  # None: parked
    expiry: float


@dataclass
class Group:
    """What the spec's claim selects a group by; gone with the group's last message."""

    priority: int
    routing_key: str | None
    arrival: int
    last_claimed: float = 0.0  # 0: never claimed


class QueueMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.transport = LibsqlTransport(":memory:", lambda: self.now)
        self.pending: dict[str, list[int]] = {}  # group -> seqs not yet acked, in order
        self.groups: dict[str, Group] = {}  # the groups with messages
        self.arrivals = itertools.count()
        self.kind_of: dict[int, str] = {}
        self.locks: dict[int, Lock] = {}
        self.published = 0
        self.acked: set[int] = set()
        self.delivered_kinds: dict[str, int] = {}

    def teardown(self) -> None:
        self.transport.close()

    def busy(self, group: str) -> bool:
        """Something of the group is in flight: any message leased or parked, not only its head."""
        return any(
            (lock := self.locks.get(seq)) is not None and lock.expiry >= self.now
            for seq in self.pending[group]
        )

    def qualifying(self, min_priority: int, keys: tuple[str, ...]) -> list[str]:
        return [
            g
            for g, seqs in self.pending.items()
            if seqs
            and not self.busy(g)
            and self.groups[g].priority >= min_priority
            and (not keys or self.groups[g].routing_key in keys)
        ]

    def selected(self, min_priority: int, keys: tuple[str, ...], n: int = 1) -> list[str]:
        """The spec's choice: the qualifying groups whose last claim is oldest, ties by arrival."""
        candidates = self.qualifying(min_priority, keys)
        return sorted(candidates, key=lambda g: (self.groups[g].last_claimed, self.groups[g].arrival))[:n]

    @rule(group=GROUPS, priority=st.integers(0, 4), routing_key=ROUTING_KEYS)
    def publish(self, group: str, priority: int, routing_key: str | None) -> None:
        self.published += 1
        kind = f"m{self.published}"
        self.transport.publish(group, Event(kind=kind), priority=priority, routing_key=routing_key)
        if not self.pending.get(group):  # a new group: this publish fixes its priority and key
            self.groups[group] = Group(priority, routing_key, next(self.arrivals))
        self.pending.setdefault(group, []).append(-self.published)  # seq learned at first claim
        self.kind_of[-self.published] = kind

    @rule(target=leases, min_priority=FLOORS, keys=KEYS, visibility=VISIBILITIES)
    def claim(self, min_priority: int, keys: tuple[str, ...], visibility: float):
        expected = self.selected(min_priority, keys)
        base = self.stamp_base()
        lease = self.transport.claim("w", visibility, min_priority=min_priority, routing_keys=keys)
        if lease is None:
            assert expected == [], f"a free group was left unclaimed: {expected!r}"
            return None
        assert [lease.group_id] == expected, (
            f"claimed {lease.group_id!r}, the spec selects {expected!r} among"
            f" {self.qualifying(min_priority, keys)} ({self.groups})"
        )
        self.took(lease, visibility, base)
        return lease

    @rule(
        target=leases,
        n=st.integers(1, 5),
        min_priority=FLOORS,
        keys=KEYS,
        visibility=VISIBILITIES,
    )
    def claim_many(self, n: int, min_priority: int, keys: tuple[str, ...], visibility: float):
        """The event path's statement (`claim_many`): up to n groups' heads, in the spec's order."""
        expected = self.selected(min_priority, keys, n)
        base = self.stamp_base()
        token, params = claim_params("w", visibility, min_priority, keys, self.now)
        rows = self.transport.execute(claim_sql(EdgeNames(), len(keys), many=True), (*params, n))
        leases = sorted((lease_from_row(row, token) for row in rows), key=lambda lease: lease.seq)
        claimed = [lease.group_id for lease in leases]
        assert sorted(claimed) == sorted(expected), f"claimed {claimed}, the spec selects {expected} ({self.groups})"
        for lease in leases:
            self.took(lease, visibility, base, rank=expected.index(lease.group_id))
        return multiple(*leases)

    def stamp_base(self) -> float:
        """A claim's stamp: its time, or a step past the latest stamp when that is not earlier."""
        latest = max((g.last_claimed for g in self.groups.values()), default=0.0)
        return max(self.now, latest + RANK_STEP)

    def took(self, lease: Lease, visibility: float, base: float, rank: int = 0) -> None:
        """Check a claimed lease against the model, and record it: the `rank`-th lease of one
        claim is stamped `rank` steps after the claim's base, so tied groups keep their turn."""
        group = self.pending[lease.group_id]
        head = group[0]
        if head < 0:  # first delivery: learn the real seq of the head
            assert self.kind_of[head] == lease.event.kind, "the claim took the group's oldest message"
            self.kind_of[lease.seq] = self.kind_of.pop(head)
            group[0] = lease.seq
        assert group[0] == lease.seq, "FIFO: the claim took the group's head"
        assert lease.seq not in self.acked, "an acked message was delivered again"
        assert not self.busy(lease.group_id), "a group already in flight was claimed again"
        self.locks[lease.seq] = Lock(lease.token, self.now + visibility)
        self.groups[lease.group_id].last_claimed = base + rank * RANK_STEP

    def holds(self, lease) -> bool:
        lock = self.locks.get(lease.seq)
        return lease.seq not in self.acked and lock is not None and lock.token == lease.token

    @rule(lease=consumes(leases))
    def ack(self, lease) -> None:
        if lease is None:
            return
        expected = self.holds(lease)
        assert self.transport.ack(lease) is expected
        if expected:
            self.acked.add(lease.seq)
            self.pending[lease.group_id].remove(lease.seq)
            del self.locks[lease.seq]
            if not self.pending[lease.group_id]:  # its last message: the group is gone
                del self.groups[lease.group_id]

    @rule(lease=consumes(leases), delay=st.sampled_from([0.0, 2.0, 10.0, 60.0]))
    def nack(self, lease, delay: float) -> None:
        if lease is None:
            return
        expected = self.holds(lease)
        assert self.transport.nack(lease, delay) is expected
        if expected:
            if delay > 0:  # parked: the group's last claim stays as it was
                self.locks[lease.seq] = Lock(None, self.now + delay)
            else:
                del self.locks[lease.seq]

    @rule(seconds=st.sampled_from([0.5, 1.5, 3.0, 12.0, 40.0, 320.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def nothing_is_lost(self) -> None:
        assert self.transport.depth() == sum(len(seqs) for seqs in self.pending.values())
        assert self.transport.depth() == self.published - len(self.acked)


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_queue_keeps_its_invariants_under_any_sequence_of_operations = QueueMachine.TestCase
