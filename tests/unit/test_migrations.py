"""The numbered schema versions: each applied once, in one transaction with its bump, from every
earlier schema (harel 0.9's own tables included), by one process or by several at once."""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harel.engine.store import SqliteStore
from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport
from harel.engine.transport import SqliteTransport as HarelSqliteTransport
from harel.spec.states import Event

from harel_edge import migration, migrations, schema_harel
from harel_edge.errors import NotADatabaseError, SchemaTooNewError
from harel_edge.executor import Result, Stmt, open_executor
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import spawned
from harel_edge.testing.spawned import answers

FIXTURES = Path(__file__).parent / "schemas"  # 5 and 6 as the re-converging releases left them
LATEST = migrations.SCHEMA_VERSION
EVERY = tuple(v.number for v in migrations.VERSIONS)


def executing(db: sqlite3.Connection):
    return lambda sql, params=(): db.execute(sql, params).fetchall()


class SqliteUnits:
    """The executor's two calls the schema step makes, on one sqlite3 connection (any SQLite the
    versions must work on): a transaction unit is BEGIN IMMEDIATE ... COMMIT, rolled back whole
    if a statement fails. Notes each unit, and calls `on_read(sql)` after each read."""

    def __init__(self, db: sqlite3.Connection, on_read=None) -> None:  # noqa: ANN001
        self.db, self.units, self.on_read = db, [], on_read

    async def execute(self, stmt: Stmt) -> Result:
        self.units.append(("execute", stmt.sql))
        rows = self.db.execute(stmt.sql, stmt.args).fetchall()
        if self.on_read is not None:
            self.on_read(stmt.sql)
        return Result(rows)

    async def transaction(self, stmts: list[Stmt]) -> list[Result]:
        self.units.append(("transaction", [s.sql for s in stmts]))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            results = [Result(self.db.execute(s.sql, s.args).fetchall()) for s in stmts]
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return results


