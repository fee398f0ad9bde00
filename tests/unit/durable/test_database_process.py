"""The durable Database on sqld and replica: its connection lives in a worker process.

What must hold there as on a thread: one caller inside the connection at a time, a cancelled
caller's work finishing before anybody else gets in, `aclose` waiting for it. What is new: the
event loop keeps running while a statement travels to the primary, work that can be pickled
runs whole in the worker, work that cannot runs here with its statements sent over, and on
sqld operations without a transaction overlap on spare processes.

The work functions are module-level: a request is pickled to a spawned worker, which imports
this module to find them. Loop freedom is judged by counting ticks, never by durations.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from harel_edge.connection import EdgeConnection
from harel_edge.durable import (
    DatabaseClosedError,
    LibsqlCheckpointer,
    LibsqlScheduler,
    connect,
    migrate,
)
from harel_edge.settings import EdgeSettings
from harel_edge.testing.loop import ticks_during
from harel_edge.testing.proxy import LatencyProxy

pytestmark = pytest.mark.sqld

BUDGET = timedelta(minutes=10)
ALIVE = timedelta(seconds=30)

# ---- work that runs in the worker process ----------------------------------------------------


def create_table(connection, table: str) -> None:
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, v TEXT)")


def write_one(connection, table: str, value: str) -> None:
    connection.execute(f"INSERT INTO {table} (v) VALUES (?)", (value,))


def read_all(connection, table: str) -> list[tuple]:
    connection.sync()
    return connection.execute(f"SELECT v FROM {table} ORDER BY id")


def held_transaction(connection, table: str, inside: str, release: str, end: str) -> int:
    """BEGIN IMMEDIATE, one insert, then hold the transaction until `release` exists; `end` it."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute(f"INSERT INTO {table} (v) VALUES ('held')")
    Path(inside).touch()
    while not Path(release).exists():
        time.sleep(0.005)
    connection.execute(end)
    return os.getpid()


def held_read(connection, inside: str, release: str) -> int:
    """Keep the main connection busy without holding the primary's write lock."""
    connection.execute("SELECT 1")
    Path(inside).touch()
    while not Path(release).exists():
        time.sleep(0.005)
    return os.getpid()


def charge(workflow: str, tx) -> list:
    row = tx.execute(
        "INSERT INTO durable_effects (workflow, step) VALUES (?, 'charge') RETURNING id", (workflow,)
    )
    return [row[0][0], os.getpid()]


def report_design_in_a_daemon(settings: dict, answer) -> None:  # noqa: ANN001 - a Connection
    """A daemonic process's view: which design connect() chose, and whether it works."""

    async def look() -> tuple[int, bool, list]:
        database = connect(EdgeSettings(**settings))
        try:
            rows = await database.run(lambda c: c.execute("SELECT 1"))
            return database.processes, isinstance(database.connection, EdgeConnection), rows
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
    """Poll, never a fixed sleep, for something another process does."""
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


# ---- tests -----------------------------------------------------------------------------------------


def test_connect_on_sqld_puts_the_connection_in_a_worker_process_and_threads_when_asked(sqld_primary) -> None:
    async def scenario() -> tuple[int, int, bool]:
        pooled = connect(sqld(sqld_primary))
        threaded = connect(sqld(sqld_primary), async_processes=0)
        try:
            await pooled.start()
            started = pooled.processes
            await threaded.run(create_table, table_name())
            return started, threaded.processes, isinstance(threaded.connection, EdgeConnection)
        finally:
            await pooled.aclose()
            await threaded.aclose()

    started, threaded_processes, in_process = asyncio.run(scenario())
    assert started == 1
    assert threaded_processes == 0 and in_process


