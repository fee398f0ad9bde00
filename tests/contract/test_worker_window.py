"""`harel-edge worker`'s window of events in flight, with each commit claiming the next event:
however the window moves, every lease claimed is handled, none waits in a buffer to lapse."""

from __future__ import annotations

import asyncio
from pathlib import Path

from harel.engine.execution import Execution, Status
from harel.spec.states import Event

import harel_edge.examples.actions as actions
from harel_edge.executor import Stmt, open_executor
from harel_edge.migration import migrate
from harel_edge.queue import EventTransport, Message
from harel_edge.store import EventStore
from harel_edge.worker import WorkerOptions, run_worker

EXAMPLES = str(Path(actions.__file__).parent)
ORDERS = 60
STEPS = (("Start", {}), ("Pay", {"amount": 2.0}), ("Ship", {}), ("Deliver", {}))


async def seed(settings) -> None:
    executor = open_executor(settings)
    try:
        transport = EventTransport(executor, settings)
        store = EventStore(executor, settings, events=transport)
        for i in range(ORDERS):
            await store.save(Execution(id=f"order-{i:03d}", definition_id="order"))
        await transport.publish_many(
            Message(f"order-{i:03d}", Event(kind=kind, data=data)) for i in range(ORDERS) for kind, data in STEPS
        )
    finally:
        await executor.aclose()


def test_a_worker_whose_window_moves_hands_out_every_lease_its_commits_claimed(edge):
    settings = edge.settings(max_in_flight=64)
    migrate(settings)
    asyncio.run(seed(settings))

    async def main():
        stop = asyncio.Event()
        watcher = open_executor(settings)
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005, sample_every=3600)
        worker = asyncio.create_task(run_worker(settings, options, stop))
        try:
            for _ in range(6000):  # at most 60 s
                left = (await watcher.execute(Stmt(f"SELECT count(*) FROM {settings.prefix}_transport_messages"))).rows
                if left[0][0] == 0 or worker.done():
                    break
                await asyncio.sleep(0.01)
            stop.set()
            report = await asyncio.wait_for(worker, 60)
            done = (
                await watcher.execute(
                    Stmt(f"SELECT count(*) FROM {settings.prefix}_executions WHERE json_extract(data, '$.status') = ?", (Status.DONE.value,))
                )
            ).rows[0][0]
        finally:
            await watcher.aclose()
        return report, done

    report, done = asyncio.run(main())
    assert report.error is None
    assert done == ORDERS, "every order delivered"
    assert report.acks == ORDERS * len(STEPS) and report.claims == report.acks, report
    assert report.lost == 0 and report.released_on_stop == 0, f"no lease left to lapse: {report}"
