"""What flow control costs a claim, counted in SQLite's virtual-machine steps (as
tests/unit/test_claim_cost.py counts them), never timed."""

from __future__ import annotations

import sqlite3

import pytest
from harel.spec.states import Event

from harel_edge import LibsqlTransport, Message
from harel_edge.queue.statements import claim_params, claim_sql, limits_were_set
from harel_edge.schema import EdgeNames

GROUPS, KEYS = 2_000, 1_000


@pytest.fixture(scope="module")
def queue(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("flow") / "q.db")
    t = LibsqlTransport(path, lambda: 1000.0)
    try:
        t.publish_many(Message(f"g{i}", Event(kind="e"), 0, None, f"k{i % KEYS}") for i in range(GROUPS))
    finally:
        t.close()
    return path


def work(path: str, *, limited: bool, limits: int) -> int:
    """The steps of one claim of 32, with `limits` keys limited (none at its limit), rolled back."""
    db = sqlite3.connect(path, isolation_level=None)
    calls = [0]

    def count() -> int:
        calls[0] += 1
        return 0

    try:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO harel_transport_limits (key, concurrency, rate, period) VALUES (?, 100, 1000, 60)",
            [(f"k{i}",) for i in range(limits)],
        )
        _token, params = claim_params("w", 30, 0, (), 1010.0)
        db.set_progress_handler(count, 10)
        rows = db.execute(claim_sql(EdgeNames(), 0, many=True, limited=limited), (*params, 32)).fetchall()
        db.set_progress_handler(None, 0)
        db.execute("ROLLBACK")
        assert len(rows) == 32
        return calls[0]
    finally:
        db.close()


def test_a_claims_work_does_not_grow_with_the_number_of_keys_limited(queue):
    # The claim's 32 groups are g0..g31, of keys k0..k31: limited in both, among 32 or 1,000 limits.
    few = work(queue, limited=True, limits=32)
    thousand = work(queue, limited=True, limits=KEYS)
    assert thousand <= few * 1.2, f"{few} steps with 32 keys limited, {thousand} with {KEYS}"


def test_a_claim_that_reads_the_limits_costs_less_than_twice_the_claim_with_none(queue):
    # Measured: about 1.6x, each candidate's key looked up in the limits and its room counted.
    none = work(queue, limited=False, limits=0)
    limited = work(queue, limited=True, limits=KEYS)
    assert limited <= none * 2, f"{none} steps with no limit, {limited} with {KEYS} keys limited"


def test_the_claim_that_does_not_read_limits_is_refused_once_one_is_set_and_changes_nothing(queue):
    db = sqlite3.connect(queue, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO harel_transport_limits (key, concurrency) VALUES ('k1', 1)")
        _token, params = claim_params("w", 30, 0, (), 1010.0)
        with pytest.raises(sqlite3.OperationalError) as refused:
            db.execute(claim_sql(EdgeNames(), 0, many=True, limited=False), (*params, 32)).fetchall()
        assert limits_were_set(refused.value)
        leased = db.execute("SELECT count(*) FROM harel_transport_messages WHERE locked_by IS NOT NULL").fetchone()
        db.execute("ROLLBACK")
        assert leased == (0,), "nothing was leased"
    finally:
        db.close()
