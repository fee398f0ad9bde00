"""On a local file a lone unit runs on the event loop's thread; a commit shared by several on a thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harel_edge.durable import connect
from harel_edge.executor import Stmt
from harel_edge.executor.local import LocalExecutor
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
