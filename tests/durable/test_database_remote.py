"""The durable Database on sqld and replica: every statement is Hrana from this event loop.

What must hold as on a local file: a cancelled caller's work finishing before its connection is
given up, `aclose` waiting for it, a caller's own transaction kept apart from everyone else's.
What is new: no driver connection and no other process; work that needs a connection gets a
Hrana stream of its own; an SQL effect and its record are one request. Loop freedom is judged
by counting ticks, never by durations.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import libsql
import pytest

from harel_edge.durable import (
    DatabaseClosedError,
    FencedError,
    LibsqlCheckpointer,
    LibsqlScheduler,
    SqlEffect,
    connect,
    migrate,
)
from harel_edge.executor import StatementError
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import EdgeSettings
from harel_edge.testing import spawned
from harel_edge.testing.loop import ticks_during
from harel_edge.testing.proxy import LatencyProxy

pytestmark = pytest.mark.sqld

BUDGET = timedelta(minutes=10)
ALIVE = timedelta(seconds=30)

# ---- work handed a connection ------------------------------------------------------------------


def create_table(connection, table: str) -> None:
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, v TEXT)")


def write_one(connection, table: str, value: str) -> None:
    connection.execute(f"INSERT INTO {table} (v) VALUES (?)", (value,))


def read_all(connection, table: str) -> list[tuple]:
    return connection.execute(f"SELECT v FROM {table} ORDER BY id")


def held_transaction(connection, table: str, inside: str, release: str, end: str) -> None:
    """BEGIN IMMEDIATE, one insert, then hold the transaction until `release` exists; `end` it."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute(f"INSERT INTO {table} (v) VALUES ('held')")
    Path(inside).touch()
    while not Path(release).exists():
        time.sleep(0.005)
    connection.execute(end)


def held_read(connection, inside: str, release: str) -> None:
    """Keep a stream busy without holding the primary's write lock."""
    connection.execute("SELECT 1")
    Path(inside).touch()
    while not Path(release).exists():
        time.sleep(0.005)


def report_from_a_daemon(settings: dict, answer) -> None:  # noqa: ANN001 - a Connection
    """A daemonic process (which may not start children) uses the durable Database as any other."""

    async def look() -> tuple[list, int]:
        database = connect(EdgeSettings(**settings))
        try:
            return await database.run(lambda c: c.execute("SELECT 1")), len(multiprocessing.active_children())
        finally:
            await database.aclose()

    answer.send(asyncio.run(look()))


# ---- helpers -------------------------------------------------------------------------------------


def sqld(server, **overrides) -> EdgeSettings:
    return EdgeSettings(profile="sqld", url=server.http_url, auth_token=server.rw_token, **overrides)


def replica(server, path: Path) -> EdgeSettings:
    return EdgeSettings(
        profile="replica", sync_url=server.http_url, auth_token=server.rw_token, db_path=str(path)
    )


async def until(predicate, what: str) -> None:
    """Poll, never a fixed sleep, for something another thread does."""
    for _ in range(6000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"gave up waiting for {what}")


async def spin(times: int = 20) -> None:
    """Give the loop chances to do the wrong thing (a task that must stay blocked)."""
    for _ in range(times):
        await asyncio.sleep(0.005)


def table_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


EFFECTS = "CREATE TABLE IF NOT EXISTS durable_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"


# ---- tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_connect_on_a_remote_profile_speaks_hrana_from_this_process_with_no_driver_connection(
    profile, sqld_primary, tmp_path
) -> None:
    settings = sqld(sqld_primary) if profile == "sqld" else replica(sqld_primary, tmp_path / "r.db")

    async def scenario() -> tuple[object, object, list, int]:
        database = connect(settings)
        try:
            rows = await database.execute("test.select", "SELECT 41 + 1")
            return database.connection, database.executor, rows, len(multiprocessing.active_children())
        finally:
            await database.aclose()

    connection, executor, rows, children = asyncio.run(scenario())
    assert connection is None and isinstance(executor, HranaExecutor)
    assert rows == [(42,)] and children == 0
    assert not (tmp_path / "r.db").exists(), "a replica's durable Database opens no embedded file"