def test_a_cancelled_caller_in_the_worker_never_lets_the_next_caller_into_its_transaction(
    sqld_primary, tmp_path
) -> None:
    table = table_name()
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def scenario() -> list[tuple]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            caller = asyncio.create_task(database.run(held_transaction, table, inside, release, "ROLLBACK"))
            await until(lambda: Path(inside).exists(), "the transaction to be open in the worker")
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            after = asyncio.create_task(database.run(write_one, table, "after"))
            await spin()
            assert not after.done(), "the next caller waits while the cancelled one's transaction is open"
            Path(release).touch()
            await after
            return await database.run(read_all, table)
        finally:
            await database.aclose()

    assert asyncio.run(scenario()) == [("after",)], "the write after is kept, the rolled-back one is not"


def test_aclose_waits_for_a_cancelled_callers_work_and_then_no_worker_is_left(sqld_primary, tmp_path) -> None:
    table = table_name()
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def scenario() -> tuple[int, list[tuple]]:
        database = connect(sqld(sqld_primary))
        await database.run(create_table, table)
        caller = asyncio.create_task(database.run(held_transaction, table, inside, release, "COMMIT"))
        await until(lambda: Path(inside).exists(), "the transaction to be open in the worker")
        caller.cancel()
        closing = asyncio.create_task(database.aclose())
        await spin()
        assert not closing.done(), "aclose waits for the work still running in the worker"
        Path(release).touch()
        await closing
        with pytest.raises(DatabaseClosedError):
            await database.run(read_all, table)
        check = connect(sqld(sqld_primary))
        try:
            return database.processes, await check.run(read_all, table)
        finally:
            await check.aclose()

    processes, rows = asyncio.run(scenario())
    assert processes == 0
    assert rows == [("held",)], "the cancelled caller's transaction ran to its COMMIT"


def test_work_that_cannot_be_pickled_runs_here_with_its_statements_sent_to_the_worker(sqld_primary) -> None:
    table = table_name()
    threads: list[int] = []

    def closure(connection):  # a closure: it cannot travel, so it runs on a thread here
        threads.append(threading.get_ident())
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(f"INSERT INTO {table} (v) VALUES ('a')")
        connection.execute(f"INSERT INTO {table} (v) VALUES ('b')")
        connection.execute("COMMIT")
        return connection.in_transaction

    async def scenario() -> tuple[bool, list[tuple], int]:
        database = connect(sqld(sqld_primary))
        try:
            await database.run(create_table, table)
            left_open = await database.run(closure)
            return left_open, await database.run(read_all, table), database.processes
        finally:
            await database.aclose()

    left_open, rows, processes = asyncio.run(scenario())
    assert threads and threads[0] != threading.get_ident(), "the closure ran on a thread of this process"
    assert not left_open and rows == [("a",), ("b",)]
    assert processes == 1, "its statements went to the one worker process"


def test_a_transact_with_a_picklable_effect_runs_whole_in_the_worker_and_only_once(sqld_primary) -> None:
    workflow = f"wf-{uuid.uuid4().hex[:12]}"

    async def scenario() -> tuple[list, list, list[tuple]]:
        database = connect(sqld(sqld_primary))
        try:
            await migrate(database)
            await database.run(
                lambda c: c.execute(
                    "CREATE TABLE IF NOT EXISTS durable_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"
                )
            )
            checkpointer = LibsqlCheckpointer(database)
            holder = await checkpointer.claim(workflow, BUDGET, ALIVE)
            effect = functools.partial(charge, workflow)
            first = await checkpointer.transact(holder, "charge", effect)
            again = await checkpointer.transact(holder, "charge", effect)
            rows = await database.run(
                lambda c: c.execute("SELECT step FROM durable_effects WHERE workflow = ?", (workflow,))
            )
            return first, again, rows
        finally:
            await database.aclose()

    first, again, rows = asyncio.run(scenario())
    assert first[1] != os.getpid(), "the effect ran in the worker process"
    assert again == first and rows == [("charge",)], "the replay performed nothing"


