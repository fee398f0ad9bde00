"""Database.run / aclose: one caller in the connection at a time, even when callers are cancelled."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
from pathlib import Path

import pytest

from harel_edge import migrations
from harel_edge.durable import DatabaseClosedError, connect, migrate
from harel_edge.errors import SchemaTooNewError
from harel_edge.settings import EdgeSettings


@pytest.fixture
def settings(tmp_path) -> EdgeSettings:  # noqa: ANN001
    return EdgeSettings(db_path=str(tmp_path / "durable.db"))


def test_cancelled_callers_never_lose_a_write_nor_write_into_another_callers_transaction(settings) -> None:  # noqa: ANN001
    """Single writes queue up behind transactions that always roll back, and each transaction's
    caller is cancelled while its transaction is open (the moment that matters: a caller still
    waiting for the guard has nothing to leave behind). Every write whose statement returned
    must be in the file, and nothing written inside the rolled-back transactions may be: a
    write that slipped into one of them would be rolled back with it, after its caller had
    been told it was written."""
    returned: set[int] = set()
    lock = threading.Lock()
    doomed = {caller: threading.Event() for caller in range(0, 150, 3)}

    def single_write(caller: int):
        def work(connection):  # noqa: ANN001
            connection.execute("INSERT INTO log (caller, rolled_back) VALUES (?, 0)", (caller,))
            with lock:
                returned.add(caller)

        return work

    def doomed_transaction(caller: int, loop: asyncio.AbstractEventLoop, entered: asyncio.Queue):
        def work(connection):  # noqa: ANN001
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.execute("INSERT INTO log (caller, rolled_back) VALUES (?, 1)", (caller,))
                loop.call_soon_threadsafe(entered.put_nowait, caller)
                doomed[caller].wait()  # until its caller has been cancelled
                connection.execute("INSERT INTO log (caller, rolled_back) VALUES (?, 1)", (caller,))
            finally:
                connection.execute("ROLLBACK")

        return work

    async def scenario() -> None:
        loop, entered = asyncio.get_running_loop(), asyncio.Queue()
        database = connect(settings)
        await database.run(
            lambda c: c.execute(
                "CREATE TABLE log (id INTEGER PRIMARY KEY, caller INTEGER, rolled_back INTEGER)"
            )
        )
        tasks = [
            asyncio.create_task(
                database.run(
                    doomed_transaction(caller, loop, entered) if caller in doomed else single_write(caller)
                )
            )
            for caller in range(150)
        ]
        for _ in doomed:
            caller = await entered.get()
            assert tasks[caller].cancel()
            for _ in range(100):  # give the next caller every chance to get in, were it let in
                await asyncio.sleep(0)
            doomed[caller].set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await database.aclose()  # waits for every thread a cancelled caller left behind
        assert sum(isinstance(result, asyncio.CancelledError) for result in results) == len(doomed)

    asyncio.run(scenario())
    with sqlite3.connect(settings.db_path) as check:
        written = {caller for (caller,) in check.execute("SELECT caller FROM log WHERE rolled_back = 0")}
        leaked = check.execute("SELECT count(*) FROM log WHERE rolled_back = 1").fetchone()[0]
    assert len(returned) == 150 - len(doomed)
    assert written == returned  # every write that returned is there, and only those
    assert leaked == 0


def test_a_cancelled_caller_unwinds_at_once_while_the_next_waits_for_its_statement(settings) -> None:  # noqa: ANN001
    async def scenario() -> None:
        database = connect(settings)
        inside, leave = threading.Event(), threading.Event()
        order: list[str] = []

        def slow(connection):  # noqa: ANN001
            inside.set()
            leave.wait()
            order.append("slow finished")

        def next_one(connection):  # noqa: ANN001
            order.append("next ran")

        first = asyncio.create_task(database.run(slow))
        await asyncio.to_thread(inside.wait)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first  # unwinds while its thread is still inside the connection
        second = asyncio.create_task(database.run(next_one))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not second.done() and order == []
        leave.set()
        await second
        assert order == ["slow finished", "next ran"]
        await database.aclose()

    asyncio.run(scenario())


def test_aclose_waits_for_a_statement_left_running_by_a_cancelled_caller(settings) -> None:  # noqa: ANN001
    async def scenario() -> None:
        database = connect(settings)
        inside, leave = threading.Event(), threading.Event()

        def slow(connection):  # noqa: ANN001
            inside.set()
            leave.wait()
            connection.execute("SELECT 1")  # would touch a freed connection if closed meanwhile

        caller = asyncio.create_task(database.run(slow))
        await asyncio.to_thread(inside.wait)
        caller.cancel()
        closing = asyncio.create_task(database.aclose())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not closing.done() and database.connection.raw is not None
        leave.set()
        await closing
        assert database.connection.raw is None
        with pytest.raises(DatabaseClosedError):
            await database.run(lambda c: c.execute("SELECT 1"))
        await database.aclose()  # a second close is harmless

    asyncio.run(scenario())


def test_a_statement_that_fails_after_its_caller_left_is_reported_to_the_event_loop(settings) -> None:  # noqa: ANN001
    reported: list[BaseException] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context.get("exception"))
        )
        database = connect(settings)
        inside, leave = threading.Event(), threading.Event()

        def failing(connection):  # noqa: ANN001
            inside.set()
            leave.wait()
            connection.execute("INSERT INTO no_such_table VALUES (1)")

        caller = asyncio.create_task(database.run(failing))
        await asyncio.to_thread(inside.wait)
        caller.cancel()
        leave.set()
        await database.aclose()  # returns once the failed statement's thread is done
        gc.collect()

    asyncio.run(scenario())
    assert any("no_such_table" in str(error) for error in reported)


def test_migrate_is_idempotent_and_records_the_schema_version(settings) -> None:  # noqa: ANN001
    async def scenario() -> tuple[int, int, list]:
        database = connect(settings)
        first = await migrate(database)
        second = await migrate(database)
        version = await database.run(lambda c: c.execute("PRAGMA user_version"))
        await database.aclose()
        return first, second, version

    first, second, version = asyncio.run(scenario())
    assert (first, second) == (0, migrations.SCHEMA_VERSION)
    assert version == [(migrations.SCHEMA_VERSION,)]


def test_migrate_from_several_connections_at_once_succeeds_everywhere(settings) -> None:  # noqa: ANN001
    async def scenario() -> list:
        databases = [connect(settings) for _ in range(4)]
        results = await asyncio.gather(*(migrate(d) for d in databases), return_exceptions=True)
        for database in databases:
            await database.aclose()
        return results

    results = asyncio.run(scenario())
    assert all(isinstance(result, int) for result in results), results


def test_a_database_from_a_newer_harel_edge_is_refused_and_left_untouched(settings) -> None:  # noqa: ANN001
    with sqlite3.connect(settings.db_path) as newer:
        newer.execute(f"PRAGMA user_version = {migrations.SCHEMA_VERSION + 1}")

    async def scenario() -> None:
        database = connect(settings)
        try:
            with pytest.raises(SchemaTooNewError, match="upgrade harel_edge"):
                await migrate(database)
        finally:
            await database.aclose()

    asyncio.run(scenario())
    with sqlite3.connect(settings.db_path) as check:
        assert check.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        assert check.execute("PRAGMA user_version").fetchone()[0] == migrations.SCHEMA_VERSION + 1


def test_the_local_profile_is_durable_rather_than_merely_persistent(settings) -> None:  # noqa: ANN001
    async def scenario() -> tuple:
        database = connect(settings)
        pragmas = await database.run(
            lambda c: (
                c.execute("PRAGMA journal_mode")[0][0],
                c.execute("PRAGMA synchronous")[0][0],
                c.execute("PRAGMA busy_timeout")[0][0],
            )
        )
        await database.aclose()
        return pragmas

    assert asyncio.run(scenario()) == ("wal", 2, 5000)  # synchronous 2 is FULL


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_connect_given_a_path_opens_the_local_file_there_whatever_the_environment_says(
    as_path, tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.setenv("HAREL_EDGE_PROFILE", "sqld")  # an explicit path is not overridden by these
    monkeypatch.setenv("HAREL_EDGE_URL", "http://127.0.0.1:9")
    path = tmp_path / "given.db"

    async def scenario() -> str:
        database = connect(as_path(path))
        try:
            await migrate(database)
            return database.profile
        finally:
            await database.aclose()

    assert asyncio.run(scenario()) == "local"
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == migrations.SCHEMA_VERSION
