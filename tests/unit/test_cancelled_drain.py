"""A drain cancelled in the middle of a commit (as `asyncio.run` cancels every task at its end)
strands no caller: the commit's units get their answers, and the units queued behind it are sent."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harel_edge.durable import connect
from harel_edge.executor import Stmt
from harel_edge.executor.local import LocalExecutor
from harel_edge.settings import ExplicitSettings

ANSWER_WITHIN = 10  # seconds: a stranded caller fails the test instead of hanging it


def insert(executor, x: int):
    return asyncio.ensure_future(executor.transaction([Stmt("INSERT INTO t VALUES (?)", (x,)), Stmt("SELECT count(*) FROM t")]))


@pytest.mark.parametrize("owner", ["its own connection", "the durable Database's connection"])
def test_a_drain_cancelled_mid_commit_answers_that_commits_units_and_sends_the_ones_queued_behind(tmp_path, monkeypatch, owner):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    on_thread, release = threading.Event(), threading.Event()
    run = LocalExecutor._run

    def held(self, connection, units):
        if threading.current_thread() is not threading.main_thread():
            on_thread.set()
            release.wait(30)
        return run(self, connection, units)

    async def main():
        database = connect(settings) if owner != "its own connection" else None
        executor = database.executor if database is not None else LocalExecutor(settings, linger=0.0)
        await executor.execute(Stmt("CREATE TABLE t (x)"))
        monkeypatch.setattr(LocalExecutor, "_run", held)
        committing = [insert(executor, x) for x in (1, 2, 3)]  # one shared commit, on the thread
        await asyncio.get_running_loop().run_in_executor(None, on_thread.wait, 30)
        behind = [insert(executor, x) for x in (4, 5)]
        await asyncio.sleep(0)  # yields only: the two are queued behind the commit
        executor._drain_task.cancel()
        release.set()
        answered = await asyncio.wait_for(asyncio.gather(*committing, *behind, return_exceptions=True), ANSWER_WITHIN)
        monkeypatch.setattr(LocalExecutor, "_run", run)
        rows = (await executor.execute(Stmt("SELECT x FROM t ORDER BY x"))).rows
        await (database or executor).aclose()
        return answered, rows

    answered, rows = asyncio.run(main())
    assert [len(a) for a in answered] == [2] * 5, f"every caller got its answer: {answered!r}"
    assert rows == [(1,), (2,), (3,), (4,), (5,)], "each unit was applied once"
