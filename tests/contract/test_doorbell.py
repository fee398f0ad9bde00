"""A deployment's doorbell on local files: a publish rings for its database, a worker's listener
hears the ring and wakes that database out of a long idle pause, and an idle database still
knows when its next lease, delay or timer ends."""

from __future__ import annotations

import asyncio
import time

import structlog
from harel.spec.states import Event
from test_deployment_worker import EXAMPLES, queued, start_order, until

from harel_edge import doorbell
from harel_edge.executor import open_executor
from harel_edge.migration import migrate
from harel_edge.queue import AsyncLibsqlTransport, LibsqlTransport
from harel_edge.settings import ExplicitSettings
from harel_edge.worker import WorkerOptions, statechart_worker
from harel_edge.worker_loops import rest
from harel_edge.worker_process import run_process


def deployment(tmp_path, *, migrated: bool = True):
    settings = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases="a,b", doorbell="bell")
    for name in ("a", "b", *(("bell",) if migrated else ())):
        migrate(settings.for_database(name))
    return settings


def rings(settings) -> dict[str, int]:
    with LibsqlTransport(settings=settings.doorbell_settings(), create_schema=False) as bell:
        return dict(bell.execute("SELECT database, rung FROM harel_doorbell"))


def test_a_publish_rings_the_doorbell_for_its_database_after_every_earlier_ring_and_a_duplicate_rings_nothing(tmp_path):
    settings = deployment(tmp_path)
    a, b = settings.for_database("a"), settings.for_database("b")
    with LibsqlTransport(settings=a, create_schema=False) as to_a, LibsqlTransport(settings=b, create_schema=False) as to_b:
        to_a.publish("g", Event(kind="E", id="e-1"))
        to_b.publish("g", Event(kind="E", id="e-2"))
        to_a.publish("g", Event(kind="E", id="e-3"))
        assert rings(settings) == {"a": 3, "b": 2}
        to_a.publish("g", Event(kind="E", id="e-3"))  # already queued: nothing new to wake for
        assert rings(settings) == {"a": 3, "b": 2}


def test_a_doorbell_that_cannot_be_rung_leaves_the_publish_done_and_logs_why(tmp_path):
    settings = deployment(tmp_path, migrated=False)  # the doorbell's file has no table to ring in
    a = settings.for_database("a")
    with structlog.testing.capture_logs() as logs, LibsqlTransport(settings=a, create_schema=False) as transport:
        transport.publish("g", Event(kind="E"))
        assert transport.depth() == 1
    said = [entry for entry in logs if entry["event"].startswith("the doorbell was not rung")]
    assert said and said[0]["database"] == "a" and "no such table" in said[0]["error"]


def test_the_listener_wakes_each_database_rung_for_since_it_started_and_no_other(tmp_path):
    settings = deployment(tmp_path)
    before = settings.for_database("b")
    with LibsqlTransport(settings=before, create_schema=False) as transport:
        transport.publish("g", Event(kind="E"))  # rung before the listener starts: the start-up poll takes it

    async def main() -> list[str]:
        woken: list[str] = []
        stop = asyncio.Event()
        listening = asyncio.create_task(doorbell.listen(settings, woken.append, stop, migrate=False))
        try:
            await asyncio.sleep(0)  # the listener reads where the rings stand
            transport = await AsyncLibsqlTransport.from_settings(settings.for_database("a"), create_schema=False)
            try:
                for _ in range(200):
                    await transport.publish("g", Event(kind="E"))
                    if "a" in woken:
                        break
                    await asyncio.sleep(0.05)
            finally:
                await transport.close()
        finally:
            stop.set()
            await asyncio.wait_for(listening, 30)
        return woken

    woken = asyncio.run(main())
    assert "a" in woken and "b" not in woken


def test_a_rest_ends_at_a_ring_and_takes_it_and_a_stop_ends_it_without_one():
    async def main() -> tuple[bool, bool, bool, bool]:
        stop, rung = asyncio.Event(), asyncio.Event()
        rung.set()
        by_ring = await asyncio.wait_for(rest(stop, rung, 600), 30)
        taken = not rung.is_set()
        stop.set()
        by_stop = await asyncio.wait_for(rest(stop, rung, 600), 30)
        return by_ring, taken, by_stop, await asyncio.wait_for(rest(stop, None, 600), 30)

    assert asyncio.run(main()) == (True, True, False, False)