def test_a_cancelled_callers_transaction_runs_to_its_end_and_never_takes_in_another_callers_write(
    sqld_primary, tmp_path
) -> None:
    table = table_name()
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            caller = asyncio.create_task(database.run(held_transaction, table, inside, release, "ROLLBACK"))
            await until(lambda: Path(inside).exists(), "the transaction to be open on its stream")
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            after = asyncio.create_task(database.call("test.write", write_one, table, "after"))
            await spin()
            Path(release).touch()
            await after
            return await database.run(read_all, table)
        finally:
            Path(release).touch()
            await database.aclose()

    assert asyncio.run(scenario()) == [("after",)], "the write after is kept, the rolled-back one is not"


def test_aclose_waits_for_a_cancelled_callers_work_to_reach_its_commit(sqld_primary, tmp_path) -> None:
    table = table_name()
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        await database.run(create_table, table)
        caller = asyncio.create_task(database.run(held_transaction, table, inside, release, "COMMIT"))
        await until(lambda: Path(inside).exists(), "the transaction to be open on its stream")
        caller.cancel()
        closing = asyncio.create_task(database.aclose())
        await spin()
        waited = not closing.done()
        Path(release).touch()
        assert waited, "aclose waits for the work still running"
        await closing
        with pytest.raises(DatabaseClosedError):
            await database.run(read_all, table)
        check = connect(sqld(sqld_primary))
        try:
            return await check.run(read_all, table)
        finally:
            await check.aclose()

    assert asyncio.run(scenario()) == [("held",)], "the cancelled caller's transaction ran to its COMMIT"


def test_an_aclose_cancelled_while_it_waits_still_closes_and_a_second_aclose_waits_for_it(sqld_primary, tmp_path) -> None:
    table = table_name()
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def scenario() -> tuple[bool, bool]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            work = asyncio.create_task(database.run(held_transaction, table, inside, release, "COMMIT"))
            await until(lambda: Path(inside).exists(), "the transaction to be open on its stream")
            first = asyncio.create_task(database.aclose())
            await spin()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            Path(release).touch()
            await database.aclose()
            await work
            return database.executor.closed, database.executor.http.closed
        finally:
            Path(release).touch()

    assert asyncio.run(scenario()) == (True, True), "the executor and its HTTP client were closed"


def held_until_told(connection, table: str, inside: str, proceed: str, begin: str, end: str) -> list[str]:
    """A transaction that holds the write lock until told, then tries to go on and commit."""
    connection.execute(begin)
    connection.execute(f"INSERT INTO {table} (v) VALUES ('a')")
    Path(inside).touch()
    while not Path(proceed).exists():
        time.sleep(0.005)
    outcomes = []
    # The first statement learns that sqld ended the transaction; an effect that swallows that
    # error and goes on must not get its next statement committed on its own.
    for sql in (f"INSERT INTO {table} (v) VALUES ('b')", f"INSERT INTO {table} (v) VALUES ('c')", end):
        try:
            connection.execute(sql)
            outcomes.append("ran")
        except StatementError as exc:
            outcomes.append(exc.code or str(exc))
    return outcomes


# The stream learns that a transaction is open from the primary, whatever statement opened it.
@pytest.mark.parametrize(("begin", "end"), [("BEGIN IMMEDIATE", "COMMIT"), ("  savepoint outer", "RELEASE outer")])
def test_after_sqld_ends_a_transaction_that_held_the_lock_too_long_nothing_of_it_commits(
    sqld_primary, tmp_path, begin: str, end: str
) -> None:
    table = table_name()
    inside, proceed = str(tmp_path / "inside"), str(tmp_path / "proceed")

    async def scenario() -> tuple[list[str], list[tuple]]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            holder = asyncio.create_task(database.run(held_until_told, table, inside, proceed, begin, end))
            await until(lambda: Path(inside).exists(), "the transaction to hold the write lock")
            # Another writer waits for the lock; sqld ends the holder's transaction after its
            # timeout (about 5 s) and lets this write in.
            await database.execute("test.other", f"INSERT INTO {table} (v) VALUES ('other')")
            Path(proceed).touch()
            outcomes = await holder
            return outcomes, await database.run(read_all, table)
        finally:
            Path(proceed).touch()
            await database.aclose()

    outcomes, rows = asyncio.run(scenario())
    assert outcomes[1:] == ["TRANSACTION_TIMEOUT", "TRANSACTION_TIMEOUT"], f"refused, not run in autocommit: {outcomes}"
    assert rows == [("other",)], "nothing of the ended transaction, nor what followed it, was committed"


