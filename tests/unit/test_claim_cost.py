"""A claim's work (and an ack_many's) does not grow with the groups waiting, whatever it filters on.

Work is counted, not timed: SQLite calls a progress handler every few virtual-machine
instructions, so the count of calls while one claim statement runs (its triggers included)
is the same on every machine and every run. The queue is the benchmark's
(benchmarks/bench_claim_filters.py): group i has key eu/us/ap/af by i % 4 and priority i % 4,
except the newest 2%, which have priority 4.
"""

from __future__ import annotations

import sqlite3

import pytest
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge import LibsqlTransport, Message
from harel_edge.queue.statements import ack_many_statement, claim_params, claim_sql
from harel_edge.schema import EdgeNames
from harel_edge.testing.fixtures import built_once

KEYS = ("eu", "us", "ap", "af")
SMALL, LARGE = 1_000, 16_000
SHAPES = {
    "no key": ((), 0),
    "one key": (("eu",), 0),
    "two keys": (("eu", "us"), 0),
    "three keys": (("eu", "us", "ap"), 0),
    "priority floor 3": ((), 3),
    "priority floor 4, the newest groups": ((), 4),
    "two keys and a floor": (("eu", "us"), 3),
}


def queue(path, groups: int, in_flight: bool) -> str:
    now = [1000.0]
    t = LibsqlTransport(str(path), lambda: now[0])
    try:
        newest = groups - groups // 50
        t.publish_many(
            Message(f"g{i}", Event(kind=f"e{m}"), 4 if i >= newest else i % 4, KEYS[i % 4])
            for m in range(2)
            for i in range(groups)
        )
        if in_flight:  # half the groups held by a worker with a long visibility
            for _ in range(groups // 2 // 500):
                t.claim_many("holder", 3600, 500)
        now[0] += 1
        lease = t.claim("w", 5)  # a lease that lapses, and a park that ends, before the claim
        t.claim("w", 5)
        t.nack(lease, delay=2)
    finally:
        t.close()
    return str(path)


def counted(db: sqlite3.Connection, sql: str, args: tuple) -> tuple[list, int]:
    """The statement's rows, and the progress-handler calls (every 10 instructions) it took."""
    calls = [0]

    def count() -> int:
        calls[0] += 1
        return 0

    db.set_progress_handler(count, 10)
    try:
        return db.execute(sql, args).fetchall(), calls[0]
    finally:
        db.set_progress_handler(None, 0)


def work(path: str, keys: tuple[str, ...], floor: int) -> int:
    """The work of one claim of four, rolled back after."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        _token, params = claim_params("w", 30, floor, keys, 1010.0)
        db.execute("BEGIN IMMEDIATE")
        rows, steps = counted(db, claim_sql(EdgeNames(), len(keys), many=True), (*params, 4))
        db.execute("ROLLBACK")
        assert len(rows) == 4, "the claim found groups to lease"
        return steps
    finally:
        db.close()


@pytest.fixture(scope="module")
def queues(tmp_path_factory):
    # They take seconds to build: built once for the whole run, whichever pytest-xdist worker comes
    # first (the tests only read them, or roll back what they write).
    shapes = [(groups, in_flight) for in_flight in (False, True) for groups in (SMALL, LARGE)]

    def build(root):
        for groups, in_flight in shapes:
            queue(root / f"q-{groups}-{int(in_flight)}.db", groups, in_flight)

    root = built_once(tmp_path_factory, "claim-cost-queues", build)
    return {(groups, in_flight): str(root / f"q-{groups}-{int(in_flight)}.db") for groups, in_flight in shapes}


@pytest.mark.parametrize("in_flight", [False, True], ids=["all waiting", "half in flight"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_claims_work_is_the_same_for_16_times_the_groups(queues, shape, in_flight):
    keys, floor = SHAPES[shape]
    small = work(queues[(SMALL, in_flight)], keys, floor)
    large = work(queues[(LARGE, in_flight)], keys, floor)
    assert large <= small * 1.5, f"{shape}: {small} at {SMALL} groups, {large} at {LARGE}"


def ack_work(path: str) -> int:
    """The work of `ack_many` of four fresh leases, rolled back after (on Python's sqlite3: its
    SQLite 3.40 is a planner that scanned for the old statement)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        token, params = claim_params("w", 30, 0, (), 1010.0)
        db.execute("BEGIN IMMEDIATE")
        rows = db.execute(claim_sql(EdgeNames(), 0, many=True), (*params, 4)).fetchall()
        stmt = ack_many_statement(EdgeNames(), [Lease(seq, group, Event(kind="x"), token) for seq, group, _ in rows])
        acked, steps = counted(db, stmt.sql, stmt.args)
        db.execute("ROLLBACK")
        assert len(acked) == 4, "every lease was still held"
        return steps
    finally:
        db.close()


@pytest.mark.parametrize("in_flight", [False, True], ids=["all waiting", "half in flight"])
def test_an_ack_many_does_the_same_work_for_16_times_the_messages_queued(queues, in_flight):
    small = ack_work(queues[(SMALL, in_flight)])
    large = ack_work(queues[(LARGE, in_flight)])
    assert large <= small * 1.5, f"{small} at {SMALL} groups, {large} at {LARGE}"