def test_a_rung_database_is_served_at_once_though_its_idle_pause_is_ten_minutes(tmp_path):
    settings = deployment(tmp_path)
    a = settings.for_database("a")

    async def main() -> None:
        stop = asyncio.Event()
        # Every idle pause is ten minutes from the first: only a ring can bring the second order in.
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=600.0, sample_every=0.1)
        worker = asyncio.create_task(run_process(settings, options, stop))
        try:
            await asyncio.to_thread(start_order, a, "a-1")
            await until(lambda: queued(a) == 0, "the first order handled", within=30)
            await asyncio.to_thread(start_order, a, "a-2")
            await until(lambda: queued(a) == 0, "the second order handled once rung", within=30)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)

    asyncio.run(main())


def test_an_idle_database_knows_when_its_next_delayed_event_or_timer_is_due_and_polls_often_under_limits(tmp_path):
    settings = deployment(tmp_path)
    a = settings.for_database("a")

    async def main() -> list[float | None]:
        executor = open_executor(a)
        worker = statechart_worker(executor, a, {})
        seen = [await worker._next_work_in()]
        transport = await AsyncLibsqlTransport.from_settings(a, create_schema=False)
        try:
            await transport.publish("g", Event(kind="Later"), delay=30)
            seen.append(await worker._next_work_in())
            await transport.execute(
                "INSERT INTO harel_timers (execution_id, path, fire_at) VALUES ('x', 'p', ?)", (time.time() + 10,)
            )
            seen.append(await worker._next_work_in())
            await transport.execute("INSERT INTO harel_transport_limits (key, concurrency) VALUES ('k', 1)")
            seen.append(await worker._next_work_in())
        finally:
            await transport.close()
            await executor.aclose()
        return seen

    nothing, delayed, timer, limited = asyncio.run(main())
    assert nothing is None
    assert 20 < delayed <= 30
    assert 0 < timer <= 10
    assert limited <= 1.0


def test_a_dead_letter_requeued_rings_the_doorbell_for_its_database(tmp_path):
    from harel_edge.dead_letter import read_dead_letters, requeue_dead_letter  # noqa: PLC0415
    from harel_edge.queue import EventTransport  # noqa: PLC0415

    settings = deployment(tmp_path)
    b = settings.for_database("b")

    async def bury() -> None:
        now = [1000.0]
        executor = open_executor(b)
        transport = EventTransport(executor, b, clock=lambda: now[0], max_deliveries=1)
        try:
            await transport.publish("order-7", Event(kind="Pay"))
            lease = await transport.claim("w", 30)
            transport.failed(lease, ZeroDivisionError("division by zero"))
            await transport.nack(lease, delay=5)
            now[0] += 6
            assert await transport.claim("w", 30) is None  # its second delivery is over the bound: buried
        finally:
            await executor.aclose()

    asyncio.run(bury())
    before = rings(settings).get("b", 0)  # the worker's own transport does not ring: nothing rang for b yet
    letter = read_dead_letters(b)[0]
    assert requeue_dead_letter(b, letter.id) is not None
    assert rings(settings)["b"] > before


async def finished(ctx):  # noqa: ANN001, ANN201 - the worker loads it as test_doorbell:finished
    await ctx.step("done", lambda: "done")
    return "done"


def test_a_workflow_asked_for_rings_the_doorbell_and_a_worker_polling_hourly_runs_it_and_still_stops_at_once(tmp_path):
    from harel_edge.durable import LibsqlScheduler, connect  # noqa: PLC0415
    from harel_edge.durable import migrate as migrate_durable  # noqa: PLC0415
    from harel_edge.worker import parse_workflow  # noqa: PLC0415

    settings = deployment(tmp_path)
    a = settings.for_database("a")

    async def main() -> None:
        database = connect(a)
        try:
            await migrate_durable(database)
            scheduler = LibsqlScheduler(database, namespace="rung")
            await scheduler.make_ready("wf-0")  # run at start: then the loop waits its hour
            stop = asyncio.Event()
            # An hour between polls: only the ring can bring the second workflow in time.
            options = WorkerOptions(workflows=(parse_workflow(f"rung={__name__}:finished"),), poll=3600, sample_every=3600)
            worker = asyncio.create_task(run_process(settings, options, stop))

            async def ran(workflow: str) -> None:
                done = f"SELECT 1 FROM workflow_checkpoint WHERE workflow = '{workflow}' AND step = 'done'"
                for _ in range(3000):  # a hang guard of 60 s, far below the poll
                    if await database.execute("test.done", done):
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"{workflow} was not run: its ring was not heard")

            await ran("wf-0")
            await scheduler.make_ready("wf-1")  # rings for "a"
            await ran("wf-1")
            stop.set()
            await asyncio.wait_for(worker, 60)  # the durable loop's hour-long wait ends at the stop
        finally:
            await database.aclose()

    asyncio.run(main())
    assert rings(settings)["a"] >= 1