def test_work_of_any_kind_runs_on_a_thread_here_with_its_statements_on_one_stream(sqld_primary) -> None:
    table = table_name()
    threads: list[int] = []

    def closure(connection):  # noqa: ANN001
        threads.append(threading.get_ident())
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(f"INSERT INTO {table} (v) VALUES ('a')")
        connection.execute(f"INSERT INTO {table} (v) VALUES ('b')")
        connection.execute("COMMIT")
        return connection.in_transaction

    async def scenario() -> tuple[bool, list[tuple]]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            left_open = await database.run(closure)
            return left_open, await database.run(read_all, table)
        finally:
            await database.aclose()

    left_open, rows = asyncio.run(scenario())
    assert threads and threads[0] != threading.get_ident(), "the closure ran on a thread of this process"
    assert not left_open and rows == [("a",), ("b",)]


def test_a_transaction_left_open_by_work_is_rolled_back_when_its_stream_closes(sqld_primary) -> None:
    table = table_name()

    def leave_open(connection):  # noqa: ANN001
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(f"INSERT INTO {table} (v) VALUES ('dropped')")

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            await database.run(leave_open)
            await database.call("test.write", write_one, table, "kept")  # the write lock is free again
            return await database.run(read_all, table)
        finally:
            await database.aclose()

    assert asyncio.run(scenario()) == [("kept",)]


def test_executemany_on_a_remote_stream_writes_every_row(sqld_primary) -> None:
    table = table_name()

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            await database.run(lambda c: c.executemany(f"INSERT INTO {table} (v) VALUES (?)", [("1",), ("2",), ("3",)]))
            return await database.run(read_all, table)
        finally:
            await database.aclose()

    assert asyncio.run(scenario()) == [("1",), ("2",), ("3",)]


@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_a_transact_whose_effect_is_sql_goes_out_with_its_record_as_one_request_and_applies_once(
    profile, sqld_primary, tmp_path
) -> None:
    workflow = f"wf-{uuid.uuid4().hex[:12]}"
    settings = sqld(sqld_primary) if profile == "sqld" else replica(sqld_primary, tmp_path / "r.db")
    effect = SqlEffect(("INSERT INTO durable_effects (workflow, step) VALUES (?, 'charge')", (workflow,)), value="ch-1")

    async def scenario() -> tuple[object, int, object, list[tuple]]:
        database = connect(settings)
        try:
            await migrate(database)
            await database.execute("test.effects", EFFECTS)
            checkpointer = LibsqlCheckpointer(database)
            holder = await checkpointer.claim(workflow, BUDGET, ALIVE)
            before = database.executor.exchanges
            first = await checkpointer.transact(holder, "charge", effect)
            exchanges = database.executor.exchanges - before
            again = await checkpointer.transact(holder, "charge", effect)
            rows = await database.execute(
                "test.read", "SELECT step FROM durable_effects WHERE workflow = ?", (workflow,)
            )
            return first, exchanges, again, rows
        finally:
            await database.aclose()

    first, exchanges, again, rows = asyncio.run(scenario())
    assert first == "ch-1" and exchanges == 1, "fence, effect and record in one HTTP exchange"
    assert again == "ch-1" and rows == [("charge",)], "the replay performed nothing"


def test_a_superseded_pass_and_a_failing_statement_apply_nothing_of_an_sql_effect(sqld_primary) -> None:
    workflow = f"wf-{uuid.uuid4().hex[:12]}"

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        try:
            await migrate(database)
            await database.execute("test.effects", EFFECTS)
            checkpointer = LibsqlCheckpointer(database)
            holder = await checkpointer.claim(workflow, BUDGET, ALIVE)
            insert = ("INSERT INTO durable_effects (workflow, step) VALUES (?, 'bad')", (workflow,))
            with pytest.raises(StatementError, match="statement 1 of the effect"):
                await checkpointer.transact(holder, "bad", SqlEffect(insert, "INSERT INTO no_such_table VALUES (1)"))
            await checkpointer.release(holder)
            newer = await checkpointer.claim(workflow, BUDGET, ALIVE)
            assert newer is not None and newer.token == holder.token + 1
            with pytest.raises(FencedError):
                await checkpointer.transact(holder, "late", SqlEffect(insert))
            assert await checkpointer.load(workflow) == {}
            return await database.execute(
                "test.read", "SELECT step FROM durable_effects WHERE workflow = ?", (workflow,)
            )
        finally:
            await database.aclose()

    assert asyncio.run(scenario()) == [], "neither the failed unit nor the fenced one left a row"


