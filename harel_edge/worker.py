"""The edge worker: harel's async worker on the event path, plus the durable-workflow loop.

Several processes are spawned, never forked (docs/quickstart.md, "How a worker process is built").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog

from harel_edge import observability, retry
from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler
from harel_edge.durable import connect as connect_database
from harel_edge.durable.runtime import DurableWorker, Lost, Outcome, WorkflowFn
from harel_edge.durable.types import Delivery
from harel_edge.errors import ConfigurationError
from harel_edge.heartbeats import Vitals
from harel_edge.inspection import check_usable, inspect_file
from harel_edge.queue import EventTransport
from harel_edge.replicas import Replicas
from harel_edge.sampler import sample_metrics, send_heartbeat
from harel_edge.schema_step import prepare
from harel_edge.settings import EdgeSettings
from harel_edge.store import EventStore
from harel_edge.window import SharedWindow
from harel_edge.worker_loops import IDLE_MAX, EdgeAsyncWorker, wait_ended

# A claim hands out many leases without waiting. Toward a primary the worker starts them 8 at a
# time, giving the loop a turn in between: their commits leave sooner and no turn of the loop
# runs hundreds of transitions. Where commits share an fsync (a local file) it starts them all,
# so that they share it (docs/tuning.md).
LAUNCH_SLICE = 8

log = structlog.get_logger("harel_edge.worker")


# ---- what a worker runs ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowSpec:
    """A durable workflow function and the scheduler namespace whose workflows it runs."""

    namespace: str
    target: str  # module:function, as given

    def load(self) -> WorkflowFn:
        module_name, _, attribute = self.target.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"workflow {self.target!r} cannot be loaded ({exc}): give module:function of an "
                "async function taking a Context, importable by the worker"
            ) from None
        if not asyncio.iscoroutinefunction(fn):
            raise ConfigurationError(f"workflow {self.target!r} is not an async function (async def fn(ctx))")
        return fn


def parse_workflow(text: str) -> WorkflowSpec:
    """`[namespace=]module:function`; the namespace defaults to the function's name."""
    namespace, sep, target = text.partition("=")
    if not sep:
        namespace, target = "", text
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute.isidentifier():
        raise ConfigurationError(
            f"--workflow {text!r} is not [namespace=]module:function, e.g. "
            "fulfil=harel_edge.examples.workflow:fulfil"
        )
    return WorkflowSpec(namespace or attribute, target)


def load_definitions(directory: str | None) -> dict[str, Any]:
    """Every machine of every `*.stm` file in `directory`, validated (harel's own loader)."""
    if directory is None:
        return {}
    path = Path(directory)
    if not path.is_dir():
        raise ConfigurationError(f"--definitions {directory!r} is not a directory of .stm files")
    from harel.worker import load_definitions as harel_load  # noqa: PLC0415 - imports the DSL parser

    try:
        definitions = harel_load(str(path))
    except RuntimeError as exc:
        raise ConfigurationError(str(exc)) from None
    if not definitions:
        raise ConfigurationError(
            f"--definitions {directory!r} holds no machine (no *.stm file with a machine)"
        )
    return definitions


@dataclass(frozen=True)
class WorkerOptions:
    """How one worker process runs (the settings say where the data is)."""

    definitions_dir: str | None = None
    workflows: tuple[WorkflowSpec, ...] = ()
    idle_sleep: float = 0.05  # first pause between claims when the queue is empty (doubling to idle_max)
    idle_max: float = IDLE_MAX  # the longest pause between claims of an idle worker
    poll: float = 1.0  # how often an idle durable loop looks for ready workflows
    migrate: bool = True  # create or upgrade the schema at start (else only check it)
    adopt: bool = False  # accept a database holding other applications' tables
    grace: float = 30.0  # how long a stop may take before held work is cancelled and given back
    sample_every: float = 5.0  # queue depth and replica sync health, for metrics and logs
    sample_queue: bool = True  # read the queue for the metrics (one database's: a deployment's workers do not)
    group_counts: bool = False  # report events handled per group (the demo's summary uses it)


@dataclass
class WorkerReport:
    """What one worker process did, for the demo's summary and for tests."""

    worker_id: str
    claims: int = 0
    acks: int = 0
    nacks: int = 0
    lost: int = 0
    dead_letters: int = 0
    released_on_stop: int = 0
    groups: dict[str, int] = field(default_factory=dict)
    passes: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def settled(self) -> int:
        """Events and passes finished one way or another: what the heartbeat counts as done."""
        return self.acks + self.dead_letters + sum(self.passes.values())

    @classmethod
    def total(cls, worker_id: str, reports: dict[str, WorkerReport]) -> WorkerReport:
        """What the workers of several databases did together; each one's error named by its database."""
        total = cls(worker_id)
        for name, report in reports.items():
            for counter in ("claims", "acks", "nacks", "lost", "dead_letters", "released_on_stop", "steps"):
                setattr(total, counter, getattr(total, counter) + getattr(report, counter))
            for kind, count in report.passes.items():
                total.passes[kind] = total.passes.get(kind, 0) + count
            total.groups.update({f"{name}/{group}": count for group, count in report.groups.items()})
            total.seconds = max(total.seconds, report.seconds)
            if report.error:
                total.error = "; ".join(filter(None, [total.error, f"{name}: {report.error}"]))
        return total


