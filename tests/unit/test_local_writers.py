"""Two executors of one process writing one local file (the sync faces apart, in two threads)
take turns instead of waiting on SQLite's write lock: libsql holds the GIL while it waits for
that lock, so the thread holding it could not finish, and the waiter failed with "database is
locked" once its busy timeout ran out."""

from __future__ import annotations

import asyncio
import threading

import harel_edge.executor.local as local
from harel_edge.executor import Stmt
from harel_edge.executor.local import LocalExecutor
from harel_edge.settings import ExplicitSettings


def test_a_second_writer_of_this_process_waits_its_turn_while_the_first_is_inside_its_transaction(tmp_path, monkeypatch):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "w.db"), busy_timeout_ms=1000)
    inside, second_started = threading.Event(), threading.Event()
    run_one = local._run_one

    def paused_run_one(raw, stmt, step):  # noqa: ANN001, ANN202
        """The first writer's first insert waits, inside its transaction, until the second writer has started."""
        if stmt.args == ("first",) and not inside.is_set():
            inside.set()
            second_started.wait(10)
        return run_one(raw, stmt, step)

    monkeypatch.setattr(local, "_run_one", paused_run_one)
    errors: list[str] = []

    def write(value: str, started: threading.Event | None) -> None:
        async def main() -> None:
            executor = LocalExecutor(settings)
            try:
                if started is not None:
                    started.set()
                await executor.transaction(
                    [Stmt("CREATE TABLE IF NOT EXISTS t (v TEXT)"), Stmt("INSERT INTO t VALUES (?)", (value,))]
                )
            finally:
                await executor.aclose()

        try:
            asyncio.run(main())
        except Exception as exc:  # noqa: BLE001 - what the test reports
            errors.append(f"{value}: {exc}")

    first = threading.Thread(target=write, args=("first", None))
    first.start()
    assert inside.wait(10), "the first writer began its transaction"
    second = threading.Thread(target=write, args=("second", second_started))
    second.start()
    first.join(30)
    second.join(30)
    assert errors == []

    async def rows() -> list:
        executor = LocalExecutor(settings)
        try:
            return (await executor.execute(Stmt("SELECT v FROM t ORDER BY v"))).rows
        finally:
            await executor.aclose()

    assert asyncio.run(rows()) == [("first",), ("second",)]