def test_on_sqld_operations_without_a_transaction_overlap_on_spare_processes(sqld_primary, tmp_path) -> None:
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")
    names = [f"wf-{uuid.uuid4().hex[:12]}" for _ in range(4)]

    async def scenario() -> tuple[int, set[str]]:
        database = connect(sqld(sqld_primary, async_processes=4))
        try:
            await migrate(database)
            scheduler = LibsqlScheduler(database, namespace=f"ns-{uuid.uuid4().hex[:8]}")
            busy = asyncio.create_task(database.run(held_read, inside, release))
            await until(lambda: Path(inside).exists(), "the main connection to be busy")
            await asyncio.gather(*(scheduler.make_ready(name) for name in names))
            assert not busy.done(), "the operations finished while the main connection was still busy"
            processes = database.processes
            Path(release).touch()
            await busy
            taken = set()
            while (delivery := await scheduler.next_ready(timedelta(0))) is not None:
                taken.add(delivery.workflow)
            return processes, taken
        finally:
            Path(release).touch()
            await database.aclose()

    processes, taken = asyncio.run(scenario())
    assert 2 <= processes <= 4, "spares started, no more than async_processes in all"
    assert taken == set(names)


def test_a_replica_database_keeps_one_connection_and_reads_its_own_writes(
    fresh_sqld_primary, tmp_path
) -> None:
    names = [f"wf-{uuid.uuid4().hex[:12]}" for _ in range(4)]

    async def scenario() -> tuple[int, list[tuple]]:
        database = connect(replica(fresh_sqld_primary, tmp_path / "r.db"))
        try:
            await migrate(database)
            scheduler = LibsqlScheduler(database, namespace="own-writes")
            await asyncio.gather(*(scheduler.make_ready(name) for name in names))
            local = await database.run(  # no sync: the replica's own file
                lambda c: c.execute("SELECT workflow FROM workflow_queue WHERE namespace = 'own-writes'")
            )
            return database.processes, local
        finally:
            await database.aclose()

    processes, local = asyncio.run(scenario())
    assert processes == 1
    assert sorted(row[0] for row in local) == sorted(names)


@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_the_loop_keeps_ticking_while_a_durable_operation_crosses_a_slow_link(
    profile, fresh_sqld_primary, tmp_path
) -> None:
    async def scenario(proxy: LatencyProxy) -> dict[str, int]:
        counts = {}
        for design, processes in (("threads", 0), ("processes", 1)):
            if profile == "sqld":
                settings = sqld(fresh_sqld_primary, async_processes=processes).model_copy(
                    update={"url": proxy.url}
                )
            else:
                settings = replica(fresh_sqld_primary, tmp_path / f"{design}.db").model_copy(
                    update={"sync_url": proxy.url, "async_processes": processes}
                )
            database = connect(settings)
            try:
                await migrate(database)
                checkpointer = LibsqlCheckpointer(database)
                before = proxy.stats()["chunks_up"]
                workflow = f"wf-{uuid.uuid4().hex[:12]}"
                counts[design], _ = await ticks_during(
                    lambda c=checkpointer, w=workflow: c.claim(w, BUDGET, ALIVE)
                )
                assert proxy.stats()["chunks_up"] > before, f"the {design} claim went through the proxy"
            finally:
                await database.aclose()
        return counts

    with LatencyProxy(fresh_sqld_primary.http_port, delay=0.050) as proxy:  # each round trip >= 100 ms
        counts = asyncio.run(scenario(proxy))
    assert counts["processes"] >= 20, f"the loop ticked during the claim: {counts}"
    assert counts["processes"] >= 5 * (counts["threads"] + 1), f"far more than on a frozen loop: {counts}"


def test_in_a_daemonic_process_connect_keeps_the_connection_on_a_thread(sqld_primary) -> None:
    """multiprocessing lets no daemonic process start children, so there it is the thread design."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    settings = {"profile": "sqld", "url": sqld_primary.http_url, "auth_token": sqld_primary.rw_token}
    child = context.Process(target=report_design_in_a_daemon, args=(settings, theirs), daemon=True)
    child.start()
    try:
        assert ours.poll(120), "the daemonic process answered"
        processes, in_process, rows = ours.recv()
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert processes == 0 and in_process and rows == [(1,)]