def open_db(path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def objects(path) -> dict:
    """Every object by (type, name): a table by its columns, anything else by its SQL."""
    with sqlite3.connect(path) as db:
        found = {}
        for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"):
            found[kind, name] = (
                db.execute(f"PRAGMA table_xinfo({name})").fetchall() if kind == "table" else " ".join(sql.split())
            )
        return found


def user_version(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def queued(path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT seq, group_id, event FROM harel_transport_messages ORDER BY seq").fetchall()


def upgrade(path, prefix="harel") -> migrations.Outcome:
    db = open_db(path)
    try:
        return asyncio.run(migrations.upgrade_async(SqliteUnits(db), prefix))
    finally:
        db.close()


def applied_up_to(path, last: int) -> None:
    """A database as this code leaves it after version `last`: the versions up to it, applied."""
    db = open_db(path)
    found = at = 0
    while (unit := migrations.plan(found, at)) is not None and unit.version <= last:
        asyncio.run(SqliteUnits(db).transaction([Stmt(sql) for sql in unit.statements]))
        found, at = db.execute(migrations.state_sql()).fetchone()
    db.close()


def legacy(path, version: int, *, with_store: bool) -> None:
    """A database as the re-converging release of `version` made it, with three messages in use
    and a workflow waiting; `with_store`: harel's store tables too, as a worker's schema step made them."""
    db = open_db(path)
    db.executescript((FIXTURES / f"v{version}.sql").read_text())
    if with_store:
        for statement in schema_harel.harel_tables():
            db.execute(statement)
    for group, kind in (("G", "g1"), ("G", "g2"), ("H", "h1")):
        db.execute("INSERT INTO harel_transport_publish (group_id, event) VALUES (?, ?)", (group, kind))
    db.execute("INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES ('ns', 'w1', 100.0)")
    db.close()


def harel_file(path, kind: str) -> None:
    """A database harel 0.9 made itself: its transport's tables (no routing_key), its store's."""
    transports = {"SqliteTransport": HarelSqliteTransport, "LibsqlTransport": HarelLibsqlTransport}
    if kind == "SqliteStore+SqliteTransport":
        SqliteStore(str(path)).close()
        kind = "SqliteTransport"
    old = transports[kind](str(path))
    for group, event in (("G", "g1"), ("G", "g2"), ("H", "h1")):
        old.publish(group, Event(kind=event))
    old.close()


SOURCES = {
    "new": lambda path: None,
    "harel 0.9 SqliteTransport": lambda path: harel_file(path, "SqliteTransport"),
    "harel 0.9 LibsqlTransport": lambda path: harel_file(path, "LibsqlTransport"),
    "harel 0.9 SqliteStore and SqliteTransport": lambda path: harel_file(path, "SqliteStore+SqliteTransport"),
    "version 4": lambda path: applied_up_to(path, 4),
    "version 5": lambda path: applied_up_to(path, 5),
    "version 6": lambda path: applied_up_to(path, 6),
    "version 5 of the re-converging release": lambda path: legacy(path, 5, with_store=True),
    "version 5 of the re-converging release, transport only": lambda path: legacy(path, 5, with_store=False),
    "version 6 of the re-converging release": lambda path: legacy(path, 6, with_store=True),
    "version 6 of the re-converging release, transport only": lambda path: legacy(path, 6, with_store=False),
}


@pytest.fixture(scope="module")
def latest(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("latest") / "latest.db"
    upgrade(path)
    return objects(path)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_earlier_schema_is_upgraded_to_exactly_the_schema_a_new_database_gets(source, latest, tmp_path):
    path = tmp_path / "db.db"
    SOURCES[source](path)
    messages = queued(path) if ("table", "harel_transport_messages") in objects(path) else []
    done = upgrade(path)
    assert objects(path) == latest
    assert user_version(path) == LATEST == done.version
    assert queued(path) == messages, "every message kept, in its order"
    assert upgrade(path).applied == (), "a second run finds nothing to do"
    assert objects(path) == latest


def test_a_queue_in_use_keeps_its_messages_and_waiting_workflow_through_the_upgrade(tmp_path):
    path = tmp_path / "v5.db"
    legacy(path, 5, with_store=True)
    assert upgrade(path) == migrations.Outcome(5, LATEST, tuple(range(6, LATEST + 1)))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT group_id, event FROM harel_transport_messages ORDER BY seq").fetchall() == [
            ("G", "g1"), ("G", "g2"), ("H", "h1")
        ]
        assert db.execute("SELECT workflow, visible_at, generation FROM workflow_queue").fetchall() == [("w1", 100.0, 0)]


def test_a_new_database_gets_each_version_in_its_own_transaction_with_its_bump(tmp_path):
    executor = SqliteUnits(open_db(tmp_path / "new.db"))
    done = asyncio.run(migrations.upgrade_async(executor))
    assert done.applied == EVERY
    assert [kind for kind, _ in executor.units] == ["execute", "transaction"] * len(EVERY) + ["execute"]
    units = [sql for kind, sql in executor.units if kind == "transaction"]
    assert [[s for s in unit if s.startswith("PRAGMA user_version")] for unit in units] == [
        [f"PRAGMA user_version = {n}"] for n in EVERY
    ]
    assert all(unit[0].startswith("SELECT abs(") for unit in units), "each re-reads the state inside its transaction first"
    assert all(sql.startswith("SELECT") for kind, sql in executor.units if kind == "execute"), "only reads outside"


def test_a_second_prefix_gets_every_version_for_its_own_tables_and_leaves_the_first_alone(tmp_path):
    path = tmp_path / "two.db"
    assert upgrade(path, "alpha").applied == EVERY
    before = objects(path)
    done = upgrade(path, "beta")
    assert done == migrations.Outcome(LATEST, LATEST, EVERY)
    after = objects(path)
    assert {key: value for key, value in after.items() if key in before} == before
    assert {name for _kind, name in after if name not in {n for _k, n in before}} == {
        name.replace("alpha", "beta") for _kind, name in before if name.startswith("alpha")
    }


def test_what_is_missing_is_read_without_writing_anything(tmp_path):
    path = tmp_path / "v5.db"
    legacy(path, 5, with_store=True)
    before = path.read_bytes()
    db = open_db(path)
    assert migrations.missing(executing(db)) == tuple(range(6, LATEST + 1))
    assert migrations.missing(executing(db), "other") == EVERY
    db.close()
    assert path.read_bytes() == before
    upgrade(path)
    with sqlite3.connect(path) as db:
        assert migrations.missing(executing(db)) == ()
        db.execute(f"PRAGMA user_version = {LATEST + 1}")
        with pytest.raises(SchemaTooNewError):
            migrations.missing(executing(db))


def test_a_plan_another_process_made_stale_is_refused_inside_its_transaction_and_skipped(tmp_path):
    path = tmp_path / "stale.db"
    db, reads = open_db(path), []

    def on_read(sql: str) -> None:
        if sql == migrations.state_sql() and not reads:  # everything lands between our read and our unit
            with ThreadPoolExecutor(1) as other:
                other.submit(upgrade, path).result()
        reads.append(sql)

    assert asyncio.run(migrations.upgrade_async(SqliteUnits(db, on_read))) == migrations.Outcome(0, LATEST, ())
    db.close()
    assert user_version(path) == LATEST


def test_a_version_that_fails_leaves_nothing_of_itself_and_the_next_start_completes(tmp_path, monkeypatch):
    path = tmp_path / "fails.db"
    applied_up_to(path, LATEST - 1)
    before = objects(path)
    good = migrations.VERSIONS[-1]
    broken = migrations.Version(good.number, good.summary, good.shared, lambda p: [*good.prefixed(p), "SELEC oops"], good.marks)
    monkeypatch.setattr(migrations, "VERSIONS", (*migrations.VERSIONS[:-1], broken))
    with pytest.raises(sqlite3.OperationalError, match="syntax error"):
        upgrade(path)
    assert (objects(path), user_version(path)) == (before, LATEST - 1), "nothing of the last version, not even its shared part"
    monkeypatch.undo()
    assert upgrade(path).applied == (LATEST,)


def test_a_newer_database_is_refused_and_left_byte_for_byte(tmp_path):
    path = tmp_path / "newer.db"
    upgrade(path)
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {LATEST + 1}")
    before = path.read_bytes()
    with pytest.raises(SchemaTooNewError, match="upgrade harel_edge here"):
        upgrade(path)
    with pytest.raises(SchemaTooNewError, match="upgrade harel_edge here"):
        migration.migrate(ExplicitSettings.load(db_path=str(path)))
    assert path.read_bytes() == before


def test_a_file_that_is_not_a_database_is_refused_and_left_byte_for_byte(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    with pytest.raises(NotADatabaseError, match="not a SQLite/libSQL database"):
        migration.migrate(ExplicitSettings.load(db_path=str(path)))
    assert path.read_bytes() == b"these are my notes, not a database\n" * 200


def test_the_printed_versions_build_the_schema_a_migration_builds(latest, tmp_path):
    path = tmp_path / "tool.db"
    with sqlite3.connect(path) as db:
        db.executescript(migration.migration_script("harel"))
    assert objects(path) == latest and user_version(path) == LATEST


def test_the_printed_versions_upgrade_a_harel_09_database(latest, tmp_path):
    path = tmp_path / "harel.db"
    harel_file(path, "SqliteTransport")
    with sqlite3.connect(path) as db:
        db.executescript(migration.migration_script("harel"))
    assert objects(path) == latest


def test_the_printed_versions_stop_at_a_version_the_database_already_has_and_change_nothing(tmp_path):
    path = tmp_path / "v5.db"
    legacy(path, 5, with_store=True)
    before = objects(path)
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.OperationalError, match="integer overflow"):
        db.executescript(migration.migration_script("harel"))
    assert (objects(path), user_version(path)) == (before, 5)


def _race(path: str, barrier, gate, results) -> None:
    """One process's start: its own libsql connection; with `gate`, it waits after each read of
    the state until its peer has read too, so both plan every version from the same state."""
    executor = open_executor(ExplicitSettings.load(db_path=path))

    class Gated:
        """The executor, waiting after each read of the state until the peer has read too."""

        async def execute(self, stmt: Stmt) -> Result:
            result = await executor.execute(stmt)
            if gate is not None and stmt.sql == migrations.state_sql():
                gate.wait(timeout=60)
            return result

        async def transaction(self, stmts: list[Stmt]) -> list[Result]:
            return await executor.transaction(stmts)

    async def start() -> tuple[int, ...]:
        try:
            return (await migrations.upgrade_async(Gated())).applied
        finally:
            await executor.aclose()

    try:
        barrier.wait(timeout=60)
        results.put(asyncio.run(start()))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("source", ["new", "harel 0.9 SqliteTransport"])
@pytest.mark.parametrize("interleaving", ["as scheduled", "both read the state before either writes"])
def test_two_processes_migrating_one_file_at_once_both_succeed_and_each_version_is_applied_once(
    source, interleaving, latest, tmp_path
):
    ctx = spawned.context()
    for attempt in range(2):
        path = tmp_path / f"race{attempt}.db"
        SOURCES[source](path)
        barrier, results = ctx.Barrier(2), ctx.Queue()
        gate = ctx.Barrier(2) if interleaving.startswith("both") else None
        outcomes = answers(ctx, _race, [(str(path), barrier, gate, results)] * 2, results, timeout=90)
        assert all(isinstance(o, tuple) for o in outcomes), outcomes
        assert sorted(outcomes[0] + outcomes[1]) == list(EVERY), f"each version once: {outcomes}"
        assert objects(path) == latest and user_version(path) == LATEST


def test_version_4_is_the_schema_the_installed_harel_creates():
    from harel.engine.schema import sql_schema

    from harel_edge.schema_harel import harel_tables

    assert harel_tables("edge_x") == list(sql_schema("sqlite", "edge_x"))
