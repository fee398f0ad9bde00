"""The transport at start: a file made by harel 0.9 or an earlier harel_edge is upgraded in place,
one from a newer harel_edge is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport
from harel.engine.transport import SqliteTransport as HarelSqliteTransport
from harel.spec.states import Event

from harel_edge import LibsqlTransport, SchemaError, SchemaTooNewError, migrations
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import spawned

HAREL_TRANSPORTS = {"SqliteTransport": HarelSqliteTransport, "LibsqlTransport": HarelLibsqlTransport}


def columns(path, table="harel_transport_groups"):
    with sqlite3.connect(path) as db:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def user_version(path):
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def harel_file(tmp_path, kind):
    """A queue file as harel 0.9.0 leaves it: old tables, three messages in two groups."""
    path = str(tmp_path / f"{kind}.db")
    old = HAREL_TRANSPORTS[kind](path)
    old.publish("G", Event(kind="g1"), priority=2)
    old.publish("G", Event(kind="g2"))
    old.publish("H", Event(kind="h1"))
    old.close()
    assert "routing_key" not in columns(path), "harel 0.9 makes the older tables"
    return path


def drain(transport, **claim):
    out = []
    while (lease := transport.claim("w", 30, **claim)) is not None:
        out.append(lease.event.kind)
        transport.ack(lease)
    return out


@pytest.mark.parametrize("kind", sorted(HAREL_TRANSPORTS))
def test_a_file_harel_made_is_upgraded_and_its_messages_stay_claimable(tmp_path, kind):
    path = harel_file(tmp_path, kind)
    t = LibsqlTransport(path)
    try:
        # Read through the transport's own connection: two SQLite libraries in one process on one
        # file break each other's locks, and a read through the second can be stale.
        assert [row[1] for row in t.execute("PRAGMA table_info(harel_transport_groups)")].count("routing_key") == 1
        assert t.execute("PRAGMA user_version") == [(migrations.SCHEMA_VERSION,)]
        assert drain(t, min_priority=2) == ["g1", "g2"], "the group kept its priority and its order"
        assert drain(t) == ["h1"]
        t.publish("R", Event(kind="routed"), routing_key="eu")
        assert drain(t, routing_keys=["us"]) == []
        assert drain(t, routing_keys=["eu"]) == ["routed"]
    finally:
        t.close()


@pytest.mark.parametrize("kind", sorted(HAREL_TRANSPORTS))
def test_harel_can_still_use_a_file_harel_edge_upgraded(tmp_path, kind):
    path = harel_file(tmp_path, kind)
    LibsqlTransport(path).close()
    old = HAREL_TRANSPORTS[kind](path)
    try:
        lease = old.claim("w", 30)
        assert lease.event.kind == "g1"
        old.ack(lease)
        old.publish("N", Event(kind="from-harel"))
    finally:
        old.close()
    t = LibsqlTransport(path)
    try:
        assert sorted(drain(t)) == ["from-harel", "g2", "h1"]
    finally:
        t.close()


def _start_at_once(path, barrier, results):
    barrier.wait()
    try:
        LibsqlTransport(path).close()
        results.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_upgrading_one_file_at_the_same_moment_both_start(tmp_path):
    ctx = spawned.context()
    for attempt in range(3):  # three races, each on a fresh harel file
        (tmp_path / f"race{attempt}").mkdir()
        path = harel_file(tmp_path / f"race{attempt}", "SqliteTransport")
        barrier, results = ctx.Barrier(2), ctx.Queue()
        workers = [ctx.Process(target=_start_at_once, args=(path, barrier, results)) for _ in range(2)]
        for w in workers:
            w.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for w in workers:
            w.join(timeout=60)
        assert outcomes == ["ok", "ok"]
        assert columns(path).count("routing_key") == 1
        assert user_version(path) == migrations.SCHEMA_VERSION


def test_a_file_from_a_newer_harel_edge_is_refused_and_left_untouched(tmp_path):
    path = str(tmp_path / "newer.db")
    LibsqlTransport(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {migrations.SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNewError, match="upgrade harel_edge"):
        LibsqlTransport(path)
    with pytest.raises(SchemaTooNewError):
        LibsqlTransport(path, create_schema=False)
    assert user_version(path) == migrations.SCHEMA_VERSION + 1


def test_without_create_schema_an_old_file_is_refused_with_what_to_run(tmp_path):
    path = harel_file(tmp_path, "SqliteTransport")
    with pytest.raises(SchemaError, match="harel-edge migrate"):
        LibsqlTransport(path, create_schema=False)
    assert "routing_key" not in columns(path), "nothing was changed"


def test_migrating_twice_changes_nothing(tmp_path):
    path = str(tmp_path / "twice.db")
    LibsqlTransport(path).close()
    with sqlite3.connect(path) as db:
        before = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    LibsqlTransport(path).close()
    with sqlite3.connect(path) as db:
        after = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    assert before == after


def test_the_migration_sql_builds_a_database_the_transport_accepts_as_is(tmp_path):
    path = str(tmp_path / "tool.db")
    with sqlite3.connect(path) as db:
        for statement in migrations.migration_sql("tool"):
            db.execute(statement)
    t = LibsqlTransport(path, prefix="tool", create_schema=False)
    try:
        t.publish("G", Event(kind="e"), routing_key="eu")
        assert drain(t, routing_keys=["eu"]) == ["e"]
    finally:
        t.close()


def test_the_migration_sql_upgrades_a_harel_file_for_a_migration_tool_with_nothing_run_before_it(tmp_path):
    path = harel_file(tmp_path, "LibsqlTransport")
    with sqlite3.connect(path) as db:
        for statement in migrations.migration_sql():
            db.execute(statement)
    t = LibsqlTransport(path, create_schema=False)
    try:
        assert sorted(drain(t)) == ["g1", "g2", "h1"]
    finally:
        t.close()


def test_a_file_that_is_not_a_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    before = path.read_bytes()
    with pytest.raises(Exception, match="not a SQLite/libSQL database"):
        LibsqlTransport(settings=ExplicitSettings.load(db_path=str(path)))
    assert path.read_bytes() == before


V5_SCHEMA = (Path(__file__).parent / "schemas" / "v5.sql").read_text()  # as version 5 left a new file


def version_5_file(tmp_path):
    """A file as schema version 5 left it: the scheduler queue without `generation`, whose
    arrival trigger did not bump it, and a workflow waiting in it."""
    path = str(tmp_path / "v5.db")
    with sqlite3.connect(path) as db:
        db.executescript(V5_SCHEMA)
        db.execute("INSERT INTO workflow_queue VALUES ('ns', 'w1', 100.0)")
    return path


def test_a_version_5_file_gets_queue_generations_and_an_arrival_that_bumps_them(tmp_path):
    path = version_5_file(tmp_path)
    LibsqlTransport(path).close()
    assert user_version(path) == migrations.SCHEMA_VERSION
    assert "generation" in columns(path, "workflow_queue")
    with sqlite3.connect(path) as db:
        triggers = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert "workflow_arrival_insert" not in triggers, "the trigger that did not bump was dropped"
        assert db.execute("SELECT workflow, visible_at, generation FROM workflow_queue").fetchall() == [
            ("w1", 100.0, 0)
        ], "the waiting workflow is kept"
        db.execute("INSERT INTO workflow_arrival VALUES ('w1', 'k', '1', 0, 'ns', 50.0)")
        visible, generation = db.execute("SELECT visible_at, generation FROM workflow_queue").fetchone()
        assert visible == 50.0 and generation > 0, "an arrival makes the row ready and changes its receipt"


def test_upgrading_a_version_5_file_twice_at_once_adds_the_column_once(tmp_path):
    path = version_5_file(tmp_path)
    ctx = spawned.context()
    with ctx.Pool(2) as pool:
        pool.map(_open_and_close, [path, path])
    assert columns(path, "workflow_queue").count("generation") == 1
    assert columns(path).count("claimable_at") == 1
    assert columns(path, "harel_transport_messages").count("claimed_at") == 1
    assert user_version(path) == migrations.SCHEMA_VERSION


def _open_and_close(path):
    LibsqlTransport(path).close()


def earlier_queue_file(tmp_path):
    """A queue in use as version 5 left it, at 1000 s (its claim trigger stamped a group with its
    lease's deadline): `leased` held until 1300, `parked` until 1050, `free` waiting (its head's
    lease ended at 990)."""
    path = version_5_file(tmp_path)
    with sqlite3.connect(path) as db:
        for group in ("leased", "parked", "free"):
            for i in (1, 2):
                db.execute(
                    "INSERT INTO harel_transport_publish (group_id, event) VALUES (?, ?)",
                    (group, Event(kind=f"{group}:{i}").model_dump_json()),
                )
        held = (("leased", "w#1", 1300.0), ("parked", "__parked__", 1050.0), ("free", "w#2", 990.0))
        for group, locked_by, expiry in held:
            db.execute(
                "UPDATE harel_transport_messages SET locked_by = ?, lock_expiry = ?"
                " WHERE seq = (SELECT MIN(seq) FROM harel_transport_messages WHERE group_id = ?)",
                (locked_by, expiry, group),
            )
    return path


def schema_objects(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_a_queue_in_use_is_upgraded_to_claim_times_and_its_groups_in_flight_stay_in_flight(tmp_path):
    path = earlier_queue_file(tmp_path)
    now = [1000.0]
    t = LibsqlTransport(path, lambda: now[0])
    # Read through the transport's connection while it is open (one SQLite library a process).
    cols = lambda table: [row[1] for row in t.execute(f"PRAGMA table_info({table})")]  # noqa: E731
    objects = lambda: t.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")  # noqa: E731
    try:
        assert cols("harel_transport_groups").count("claimable_at") == 1
        assert cols("harel_transport_messages").count("claimed_at") == 1
        names = {name for _type, name, _sql in objects()}
        assert "harel_transport_on_claim" not in names, "the trigger that stamped deadlines is dropped"
        assert "harel_transport_groups_by_routing_key" not in names
        assert {"harel_transport_on_claim_v7", "harel_transport_groups_by_claimable"} <= names
        assert dict(t.execute("SELECT group_id, claimable_at FROM harel_transport_groups")) == {
            "leased": 1300.0,
            "parked": 1050.0,
            "free": 990.0,
        }, "each group's next claimable time is read from its head's lock"
        assert drain(t) == ["free:1", "free:2"], "only the group whose lease ended is claimable"
        now[0] = 1051.0
        assert drain(t) == ["parked:1", "parked:2"]
        now[0] = 1301.0
        assert drain(t) == ["leased:1", "leased:2"]
    finally:
        t.close()
    before = schema_objects(path)
    LibsqlTransport(path).close()
    assert schema_objects(path) == before, "upgrading again changes nothing"
    assert user_version(path) == migrations.SCHEMA_VERSION


def test_harel_and_harel_edge_sharing_a_file_see_each_others_leases(tmp_path):
    path = str(tmp_path / "shared.db")
    now = [1000.0]
    edge = LibsqlTransport(path, lambda: now[0])
    harel = HarelSqliteTransport(path, clock=lambda: now[0])
    try:
        for group in ("G", "H"):
            harel.publish(group, Event(kind=f"{group}:1"))
            harel.publish(group, Event(kind=f"{group}:2"))
        held = harel.claim("harel", 30)
        assert held.group_id == "G"
        lease = edge.claim("edge", 30)
        assert lease.group_id == "H", "the group harel holds is in flight for harel_edge"
        edge.ack(lease)
        assert edge.claim("edge", 30).group_id == "H", "G is still harel's"
        harel.ack(held)
        now[0] += 1
        assert edge.claim("edge", 30).event.kind == "G:2", "acked by harel, its group is free again"
        with sqlite3.connect(path) as db:
            (stamp,), = db.execute("SELECT last_claimed_at FROM harel_transport_groups WHERE group_id = 'G'")
        assert stamp == 1001.0, "harel_edge stamps the claim time, as harel does"
    finally:
        harel.close()
        edge.close()
