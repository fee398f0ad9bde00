"""The queue's invariants over random sequences of operations and clock moves.

A model says what the queue must hold: per group, the messages not yet acked, in publish order,
and per message the lock it carries. After every step the transport must agree: a claim takes
the head of a group with nothing in flight (FIFO, at most one in flight per group), claims
nothing only when every group is busy, an ack or nack succeeds exactly when the lease is still
the holder's, and nothing is lost or delivered after it was acked.
"""

from __future__ import annotations

from dataclasses import dataclass

from harel.spec.states import Event
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from harel_edge import LibsqlTransport

GROUPS = st.sampled_from(["a", "b", "c", "d"])


@dataclass
class Lock:
    token: str | None  # None: parked
    expiry: float


class QueueMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.transport = LibsqlTransport(":memory:", lambda: self.now)
        self.pending: dict[str, list[int]] = {}  # group -> seqs not yet acked, in order
        self.kind_of: dict[int, str] = {}
        self.locks: dict[int, Lock] = {}
        self.published = 0
        self.acked: set[int] = set()
        self.delivered_kinds: dict[str, int] = {}

    def teardown(self) -> None:
        self.transport.close()

    def busy(self, group: str) -> bool:
        head = self.pending[group][0]
        lock = self.locks.get(head)
        return lock is not None and lock.expiry >= self.now

    @rule(group=GROUPS, priority=st.integers(0, 4))
    def publish(self, group: str, priority: int) -> None:
        self.published += 1
        kind = f"m{self.published}"
        self.transport.publish(group, Event(kind=kind), priority=priority)
        self.pending.setdefault(group, []).append(-self.published)  # seq learned at first claim
        self.kind_of[-self.published] = kind

    @rule(target=leases, visibility=st.sampled_from([1.0, 5.0, 30.0]))
    def claim(self, visibility: float):
        lease = self.transport.claim("w", visibility)
        if lease is None:
            assert all(self.busy(g) for g, seqs in self.pending.items() if seqs), "a free group was left unclaimed"
            return None
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
        return lease

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

    @rule(lease=consumes(leases), delay=st.sampled_from([0.0, 2.0, 10.0]))
    def nack(self, lease, delay: float) -> None:
        if lease is None:
            return
        expected = self.holds(lease)
        assert self.transport.nack(lease, delay) is expected
        if expected:
            if delay > 0:
                self.locks[lease.seq] = Lock(None, self.now + delay)
            else:
                del self.locks[lease.seq]

    @rule(seconds=st.sampled_from([0.5, 1.5, 3.0, 12.0, 40.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def nothing_is_lost(self) -> None:
        assert self.transport.depth() == sum(len(seqs) for seqs in self.pending.values())
        assert self.transport.depth() == self.published - len(self.acked)


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_queue_keeps_its_invariants_under_any_sequence_of_operations = QueueMachine.TestCase