def test_operations_of_the_stores_do_not_wait_for_a_callers_busy_stream(sqld_primary, tmp_path) -> None:
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")
    names = [f"wf-{uuid.uuid4().hex[:12]}" for _ in range(4)]

    async def scenario() -> set[str]:
        database = connect(sqld(sqld_primary))
        try:
            await migrate(database)
            scheduler = LibsqlScheduler(database, namespace=f"ns-{uuid.uuid4().hex[:8]}")
            busy = asyncio.create_task(database.run(held_read, inside, release))
            await until(lambda: Path(inside).exists(), "a stream to be busy")
            await asyncio.gather(*(scheduler.make_ready(name) for name in names))
            assert not busy.done(), "the operations finished while the stream was still busy"
            Path(release).touch()
            await busy
            taken = set()
            while (delivery := await scheduler.next_ready(timedelta(0))) is not None:
                taken.add(delivery.workflow)
            return taken
        finally:
            Path(release).touch()
            await database.aclose()

    assert asyncio.run(scenario()) == set(names)


def test_a_replica_database_reads_its_own_writes_at_once(fresh_sqld_primary, tmp_path) -> None:
    names = [f"wf-{uuid.uuid4().hex[:12]}" for _ in range(4)]

    async def scenario() -> list[tuple]:
        database = connect(replica(fresh_sqld_primary, tmp_path / "r.db"))
        try:
            await migrate(database)
            scheduler = LibsqlScheduler(database, namespace="own-writes")
            await asyncio.gather(*(scheduler.make_ready(name) for name in names))
            return await database.execute(
                "test.read", "SELECT workflow FROM workflow_queue WHERE namespace = 'own-writes'"
            )
        finally:
            await database.aclose()

    assert sorted(row[0] for row in asyncio.run(scenario())) == sorted(names)


@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_the_loop_keeps_ticking_while_a_durable_operation_crosses_a_slow_link(
    profile, fresh_sqld_primary, tmp_path
) -> None:
    async def scenario(proxy: LatencyProxy) -> dict[str, int]:
        if profile == "sqld":
            settings = sqld(fresh_sqld_primary).model_copy(update={"url": proxy.url})
        else:
            settings = replica(fresh_sqld_primary, tmp_path / "r.db").model_copy(update={"sync_url": proxy.url})
        counts = {}
        # libsql's own remote client on a thread, for comparison: it holds the GIL for its round trip.
        token = fresh_sqld_primary.rw_token
        driver = await asyncio.to_thread(libsql.connect, proxy.url, auth_token=token, isolation_level=None)
        try:
            counts["driver"], _ = await ticks_during(lambda: asyncio.to_thread(driver.execute, "SELECT 1"))
        finally:
            driver.close()
        database = connect(settings)
        try:
            await migrate(database)
            checkpointer = LibsqlCheckpointer(database)
            before = proxy.stats()["chunks_up"]
            workflow = f"wf-{uuid.uuid4().hex[:12]}"
            counts["hrana"], _ = await ticks_during(lambda: checkpointer.claim(workflow, BUDGET, ALIVE))
            assert proxy.stats()["chunks_up"] > before, "the claim went through the proxy"
        finally:
            await database.aclose()
        return counts

    with LatencyProxy(fresh_sqld_primary.http_port, delay=0.050) as proxy:  # each round trip >= 100 ms
        counts = asyncio.run(scenario(proxy))
    assert counts["hrana"] >= 20, f"the loop ticked during the claim: {counts}"
    assert counts["hrana"] >= 5 * (counts["driver"] + 1), f"far more than on a frozen loop: {counts}"


def test_in_a_daemonic_process_the_durable_database_works_and_starts_no_process(sqld_primary) -> None:
    context = spawned.context()
    ours, theirs = context.Pipe()
    settings = {"profile": "sqld", "url": sqld_primary.http_url, "auth_token": sqld_primary.rw_token}
    child = context.Process(target=report_from_a_daemon, args=(settings, theirs), daemon=True)
    child.start()
    try:
        assert ours.poll(120), "the daemonic process answered"
        rows, children = ours.recv()
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert rows == [(1,)] and children == 0