def metered(namespace: str, report: WorkerReport) -> dict[str, Any]:
    """The durable loop's callbacks: count steps and passes (metrics, the report), log a lost claim."""

    def on_step(kind: str) -> None:
        observability.WORKFLOW_STEPS.labels(namespace, kind).inc()
        report.steps += 1

    def on_pass(delivery: Delivery, outcome: Outcome) -> None:
        name = type(outcome).__name__.lower()
        observability.WORKFLOW_PASSES.labels(namespace, name).inc()
        report.passes[name] = report.passes.get(name, 0) + 1
        if isinstance(outcome, Lost):
            log.warning("workflow claim lost", namespace=namespace, workflow=delivery.workflow)

    return {"on_step": on_step, "on_pass": on_pass}


def statechart_worker(
    executor: Any,
    settings: EdgeSettings,
    definitions: dict[str, Any],
    *,
    report: Any = None,
    count_groups: bool = False,
    share: SharedWindow | None = None,
) -> EdgeAsyncWorker:
    """harel's async worker on the event path: a claim brings each event's execution, and the
    commit of an event carries its ack and the next claim, one claim for all the commits of one
    exchange or local commit (one exchange an event; docs/executor.md). `share`: the process's
    window, shared with the other databases of a deployment."""
    transport = EventTransport(
        executor,
        settings,
        concurrency=settings.max_in_flight,
        prefetch=True,
        report=report,
        count_groups=count_groups,
        max_deliveries=settings.max_deliveries,
        max_run=settings.max_run,
    )
    if share is not None:
        transport.allowance = share.join(settings.database, transport.holding)
    return EdgeAsyncWorker(
        EventStore(executor, settings, events=transport),
        transport,
        definitions,
        worker_id=settings.worker_id,
        visibility=settings.visibility,
        concurrency=settings.max_in_flight,
        launch_slice=None if executor.commits_share_fsync else LAUNCH_SLICE,
    )


async def relay(rung: asyncio.Event, statecharts: asyncio.Event | None, schedulers: list[LibsqlScheduler]) -> None:
    """Hand each ring of the database on to the statecharts' loop and to every durable loop."""
    while True:
        await rung.wait()
        rung.clear()
        if statecharts is not None:
            statecharts.set()
        for scheduler in schedulers:
            scheduler.notify()


# ---- one worker process --------------------------------------------------------------------------


