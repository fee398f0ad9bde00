"""One worker process following its deployment's databases file: a database added is served
without a restart, one taken out is stopped (its worker's heartbeat says so) while the others go on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog
from harel.engine.execution import Execution
from harel.spec.states import Event

import harel_edge.examples.actions as actions
from harel_edge.migration import migrate
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.status import collect_status
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions
from harel_edge.worker_process import run_process

EXAMPLES = str(Path(actions.__file__).parent)


def start_order(settings, order: str) -> None:
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        store.save(Execution(id=order, definition_id="order"))
        t.publish(order, Event(kind="Start"))


def queued(settings) -> int:
    with LibsqlTransport(settings=settings, create_schema=False) as transport:
        return transport.depth()


def worker_state(settings) -> str | None:
    workers = collect_status(settings).workers
    return workers[0].state if workers else None


async def until(check, what: str, within: float = 60.0) -> None:
    """Poll `check` (in a thread) until it holds; fail naming `what` after `within` seconds (a hang guard)."""
    for _ in range(int(within / 0.05)):
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within:g} s: {what}")


def test_a_database_added_to_the_file_is_served_one_taken_out_is_stopped_and_a_bad_file_changes_nothing(tmp_path):
    names = tmp_path / "databases"
    names.write_text("acme\n")
    deployment = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases_file=str(names))
    assert deployment.databases == ("acme",)
    acme, globex = deployment.for_database("acme"), deployment.for_database("globex")
    for one in (acme, globex):
        migrate(one)
    start_order(globex, "g-1")  # waits: globex is not served yet

    async def main() -> None:
        stop = asyncio.Event()
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005, sample_every=0.1)
        worker = asyncio.create_task(run_process(deployment, options, stop))
        try:
            await asyncio.to_thread(start_order, acme, "a-1")
            await until(lambda: queued(acme) == 0, "acme's event handled")
            assert await asyncio.to_thread(queued, globex) == 1, "a database not in the file is not served"
            names.write_text("acme\n# the second tenant\nglobex\n")
            await until(lambda: queued(globex) == 0, "globex served once added to the file")
            names.write_text("globex\n")
            await until(lambda: worker_state(acme) == "stopped", "acme's worker stopped once taken out")
            await asyncio.to_thread(start_order, acme, "a-2")
            await asyncio.to_thread(start_order, globex, "g-2")
            await until(lambda: queued(globex) == 0, "globex still served")
            assert await asyncio.to_thread(queued, acme) == 1, "a database taken out is no longer served"
            names.write_text("globex\nNot A Name\n")  # refused: the databases served stay as they were
            refused = "the databases file was not read; the databases served stay as they were"
            await until(lambda: any(entry["event"] == refused for entry in logs), "the bad file refused")
            await asyncio.to_thread(start_order, globex, "g-3")
            await until(lambda: queued(globex) == 0, "globex still served after a bad file")
            assert not worker.done()
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(main())


def test_a_deployments_databases_start_a_few_at_a_time_share_one_parse_of_the_machines_and_one_that_fails_lets_the_next_go(
    tmp_path, monkeypatch
):
    import harel_edge.worker_process as worker_process  # noqa: PLC0415

    names = [f"t{i}" for i in range(9)]
    deployment = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases=",".join(names))
    monkeypatch.setattr(worker_process, "STARTING_AT_ONCE", 2)
    starting, most, failed, machines = set(), [0], set(), []

    async def fake_worker(settings, options, stop, *, ready=None, rung=None, definitions=None, share=None, replicas=None):  # noqa: ANN001, ANN202, ARG001
        machines.append(definitions)
        starting.add(settings.database)
        most[0] = max(most[0], len(starting))
        await asyncio.sleep(0.01)  # its schema step
        starting.discard(settings.database)
        if settings.database == "t3" and "t3" not in failed:
            failed.add("t3")
            raise RuntimeError("t3 refused once")
        ready()
        await stop.wait()
        return worker_process.WorkerReport(settings.worker_id)

    monkeypatch.setattr(worker_process, "run_worker", fake_worker)

    async def main() -> None:
        stop, up = asyncio.Event(), asyncio.Event()
        worker = asyncio.create_task(worker_process.run_process(deployment, WorkerOptions(definitions_dir=EXAMPLES), stop, ready=up.set))
        await asyncio.wait_for(up.wait(), 30)
        stop.set()
        await asyncio.wait_for(worker, 30)

    asyncio.run(main())
    assert most[0] == 2 and failed == {"t3"}
    assert "order" in machines[0] and all(parsed is machines[0] for parsed in machines), "parsed once, for all"


def test_a_busy_database_among_idle_ones_claims_more_than_an_equal_part_of_the_shared_window(tmp_path, monkeypatch):
    from harel_edge.queue.core import EventTransport  # noqa: PLC0415

    names = ["hot", "idle1", "idle2", "idle3"]
    deployment = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases=",".join(names), max_in_flight=64)
    for name in names:
        migrate(deployment.for_database(name))
    hot = deployment.for_database("hot")
    with EdgeStore(hot, create_schema=False) as store, LibsqlTransport(settings=hot, create_schema=False) as t:
        for i in range(300):
            store.save(Execution(id=f"o-{i}", definition_id="order"))
        t.publish_many(Message(f"o-{i}", Event(kind="Start")) for i in range(300))
    claimed: dict[str, int] = {}  # the most events each database claimed at once, alone or carried by its commits
    claim_many, tail_statements = EventTransport.claim_many, EventTransport._tail_statements

    async def claiming(self, worker_id, visibility, n, *args, **kwargs):  # noqa: ANN001, ANN202
        claimed[self.settings.database] = max(claimed.get(self.settings.database, 0), n)
        return await claim_many(self, worker_id, visibility, n, *args, **kwargs)

    def carried(self, tail):  # noqa: ANN001, ANN202
        statements = tail_statements(self, tail)
        if statements:
            claimed[self.settings.database] = max(claimed.get(self.settings.database, 0), tail.free)
        return statements

    monkeypatch.setattr(EventTransport, "claim_many", claiming)
    monkeypatch.setattr(EventTransport, "_tail_statements", carried)

    async def main() -> None:
        stop = asyncio.Event()
        worker = asyncio.create_task(run_process(deployment, WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005), stop))
        try:
            await until(lambda: queued(hot) == 0, "the hot database's 300 events handled")
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)

    asyncio.run(main())
    assert claimed["hot"] > 64 // 2, f"an equal part is 16 of 64; the busy one claimed at most {claimed['hot']} at once"
