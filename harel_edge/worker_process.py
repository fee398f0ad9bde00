"""One worker process: its signals and garbage collector, and the databases it serves: one, or
each database of a deployment (HAREL_EDGE_DATABASES) side by side, each retried on its own,
their embedded replicas (replica profile) opened as they have work, a bounded number at once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import signal
from collections.abc import Callable

import structlog

from harel_edge import database_names, doorbell, observability, retry
from harel_edge.loop_thread import run_main
from harel_edge.replicas import Replicas
from harel_edge.settings import EdgeSettings
from harel_edge.window import SharedWindow
from harel_edge.worker import WorkerOptions, WorkerReport, load_definitions, run_worker

# Python's default (700, 10, 10) collects an event's objects while it waits for the primary and
# promotes them, so full collections come often: measured in docs/tuning.md.
GC_THRESHOLDS = (5000, 50, 10)
# An idle database of a deployment polls its queue at most this long apart: a new event waits at
# most this, and each idle database costs the primary about an exchange a second.
DEPLOYMENT_IDLE_MAX = 1.0
FOLLOW_EVERY = 1.0  # seconds between looks at HAREL_EDGE_DATABASES_FILE
# Databases of a deployment starting (schema step, first claim) at once: 500 at once made sqld
# answer 429 "Timed out while opening database connection" (docs/benchmarks.md).
STARTING_AT_ONCE = 16

log = structlog.get_logger("harel_edge.worker")


async def run_process(
    settings: EdgeSettings, options: WorkerOptions, stop: asyncio.Event, *, ready: Callable[[], None] | None = None
) -> WorkerReport:
    """Serve the database the settings name, or every database of their deployment, until `stop`."""
    if settings.is_deployment:
        return await run_databases(settings, options, stop, ready=ready)
    return await run_worker(settings, options, stop, ready=ready)


def shares(settings: EdgeSettings, count: int) -> dict[str, int]:
    """Each of `count` databases' part of the process's durable passes: an equal split, so a busy
    database can never take a quiet one's part (the window is shared instead: `SharedWindow`)."""
    return {"max_workflow_passes": max(1, settings.max_workflow_passes // max(1, count))}


async def run_databases(
    settings: EdgeSettings, options: WorkerOptions, stop: asyncio.Event, *, ready: Callable[[], None] | None = None
) -> WorkerReport:
    """A worker for each database of the deployment, side by side on this loop, each with its own
    executor: one that fails to start (unreachable, refused, a schema too new) is logged and
    started again on its own while the others go on. With HAREL_EDGE_DATABASES_FILE, a database
    added to the file is started and one taken out is stopped (what it holds finished or given
    back first). `ready` once each database named at start has started or failed once."""
    # The queue metrics are one database's (their gauges would take turns); `status --all` reads all.
    # With a doorbell an idle database is polled (and beats) rarely, and woken by its ring.
    quiet = doorbell.IDLE_MAX if settings.doorbell else DEPLOYMENT_IDLE_MAX
    options = dataclasses.replace(
        options, idle_max=max(options.idle_max, quiet), sample_queue=False,
        poll=max(options.poll, doorbell.IDLE_MAX) if settings.doorbell else options.poll,
        sample_every=max(options.sample_every, doorbell.IDLE_MAX) if settings.doorbell else options.sample_every,
    )
    # Parsed once for every database: the DSL parser took a quarter of a 50-database drain's CPU.
    definitions = load_definitions(options.definitions_dir)
    window = SharedWindow(settings.max_in_flight)  # each busy database sure of an equal part of it
    # Each database's replica opened when it has work, closed when idle, a bounded number at once.
    replicas = Replicas.of_deployment(settings) if settings.syncs else None
    keeping = None if replicas is None else asyncio.create_task(replicas.run(stop), name="replicas")
    reports: dict[str, WorkerReport] = {}
    running: dict[str, tuple[asyncio.Task, asyncio.Event]] = {}
    rungs: dict[str, asyncio.Event] = {}
    waiting = set(settings.databases)
    starting = asyncio.Semaphore(STARTING_AT_ONCE)

    def up(name: str) -> None:
        waiting.discard(name)
        if not waiting and ready is not None:
            ready()

    async def serve_one(name: str, own_stop: asyncio.Event, part: dict[str, int]) -> None:
        structlog.contextvars.bind_contextvars(database=name)  # this task's lines, and its children's, say which
        one = settings.for_database(name).model_copy(update=part)

        async def attempt() -> None:
            await starting.acquire()  # its schema step and first claim: STARTING_AT_ONCE databases at a time
            holding = True

            def let_go() -> None:
                nonlocal holding
                if holding:
                    holding = False
                    starting.release()

            def started() -> None:
                let_go()
                up(name)

            try:
                reports[name] = await run_worker(
                    one, options, own_stop, ready=started, rung=rungs.get(name), definitions=definitions, share=window,
                    replicas=replicas,
                )
            except Exception:
                started()  # it is reported, and tried again; the process is up for the others
                raise
            finally:
                let_go()  # stopped before it started

        await retry.restarting(f"database {name}", attempt, own_stop)

    def start(names: tuple[str, ...]) -> None:
        part = shares(settings, len(names))
        for name in names:
            if name not in running:
                own_stop = asyncio.Event()
                if settings.doorbell:
                    rungs[name] = asyncio.Event()
                running[name] = (asyncio.create_task(serve_one(name, own_stop, part), name=f"database:{name}"), own_stop)

    start(settings.databases)
    log.info("serving databases", databases=list(settings.databases), doorbell=settings.doorbell,
             **shares(settings, len(settings.databases)))
    listening = None if not settings.doorbell else asyncio.create_task(
        retry.restarting("doorbell", lambda: _listen(settings, rungs, stop, migrate=options.migrate), stop), name="doorbell"
    )
    if settings.databases_file is None:
        await stop.wait()
    else:
        await _follow(settings.databases_file, stop, running, start)
    for _task, own_stop in running.values():
        own_stop.set()
    await asyncio.gather(*(task for task, _ in running.values()), *(task for task in (listening, keeping) if task))
    return WorkerReport.total(settings.worker_id, reports)


async def _listen(settings: EdgeSettings, rungs: dict[str, asyncio.Event], stop: asyncio.Event, *, migrate: bool) -> None:
    """The doorbell, waking the databases rung for; when it fails, every database is woken once
    (polled now, not at its long pause) before it is restarted."""

    def wake(name: str) -> None:
        if name in rungs:
            rungs[name].set()

    try:
        await doorbell.listen(settings, wake, stop, migrate=migrate)
    except Exception:
        for rung in rungs.values():
            rung.set()
        raise


async def _follow(path: str, stop: asyncio.Event, running: dict, start: Callable[[tuple[str, ...]], None]) -> None:
    """Until `stop`: read the databases file when it changes; start the databases added, stop
    those taken out. A file that cannot be read or names a bad database changes nothing."""
    seen = _changed_at(path)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), FOLLOW_EVERY)
        now = _changed_at(path)
        if now == seen or stop.is_set():
            continue
        seen = now
        try:
            names = database_names.read_names_file(path)
        except ValueError as exc:
            log.error("the databases file was not read; the databases served stay as they were", error=str(exc))
            continue
        for name in [name for name in running if name not in names]:
            log.info("database taken out of the file: finishing what it holds, then stopping", database=name)
            task, own_stop = running.pop(name)
            own_stop.set()
            await asyncio.shield(task)
        added = [name for name in names if name not in running]
        if added:
            log.info("databases added to the file: starting them", databases=added)
            start(names)


def _changed_at(path: str) -> tuple[float, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime, status.st_size


def serve(settings: EdgeSettings, options: WorkerOptions) -> WorkerReport:
    """Run this process's worker until SIGTERM or SIGINT; the `worker` command's body."""

    async def main() -> WorkerReport:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = {"count": 0}

        def on_signal() -> None:
            signals["count"] += 1
            if signals["count"] > 1:
                log.warning("second signal: cancelling what is still running")
                for task in asyncio.all_tasks(loop):
                    if task.get_name() in ("statecharts",) or task.get_name().startswith("workflows:"):
                        task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        return await run_process(settings, options, stop)

    if settings.metrics_port:
        observability.serve_metrics(settings.metrics_port)
    tune_garbage_collector()
    return run_main(main())


def tune_garbage_collector() -> None:
    """Freeze what start-up made (it lives as long as the process) and collect young objects
    less often (`GC_THRESHOLDS`): both shorten the collections that stall the worker's one event
    loop (docs/tuning.md, "Pauses of the event loop")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