async def run_worker(
    settings: EdgeSettings,
    options: WorkerOptions,
    stop: asyncio.Event,
    *,
    ready: Callable[[], None] | None = None,
    rung: asyncio.Event | None = None,
    definitions: dict[str, Any] | None = None,
    share: SharedWindow | None = None,
    replicas: Replicas | None = None,
) -> WorkerReport:
    """Run one worker in this process until `stop` is set; return what it did.
    `rung`: set when a publisher rang the deployment's doorbell for this database. `definitions`:
    the machines already loaded from `options.definitions_dir` (a deployment parses them once).
    `share`: the process's window, when other databases share it. `replicas`: the process's
    embedded replicas, when other databases share their bound (else this one's opens at start).

    `ready` is called once the schema is in place and the loops are about to start.
    """
    if definitions is None:
        definitions = load_definitions(options.definitions_dir)
    workflows = [(spec, spec.load()) for spec in options.workflows]
    if not definitions and not workflows:
        raise ConfigurationError(
            "nothing to run: give --definitions DIR (statecharts) and/or --workflow NS=module:function"
        )
    if settings.has_file:
        # Before libsql opens the file: it would set WAL on a file that is not ours.
        check_usable(inspect_file(settings.db_path), settings.prefix, settings.db_path, adopt=options.adopt)

    report = WorkerReport(settings.worker_id)
    started = time.monotonic()
    # One executor for the process: the statecharts' event path and the durable workflows share
    # its coalescing (locally, its one writer); remotely it speaks Hrana from this loop.
    database = await asyncio.to_thread(connect_database, settings)
    relaying: asyncio.Task | None = None
    replicas_run: asyncio.Task | None = None
    replica_open: Callable[[], bool] | None = None  # whether this database's replica is open now
    name = settings.database or settings.db_path
    try:
        await prepare(database.executor, settings, migrate=options.migrate, adopt=options.adopt)
        if settings.syncs:
            # The embedded file serves this machine's local reads (status). libsql syncs it in the
            # background: its own `sync()` holds the GIL, which would stall this loop for its length.
            opened = settings.model_copy(update={"sync_interval": settings.sync_interval or options.sample_every})
            alone = replicas is None
            if alone:
                replicas = Replicas(1, idle_close=None)
                replicas_run = asyncio.create_task(replicas.run(stop), name="replicas")
            await replicas.keep(name, opened, lambda: report.claims + report.settled, now=alone)
            replica_open = functools.partial(replicas.is_open, name)
        executor = database.executor
        harel_worker = statechart_worker(
            executor, settings, definitions, report=report, count_groups=options.group_counts, share=share
        )
        tasks: list[asyncio.Task] = []
        # With durable loops beside the statecharts, each loop hears the database's ring (`relay`).
        statecharts_rung = asyncio.Event() if rung is not None and workflows else rung
        schedulers: list[LibsqlScheduler] = []
        if definitions:
            tasks.append(
                asyncio.create_task(
                    retry.restarting(
                        "statecharts",
                        lambda: harel_worker.run(
                            stop, idle_sleep=options.idle_sleep, idle_max=options.idle_max, rung=statecharts_rung
                        ),
                        stop,
                    ),
                    name="statecharts",
                )
            )
        for spec, fn in workflows:
            scheduler = LibsqlScheduler(  # its own passes wake it in-process: they need no ring
                database, namespace=spec.namespace, poll=timedelta(seconds=options.poll), rings=False
            )
            schedulers.append(scheduler)
            loop = DurableWorker(
                LibsqlDurable(LibsqlCheckpointer(database), scheduler),
                fn,
                max_failed_passes=settings.max_deliveries,
                **metered(spec.namespace, report),
            )
            tasks.append(
                asyncio.create_task(
                    loop.run(stop, passes=settings.max_workflow_passes, poll=timedelta(seconds=max(options.poll, 0.01))),
                    name=f"workflows:{spec.namespace}"
                )
            )
        relaying = None if statecharts_rung is rung else asyncio.create_task(
            relay(rung, statecharts_rung if definitions else None, schedulers), name="rings"
        )

        def vitals(replica_lag: float | None) -> Vitals:
            window = harel_worker.window if definitions else None
            return Vitals(
                settled=report.settled,
                in_flight_target=None if window is None else window.size,
                latency=None if window is None else window.latency,
                replica_lag=replica_lag,
            )

        sampler = asyncio.create_task(
            sample_metrics(
                replica_open, executor, settings, options.sample_every, stop, vitals, queue=options.sample_queue,
            ),
            name="sampler",
        )
        log.info(
            "worker started",
            worker_id=settings.worker_id,
            profile=settings.profile,
            machines=sorted(definitions),
            workflows=[f"{s.namespace}={s.target}" for s in options.workflows],
            routing_keys=list(settings.routing_keys) or None,
        )
        if ready is not None:
            ready()

        await stop.wait()
        log.info(
            "stopping: finishing what this worker holds", worker_id=settings.worker_id, grace=options.grace
        )
        done, pending = await asyncio.wait(tasks, timeout=options.grace)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if definitions:
            # harel's loop, cancelled, leaves the handlers it started running: their commits (sent
            # anyway) and acks settle their leases, so wait for them before giving anything back.
            await wait_ended(harel_worker.handling, settings.retry_deadline)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                report.error = f"{task.get_name()}: {task.exception()}"
                log.error("a worker loop failed", loop=task.get_name(), error=str(task.exception())[:300])
        report.released_on_stop = await harel_worker.transport.release_held()
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sampler
        report.groups = harel_worker.transport.group_counts()
        await send_heartbeat(executor, settings, options.sample_every, vitals(None), stopped=True)
    finally:
        if relaying is not None:
            relaying.cancel()
        if share is not None:
            share.leave(settings.database)
        try:
            await database.aclose()
        finally:  # the replica's files and syncs are given back even when the close above fails
            if replica_open is not None:
                await replicas.leave(name)
            if replicas_run is not None:
                replicas_run.cancel()  # it ends at `stop`; cancelled, it closes what it holds the same way
                with contextlib.suppress(asyncio.CancelledError):
                    await replicas_run
    report.seconds = time.monotonic() - started
    log.info(
        "worker stopped",
        worker_id=settings.worker_id,
        claims=report.claims,
        acks=report.acks,
        nacks=report.nacks,
        dead_letters=report.dead_letters,
        released=report.released_on_stop,
        passes=report.passes,
    )
    return report
