"""On a local file a lone unit runs on the event loop's thread; a commit shared by several on a thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harel_edge.durable import connect
from harel_edge.executor import Stmt
from harel_edge.executor.local import INLINE_STATEMENTS, LocalExecutor
from harel_edge.settings import ExplicitSettings


def record_threads(executor, monkeypatch):
    seen: list[bool] = []  # True: the unit ran on the loop's thread
    run = LocalExecutor._run

    def spy(self, connection, units):
        seen.append(threading.current_thread() is threading.main_thread())
        return run(self, connection, units)

    monkeypatch.setattr(LocalExecutor, "_run", spy)
    return seen


async def one_then_four(executor):
    alone = await executor.execute(Stmt("SELECT 1"))
    together = await asyncio.gather(*(executor.execute(Stmt(f"SELECT {i}")) for i in range(4)))
    return [alone.rows, *(r.rows for r in together)]


@pytest.mark.parametrize("owner", ["its own connection", "the durable Database's connection"])
def test_a_lone_unit_stays_on_the_loops_thread_and_a_shared_commit_goes_to_a_thread(tmp_path, monkeypatch, owner):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))

    async def main():
        if owner == "its own connection":
            executor, closing = LocalExecutor(settings, linger=0.0), None
        else:
            closing = connect(settings)
            executor = closing.executor
        await executor.execute(Stmt("SELECT 0"))  # the connection is open: the four below queue together
        seen = record_threads(executor, monkeypatch)
        try:
            return await one_then_four(executor), seen
        finally:
            await (closing or executor).aclose()

    rows, seen = asyncio.run(main())
    assert rows == [[(1,)], [(0,)], [(1,)], [(2,)], [(3,)]]
    assert seen[0] is True, "the lone unit ran on the loop's thread"
    assert seen[1:] and not any(seen[1:]), "the shared commit ran on a thread of its own"


def test_a_lone_unit_after_a_cancelled_drain_waits_for_the_commit_still_on_the_thread(tmp_path, monkeypatch):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    on_thread, release = threading.Event(), threading.Event()
    run_here = LocalExecutor._run_here

    def held(self, units):
        on_thread.set()
        release.wait(30)
        return run_here(self, units)

    async def main():
        executor = LocalExecutor(settings, linger=0.0)
        await executor.execute(Stmt("CREATE TABLE t (x, step)"))
        monkeypatch.setattr(LocalExecutor, "_run_here", held)
        shared = [
            asyncio.ensure_future(executor.transaction([Stmt("INSERT INTO t VALUES (?, 1)", (i,)), Stmt("INSERT INTO t VALUES (?, 2)", (i,))]))
            for i in (1, 2)
        ]
        await asyncio.get_running_loop().run_in_executor(None, on_thread.wait, 30)
        executor._drain_task.cancel()  # as asyncio.run does to every task at its end
        lone = asyncio.ensure_future(executor.execute(Stmt("INSERT INTO t VALUES (3, 1)")))
        for _ in range(10):
            await asyncio.sleep(0)  # yields only: inline, the lone unit would be done by now
        ran_beside = lone.done()
        monkeypatch.setattr(LocalExecutor, "_run_here", run_here)
        release.set()
        await lone
        answers = [await unit for unit in shared]
        rows = (await executor.execute(Stmt("SELECT x, step FROM t ORDER BY rowid"))).rows
        await executor.aclose()
        return ran_beside, answers, rows

    ran_beside, answers, rows = asyncio.run(main())
    assert not ran_beside, "the lone unit waited for the commit on the thread"
    assert [len(a) for a in answers] == [2, 2], "the cancelled drain's units still got their answers"
    assert rows == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)]


def test_a_lone_unit_of_many_statements_goes_to_the_thread_so_the_loop_runs_between_them(tmp_path, monkeypatch):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))

    async def main():
        executor = LocalExecutor(settings)
        try:
            await executor.execute(Stmt("SELECT 0"))
            seen = record_threads(executor, monkeypatch)
            await executor.transaction([Stmt("SELECT 1")] * INLINE_STATEMENTS)
            await executor.transaction([Stmt("SELECT 1")] * (INLINE_STATEMENTS + 1))
            return seen
        finally:
            await executor.aclose()

    assert asyncio.run(main()) == [True, False]
