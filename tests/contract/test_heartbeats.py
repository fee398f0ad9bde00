"""Workers' heartbeats on the primary, as `status` reads them: who runs, what each settled, its
window and latency, and its clean stop; on every profile."""

from __future__ import annotations

import asyncio
from pathlib import Path

from harel.engine.execution import Execution
from harel.spec.states import Event

import harel_edge.examples.actions as actions
from harel_edge.cli.status import SettledRate
from harel_edge.heartbeats import WorkerSeen
from harel_edge.migration import migrate
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.status import StatusReport, collect_status
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions, run_worker

EXAMPLES = str(Path(actions.__file__).parent)
STEPS = (("Start", {}), ("Pay", {"amount": 2.0}), ("Ship", {}), ("Deliver", {}))
ORDERS = 5


def seed(settings) -> None:
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        for i in range(ORDERS):
            store.save(Execution(id=f"order-{i}", definition_id="order"))
        t.publish_many(Message(f"order-{i}", Event(kind=k, data=d)) for i in range(ORDERS) for k, d in STEPS)


def mine(report: StatusReport, worker_id: str) -> WorkerSeen | None:
    return next((w for w in report.workers if w.worker_id == worker_id), None)


def test_a_worker_is_seen_running_with_what_it_settled_then_stopped(edge):
    settings = edge.settings()
    migrate(settings)
    assert collect_status(settings).workers == [], "no worker has started yet"
    seed(settings)

    async def main() -> tuple[WorkerSeen, WorkerSeen]:
        stop = asyncio.Event()
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005, sample_every=0.1)
        worker = asyncio.create_task(run_worker(settings, options, stop))
        try:
            seen = None
            for _ in range(600):  # a hang guard (60 s): the verdict is what the heartbeat says
                seen = mine(await asyncio.to_thread(collect_status, settings), settings.worker_id)
                if (seen is not None and seen.settled == ORDERS * len(STEPS)) or worker.done():
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)
        after = mine(await asyncio.to_thread(collect_status, settings), settings.worker_id)
        return seen, after

    running, stopped = asyncio.run(main())
    assert running is not None and running.state == "running", running
    assert running.settled == ORDERS * len(STEPS), "every event it handled, counted on the primary"
    assert running.profile == settings.profile and running.in_flight_target is not None and running.latency > 0
    assert stopped.state == "stopped" and stopped.settled == ORDERS * len(STEPS)
    assert stopped.seen_seconds_ago >= 0 and stopped.up_seconds >= 0


def seen(worker_id: str, settled: int) -> WorkerSeen:
    return WorkerSeen(worker_id, "local", "h", 1, "running", 0.0, 1.0, settled, None, None, None)


def report_of(*workers: WorkerSeen) -> StatusReport:
    return StatusReport("local", "q.db", 9, {}, workers=list(workers))


def test_the_settled_rate_is_the_workers_gain_between_two_reads_and_a_restart_counts_from_zero():
    rate = SettledRate()
    rate.add(report_of(seen("a", 100), seen("b", 50)), at=10.0)
    assert rate.per_second is None, "one read gives no rate"
    rate.add(report_of(seen("a", 140), seen("b", 30), seen("c", 4)), at=12.0)
    # a gained 40; b restarted and settled 30 since; c is new with 4: 74 in 2 s
    assert rate.by_worker == {"a": 20.0, "b": 15.0, "c": 2.0}
    assert rate.per_second == 37.0
