"""Two threads of one process, each with its own sync `LibsqlTransport` and `EdgeStore` on the
same replica file, work at once: the faces send every statement to the primary over Hrana, so
they never open two embedded replicas of one file (which libsql 0.1.8 corrupts: "database disk
image is malformed")."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.connection import EdgeConnection
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore

pytestmark = pytest.mark.sqld

EXECUTIONS = 15  # per thread
EVENTS = 3  # per execution


def _work(settings, me: str, start: threading.Barrier, handled: dict, errors: list) -> None:
    """Create this thread's executions and queue their events, then handle events from the
    shared queue (either thread's) as harel's worker does: load, commit with the processed
    mark, ack; until the queue is empty."""
    try:
        with LibsqlTransport(settings=settings) as transport, EdgeStore(settings) as store:
            start.wait()
            for i in range(EXECUTIONS):
                store.save(Execution(id=f"{me}-{i}", definition_id="d"))
            transport.publish_many(
                (f"{me}-{i}", Event(kind=f"e{j}")) for i in range(EXECUTIONS) for j in range(EVENTS)
            )
            deadline = time.monotonic() + 120  # a guard against a hang, not a measurement
            while time.monotonic() < deadline:
                lease = transport.claim(me, 30)
                if lease is None:
                    if transport.depth() == 0:
                        return
                    continue  # the other thread holds the last groups, or is still publishing
                exe, processed = store.load_for_event(lease.group_id, lease.event.id)
                if not processed:
                    store.commit(exe, [], processed_event_id=lease.event.id)
                assert transport.ack(lease) is True
                handled[me] = handled.get(me, 0) + 1
            errors.append(f"{me}: the queue was not empty after 120 s")
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"{me}: {type(exc).__name__}: {exc}")


def test_two_threads_with_their_own_faces_on_one_replica_file_work_at_once_and_every_row_is_right(
    fresh_sqld_primary, tmp_path: Path
):
    settings = ExplicitSettings.load(
        profile="replica",
        db_path=str(tmp_path / "shared-replica.db"),
        sync_url=fresh_sqld_primary.http_url,
        auth_token=fresh_sqld_primary.rw_token,
        prefix=f"two_{uuid.uuid4().hex[:8]}",
        retry_deadline=20.0,
    )
    start, handled, errors = threading.Barrier(2), {}, []
    threads = [threading.Thread(target=_work, args=(settings, me, start, handled, errors)) for me in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    total = 2 * EXECUTIONS * EVENTS
    assert sum(handled.values()) == total, "every event handled once, by one thread or the other"

    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings) as transport:
        assert transport.depth() == 0
        versions = store.execute(f"SELECT id, json_extract(data, '$.version') FROM {settings.prefix}_executions ORDER BY id")
        assert versions == sorted((f"{me}-{i}", 1 + EVENTS) for me in "ab" for i in range(EXECUTIONS)), (
            "each execution saved once and committed once an event"
        )
        processed = store.execute(f"SELECT count(*), count(DISTINCT event_id) FROM {settings.prefix}_processed_events")
        assert processed == [(total, total)]

    # The replica file itself, opened as an embedded replica once the faces are done: it syncs
    # with the primary and holds the same rows, undamaged.
    replica = EdgeConnection(settings)
    try:
        replica.sync()
        assert replica.execute("PRAGMA integrity_check") == [("ok",)]
        assert replica.execute(f"SELECT count(*) FROM {settings.prefix}_processed_events") == [(total,)]
    finally:
        replica.close()
