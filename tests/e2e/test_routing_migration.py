"""A harel 0.9 queue on a sqld primary, upgraded for routing keys by two edge workers starting at once.

Why: a harel user switching to harel_edge has a queue that harel 0.9's own LibsqlTransport
made, without the routing_key column, on the primary. Every edge worker upgrades the schema
when it starts, and several start together after a deployment. Through embedded replicas a
worker's own file may lag its peer's upgrade, so the schema step decides on the primary: each
version is one request that re-reads the state it was planned from (the race itself, forced,
is in test_versioned_migrations). The primary must end with the column once, the version set,
the old messages claimable in their order, and routing working.

The old database is made by harel 0.9.0 itself, through sqld, as an embedded replica: its
LibsqlTransport hands `auth_token` to libsql only together with `sync_url`, so against a sqld
with auth on its remote mode is refused (401) and the replica mode is the one that works.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import _workers
import pytest
from harel.engine.transport import LibsqlTransport as Harel09LibsqlTransport
from harel.spec.states import Event

from harel_edge.migrations import SCHEMA_VERSION
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import SqldServer, spawned

pytestmark = [pytest.mark.sqld, pytest.mark.timeout(180)]

VISIBILITY = 60.0
OLD_GROUPS, OLD_PER_GROUP = 4, 5
ROUTED_PER_KEY, ROUTED_PER_GROUP = 3, 4
WORKERS = [
    {"worker": "edge-east", "routing_keys": ["east"]},
    {"worker": "edge-west", "routing_keys": ["west"]},
]


def remote(primary: SqldServer) -> Statements:
    return Statements(
        ExplicitSettings.load(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    )


def make_old_queue(primary: SqldServer, tmp_path: Path) -> dict[str, tuple[str, int]]:
    """harel 0.9.0's transport creates its schema on the primary and publishes; id -> (group, index)."""
    old = Harel09LibsqlTransport(
        str(tmp_path / "harel09-replica.db"), sync_url=primary.http_url, auth_token=primary.rw_token
    )
    published = {}
    for index in range(OLD_PER_GROUP):
        for g in range(OLD_GROUPS):
            event = Event(kind="old", data={"index": index})
            old.publish(f"old-{g}", event, priority=g % 3)
            published[event.id] = (f"old-{g}", index)
    old.close()
    return published


def publish_routed(primary: SqldServer) -> dict[str, tuple[str, int, str]]:
    """Routed messages, published by harel_edge after the upgrade; id -> (group, index, key)."""
    publisher = LibsqlTransport(
        settings=ExplicitSettings.load(profile="sqld", url=primary.http_url, auth_token=primary.rw_token)
    )
    published, batch = {}, []
    for index in range(ROUTED_PER_GROUP):
        for key in ("east", "west"):
            for g in range(ROUTED_PER_KEY):
                event = Event(kind="routed", data={"index": index})
                published[event.id] = (f"{key}-{g}", index, key)
                batch.append(Message(f"{key}-{g}", event, 0, key))
    publisher.publish_many(batch)
    publisher.close()
    return published


@pytest.mark.parametrize("path", ["sync", "event"], ids=["drained by the libsql transport", "drained by the event path"])
def test_two_replica_workers_upgrade_a_harel_09_queue_on_the_primary_at_once_and_keep_its_messages(
    path: str, fresh_sqld_primary: SqldServer, tmp_path: Path
) -> None:
    """Both released at one barrier; the scheduler interleaves their schema steps."""
    primary = fresh_sqld_primary
    old = make_old_queue(primary, tmp_path)
    conn = remote(primary)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(harel_transport_groups)")]
    assert columns == ["group_id", "last_claimed_at", "priority"]
    assert conn.execute("PRAGMA user_version")[0][0] == 0
    for statement in _workers.log_schema():
        conn.execute(statement)

    ctx = spawned.context()
    barrier = ctx.Barrier(len(WORKERS) + 1)
    routed_published = ctx.Event()
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=_workers.upgrading_process,
            args=(
                {
                    "profile": "replica",
                    "db_path": str(tmp_path / f"{spec['worker']}.db"),
                    "sync_url": primary.http_url,
                    "auth_token": primary.rw_token,
                    "worker_id": spec["worker"],
                    "retry_deadline": 30.0,
                },
                {**spec, "visibility": VISIBILITY, "path": path},
                barrier,
                routed_published,
                results,
            ),
            name=spec["worker"],
        )
        for spec in WORKERS
    ]
    reports: dict[tuple[str, str], dict[str, Any]] = {}

    def collect(phase: str) -> None:
        while sum(1 for (_w, p) in reports if p == phase) < len(WORKERS):
            report = results.get(timeout=120)
            assert report["phase"] != "error", report["error"]
            reports[(report["worker"], report["phase"])] = report

    try:
        for process in processes:
            process.start()
        try:
            barrier.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a worker could not open its replica: show why
            pytest.fail(f"a worker did not start: {results.get(timeout=30).get('error')}")
        collect("started")
        collect("old")
        routed = publish_routed(primary)
        routed_published.set()
        collect("routed")
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)

    # The schema on the primary: the column once, harel's columns intact, the version set.
    columns = [row[1] for row in conn.execute("PRAGMA table_info(harel_transport_groups)")]
    assert columns[:5] == ["group_id", "last_claimed_at", "priority", "routing_key", "claimable_at"]
    assert Counter(columns)["routing_key"] == 1
    assert conn.execute("PRAGMA user_version")[0][0] == SCHEMA_VERSION

    starts = sorted(report["at"] for (_w, phase), report in reports.items() if phase == "started")

    rows = _workers.read_log(conn)
    # Old messages: each processed once, in order within its group, the lease live throughout.
    old_found = _workers.replay_log(rows, old)
    # Routed messages: the same, and each only by the worker of its key.
    routed_found = _workers.replay_log(
        rows, {m: (group, index) for m, (group, index, _key) in routed.items()}
    )
    for found in (old_found, routed_found):
        assert (found["duplicates"], found["lost"], found["overlaps"], found["unheld"]) == (0, 0, 0, 0)
        assert found["out_of_order_groups"] == []
    for _id, worker, kind, _seq, _group, message, *_ in rows:
        if kind == "start" and message in routed:
            assert worker == f"edge-{routed[message][2]}"
    assert conn.execute("SELECT count(*) FROM harel_transport_messages")[0][0] == 0
    print(
        f"\n[{path}] released from the barrier "
        f"{1000 * (starts[-1] - starts[0]):.0f} ms apart; old processed "
        f"{[reports[(s['worker'], 'old')]['acked'] for s in WORKERS]}; routed processed "
        f"{[reports[(s['worker'], 'routed')]['acked'] for s in WORKERS]}"
    )
