"""Four worker processes drain one primary's queue: once each, in group order, one at a time per group.

Why end to end: the guarantee that matters ("one message of a group in flight") is made by the
primary, whatever each edge worker's replica has seen. So it is checked with real processes
(spawn: a libsql connection must not cross a fork), each with its own embedded replica of one
fresh sqld primary (replica profile) or its own remote connection (sqld profile), against
real sqld with auth on.

The evidence is the log the workers keep on the primary (`_workers.PrimaryLog`): a 'start'
row after each claim and an 'end' row before each ack, in the primary's commit order, each
saying whether the primary still had the message leased to that claim. From it:

- duplicates and losses: every published message has exactly one start and one end;
- FIFO per group: a group's messages start in the order they were published;
- one in flight per group: no two [start, end] windows of a group overlap, and the lease was
  live on the primary at both ends of every window;
- filters: each worker only processed groups its routing keys and priority floor allow;
- fairness: every group has the same backlog; at every point of the run, the most and the least
  advanced groups are at most FAIRNESS_BOUND completed messages apart (strict round-robin with
  four claims in flight keeps it at a few; a group starved by a bias would drift by tens).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import _workers
import pytest
from harel.spec.states import Event

from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import SqldServer, spawned

pytestmark = [pytest.mark.sqld, pytest.mark.slow, pytest.mark.timeout(240)]

GROUPS = 50
PER_GROUP = 12
TOTAL = GROUPS * PER_GROUP  # 600
VISIBILITY = 120.0  # far longer than the run: a lapsed lease would be a bug here, not a fault
FAIRNESS_BOUND = 8  # completed messages between the most and least advanced group, at any time

# Routing key subsets and priority floors such that every group is claimable by some worker,
# and every worker is restricted in a different way.
WORKERS = [
    {"worker": "w0-key-a", "routing_keys": ["a"], "min_priority": 0},
    {"worker": "w1-key-b", "routing_keys": ["b"], "min_priority": 0},
    {"worker": "w2-keys-ab-floor-2", "routing_keys": ["a", "b"], "min_priority": 2},
    {"worker": "w3-any", "routing_keys": [], "min_priority": 0},
]


def group_of(g: int) -> tuple[str, int, str]:
    """Group g's id, priority (0-4) and routing key ('a' or 'b'): every combination occurs."""
    return f"group-{g:02d}", g % 5, "ab"[g % 2]


def worker_config(profile: str, primary: SqldServer, tmp_path: Path, worker: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "profile": profile,
        "auth_token": primary.rw_token,
        "worker_id": worker,
        "retry_deadline": 30.0,
    }
    if profile == "replica":
        config.update(db_path=str(tmp_path / f"{worker}.db"), sync_url=primary.http_url)
    else:
        config.update(url=primary.http_url)
    return config


def publish_backlog(primary: SqldServer) -> dict[str, tuple[str, int, int, str]]:
    """Publish PER_GROUP messages to each group, groups interleaved; return id -> (group, index, priority, key)."""
    publisher = LibsqlTransport(
        settings=ExplicitSettings.load(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    )
    published: dict[str, tuple[str, int, int, str]] = {}
    batch = []
    for index in range(PER_GROUP):
        for g in range(GROUPS):
            group_id, priority, key = group_of(g)
            event = Event(kind="work", data={"group": group_id, "index": index})
            published[event.id] = (group_id, index, priority, key)
            batch.append(Message(group_id, event, priority, key))
    assert publisher.publish_many(batch) == TOTAL
    assert publisher.depth() == TOTAL
    for statement in _workers.log_schema():
        publisher.execute(statement)
    publisher.close()
    return published


def remote(primary: SqldServer) -> Statements:
    """The primary over Hrana: the test's view, independent of any worker."""
    return Statements(
        ExplicitSettings.load(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    )


def run_workers(profile: str, primary: SqldServer, tmp_path: Path) -> tuple[list[dict[str, Any]], float]:
    """Start the four workers, release them together, wait for their reports; (reports, seconds)."""
    ctx = spawned.context()
    barrier = ctx.Barrier(len(WORKERS) + 1)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=_workers.drain_process,
            args=(
                worker_config(profile, primary, tmp_path, spec["worker"]),
                {**spec, "visibility": VISIBILITY},
                barrier,
                results,
            ),
            name=spec["worker"],
        )
        for spec in WORKERS
    ]
    try:
        for process in processes:
            process.start()
        try:
            barrier.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a worker failed to start: show its report
            reports = [results.get(timeout=30) for _ in processes]
            pytest.fail(f"a worker did not start: {[r.get('error') for r in reports if 'error' in r]}")
        began = time.monotonic()
        reports = [results.get(timeout=180) for _ in processes]
        elapsed = time.monotonic() - began
        for process in processes:
            process.join(timeout=30)
        return reports, elapsed
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()


@pytest.mark.parametrize("profile", ["replica", "sqld"])
def test_four_workers_drain_600_messages_once_each_in_group_order_with_one_in_flight_per_group(
    profile: str, fresh_sqld_primary: SqldServer, tmp_path: Path
) -> None:
    primary = fresh_sqld_primary
    published = publish_backlog(primary)
    reports, elapsed = run_workers(profile, primary, tmp_path)

    errors = [report["error"] for report in reports if "error" in report]
    assert not errors, errors[0]
    conn = remote(primary)
    rows = _workers.read_log(conn)
    depth = conn.execute("SELECT count(*) FROM harel_transport_messages")[0][0]
    conn.close()
    found = _workers.replay_log(rows, {m: (group, index) for m, (group, index, _p, _k) in published.items()})
    span = rows[-1][8] - rows[0][8]
    by_worker = {report["worker"]: report["acked"] for report in reports}
    print(
        f"\n[{profile}] {TOTAL} messages, {GROUPS} groups, {len(WORKERS)} workers: drained in {elapsed:.2f} s "
        f"({TOTAL / elapsed:.0f}/s; primary clock span {span:.2f} s); per worker {by_worker}; "
        f"p50 ms claim/ack/log {[(r['claim_p50_ms'], r['ack_p50_ms'], r['log_p50_ms']) for r in reports]}; {found}"
    )

    assert depth == 0
    assert sum(report["acked"] for report in reports) == TOTAL
    assert sum(report["lost"] for report in reports) == 0
    assert found["duplicates"] == 0
    assert found["lost"] == 0
    assert found["unknown"] == 0
    assert found["overlaps"] == 0
    assert found["out_of_order_groups"] == []
    assert found["fairness_spread"] <= FAIRNESS_BOUND
    # The primary had each message leased to the claim that processed it, at both ends.
    assert found["unheld"] == 0
    assert all(row[6] is not None for row in rows)
    # Each worker processed only what its routing keys and priority floor allow.
    allowed = {spec["worker"]: spec for spec in WORKERS}
    for _id, worker, kind, _seq, _group, message, *_ in rows:
        if kind == "start":
            _, _, priority, key = published[message]
            spec = allowed[worker]
            assert priority >= spec["min_priority"] and (
                not spec["routing_keys"] or key in spec["routing_keys"]
            )
