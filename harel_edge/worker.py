"""The edge worker: harel's async worker on the event path, plus the durable-workflow loop.

Statechart events take the event path (`event_path.py`): one claim statement leases many
groups' heads with their executions, and each event's commit carries its ack, through the
profile's executor (Hrana over HTTP to a remote primary, never blocking the loop; one shared
commit on a local file). The durable workflows and the schema step share that executor
through the durable `Database`. Parallelism beyond one process comes from processes:
`run_processes` starts several with the `spawn` method (a libsql connection must not cross a
fork).

Stopping. On SIGTERM (or SIGINT) the worker stops claiming, lets harel's worker finish the
events it holds and the durable loop finish its pass (which releases the workflow's claim),
then closes the connection and returns normally, so the process exits 0. If that takes
longer than the grace period (or a second signal comes) the remaining work is cancelled, and
the messages it held are given back (nacked) at once, so another worker takes them without
waiting for their leases to lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from harel.engine.aio.distributed import AsyncWorker

from harel_edge import observability, retry, schema
from harel_edge.connection import EdgeConnection
from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler
from harel_edge.durable import connect as connect_database
from harel_edge.durable.runtime import DurableWorker, Lost, Outcome, WorkflowFn
from harel_edge.errors import ConfigurationError
from harel_edge.event_path import EventPath, EventStore, EventTransport
from harel_edge.executor import blocking_execute
from harel_edge.settings import EdgeSettings
from harel_edge.status import check_usable, database_facts, dead_letter_status, inspect_file, queue_status
from harel_edge.store import store_tables

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
    concurrency: int = 32  # statechart events in flight in one process
    idle_sleep: float = 0.05  # pause between claims when the queue is empty
    poll: float = 1.0  # how often an idle durable loop looks for ready workflows
    migrate: bool = True  # create or upgrade the schema at start (else only check it)
    adopt: bool = False  # accept a database holding other applications' tables
    grace: float = 30.0  # how long a stop may take before held work is cancelled and given back
    sample_every: float = 5.0  # queue depth and replica sync health, for metrics and logs
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


# ---- the durable pieces, with their metrics ------------------------------------------------------


class _MeteredCheckpointer(LibsqlCheckpointer):
    """Counts the steps a pass records, for the workflow-steps metric."""

    namespace: str = ""
    report: WorkerReport | None = None

    async def record(self, holder, key, value):  # noqa: ANN001 - same signature as the base
        recorded = await super().record(holder, key, value)
        if recorded.fresh:
            self._count("sleep" if key.startswith("$sleep/") else "result" if key == "$result" else "step")
        return recorded

    async def transact(self, holder, key, effect):  # noqa: ANN001
        value = await super().transact(holder, key, effect)
        self._count("transact")
        return value

    def _count(self, kind: str) -> None:
        observability.WORKFLOW_STEPS.labels(self.namespace, kind).inc()
        if self.report is not None:
            self.report.steps += 1


class EdgeAsyncWorker(AsyncWorker):
    """harel's async worker, telling the transport when handling a message raised, so the nack
    harel's loop then sends records the error and keeps the delivery counted for dead-lettering."""

    async def _handle(self, lease) -> bool:  # noqa: ANN001 - harel's Lease
        try:
            return await super()._handle(lease)
        except Exception as exc:
            self.transport.failed(lease, exc)
            raise


class _MeteredDurableWorker(DurableWorker):
    """Counts each pass by its outcome, and writes a log line for a lost claim."""

    namespace: str = ""
    report: WorkerReport | None = None

    async def handle(self, delivery) -> Outcome:  # noqa: ANN001
        outcome = await super().handle(delivery)
        name = type(outcome).__name__.lower()
        observability.WORKFLOW_PASSES.labels(self.namespace, name).inc()
        if self.report is not None:
            self.report.passes[name] = self.report.passes.get(name, 0) + 1
        if isinstance(outcome, Lost):
            log.warning("workflow claim lost", namespace=self.namespace, workflow=delivery.workflow)
        return outcome


# ---- one worker process --------------------------------------------------------------------------


def open_connection(settings: EdgeSettings) -> EdgeConnection:
    """Open the profile's connection. `EdgeConnection` retries while the primary is
    unreachable (a replica cannot even be opened then), under the settings' retry policy."""
    return EdgeConnection(settings)


def prepare(connection: EdgeConnection, *, migrate: bool, adopt: bool = False) -> int:
    """Refuse a foreign or newer database, then create or upgrade every table the worker uses.

    Returns the schema version found. Runs through the retry policy; idempotent, and safe when
    several workers start at once.
    """
    settings = connection.settings
    where = settings.server or settings.db_path

    def work() -> int:
        facts = database_facts(connection.execute)
        check_usable(facts, settings.prefix, where, adopt=adopt)
        if not migrate:
            return facts.user_version
        found = schema.migrate(connection.execute, settings.prefix)
        for statement in store_tables(settings.prefix):
            connection.execute(statement)
        return found

    return retry.call_with_retry(settings, "migrate", work, recover=lambda exc: _recover(connection, exc))


def prepare_database(settings: EdgeSettings, *, adopt: bool = False) -> int:
    """`prepare` on a connection opened for the purpose: create or upgrade every table."""
    connection = open_connection(settings)
    try:
        return prepare(connection, migrate=True, adopt=adopt)
    finally:
        connection.close()


def _recover(connection: EdgeConnection, exc: BaseException) -> None:
    if retry.needs_reopen(exc):
        connection.reopen()
    else:
        connection.sync()


async def run_worker(
    settings: EdgeSettings,
    options: WorkerOptions,
    stop: asyncio.Event,
    *,
    ready: Callable[[], None] | None = None,
) -> WorkerReport:
    """Run one worker in this process until `stop` is set; return what it did.

    `ready` is called once the schema is in place and the loops are about to start.
    """
    definitions = load_definitions(options.definitions_dir)
    workflows = [(spec, spec.load()) for spec in options.workflows]
    if not definitions and not workflows:
        raise ConfigurationError(
            "nothing to run: give --definitions DIR (statecharts) and/or --workflow NS=module:function"
        )
    if settings.profile in ("local", "replica"):
        # Before libsql opens the file: it would set WAL on a file that is not ours.
        check_usable(inspect_file(settings.db_path), settings.prefix, settings.db_path, adopt=options.adopt)

    report = WorkerReport(settings.worker_id)
    started = time.monotonic()
    # One executor for the process: the statecharts' event path and the durable workflows share
    # its coalescing (locally, its one writer); remotely it speaks Hrana from this loop.
    database = await asyncio.to_thread(connect_database, settings)
    replica: EdgeConnection | None = None
    try:
        await database.run(lambda c: prepare(c, migrate=options.migrate, adopt=options.adopt))
        if settings.profile == "replica":
            # The embedded file serves this machine's local reads (status); it is synced by the sampler.
            replica = await asyncio.to_thread(open_connection, settings)
        executor = database.executor
        path = EventPath(executor, settings)
        transport = EventTransport(
            path,
            concurrency=options.concurrency,
            prefetch=True,
            report=report,
            count_groups=options.group_counts,
            max_deliveries=settings.max_deliveries,
        )
        store = EventStore(path)

        tasks: list[asyncio.Task] = []
        if definitions:
            harel_worker = EdgeAsyncWorker(
                store,
                transport,
                definitions,
                worker_id=settings.worker_id,
                visibility=settings.visibility,
                concurrency=options.concurrency,
            )
            tasks.append(
                asyncio.create_task(
                    _supervised(
                        "statecharts", lambda: harel_worker.run(stop, idle_sleep=options.idle_sleep), stop
                    ),
                    name="statecharts",
                )
            )
        for spec, fn in workflows:
            checkpointer = _MeteredCheckpointer(database)
            checkpointer.namespace, checkpointer.report = spec.namespace, report
            scheduler = LibsqlScheduler(
                database, namespace=spec.namespace, poll=timedelta(seconds=options.poll)
            )
            loop = _MeteredDurableWorker(
                LibsqlDurable(checkpointer, scheduler), fn, max_failed_passes=settings.max_deliveries
            )
            loop.namespace, loop.report = spec.namespace, report
            tasks.append(
                asyncio.create_task(
                    _durable_loop(loop, stop, options.poll), name=f"workflows:{spec.namespace}"
                )
            )
        sampler = asyncio.create_task(
            _sample(replica, executor, settings, options.sample_every, stop), name="sampler"
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
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                report.error = f"{task.get_name()}: {task.exception()}"
                log.error("a worker loop failed", loop=task.get_name(), error=str(task.exception())[:300])
        report.released_on_stop = await transport.release_held()
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sampler
        report.groups = transport.group_counts()
    finally:
        await database.aclose()
        if replica is not None:
            await asyncio.to_thread(replica.close)
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


async def _supervised(name: str, run: Callable[[], Any], stop: asyncio.Event) -> None:
    """Run `run()` until `stop`; if it fails, log it and start it again after a backoff.

    harel's worker loop ends with the first error of a claim or a timer sweep: once the retry
    policy has given up on an unreachable primary, for instance. A worker process must outlive
    that and carry on when the primary is back, as the durable loop does.
    """
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            await run()
            return
        except Exception as exc:  # noqa: BLE001 - logged, and the loop starts again
            failures = 1 if time.monotonic() - started > 60 else failures + 1
            delay = min(0.5 * 2 ** (failures - 1), 10.0)
            log.error(
                "loop failed; restarting",
                loop=name,
                error=f"{type(exc).__name__}: {str(exc)[:300]}",
                restart_in=delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


async def _durable_loop(loop: DurableWorker, stop: asyncio.Event, poll: float) -> None:
    """`DurableWorker.run`, waiting for ready work at most one poll at a time, so a stop is
    noticed within a poll (plus the pass in progress, which always finishes)."""
    within = timedelta(seconds=max(poll, 0.01))
    failures = 0
    while not stop.is_set():
        try:
            await loop.run_once(within)
            failures = 0
        except Exception as exc:  # noqa: BLE001 - a worker outlives one bad pass or a lost link
            failures += 1
            log.warning(
                "workflow pass failed", error=f"{type(exc).__name__}: {str(exc)[:300]}", failures=failures
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(0.05 * 2**failures, 5.0))


async def _sample(
    replica: EdgeConnection | None, executor: Any, settings: EdgeSettings, every: float, stop: asyncio.Event
) -> None:
    """Every `every` seconds: the queue's depth for the metrics (read on the primary through the
    executor), and a sync of the embedded replica, if any, so its lag metric means something."""
    execute = blocking_execute(executor, asyncio.get_running_loop())
    while not stop.is_set():
        if replica is not None:
            try:
                await asyncio.to_thread(replica.sync)
                observability.record_sync(True)
            except Exception as exc:  # noqa: BLE001 - reported, and the next sample tries again
                observability.record_sync(False)
                log.warning("sync failed", where="worker", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            observability.refresh_sync_lag()
        try:
            summary = await asyncio.to_thread(queue_status, execute, settings.prefix, top=0)
            observability.QUEUE_DEPTH.clear()
            for row in summary["by_priority_and_routing_key"]:
                for state in ("queued", "in_flight", "parked"):
                    observability.QUEUE_DEPTH.labels(str(row["priority"]), state).inc(row[state])
        except Exception as exc:  # noqa: BLE001 - sampling is best effort
            log.debug("queue sample failed", error=str(exc)[:200])
        try:
            dead = await asyncio.to_thread(dead_letter_status, execute, settings.prefix)
            observability.DEAD_LETTERS.labels("message").set(dead["messages"])
            observability.DEAD_LETTERS.labels("workflow").set(dead["workflows"])
        except Exception as exc:  # noqa: BLE001 - sampling is best effort
            log.debug("dead-letter sample failed", error=str(exc)[:200])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


def serve(settings: EdgeSettings, options: WorkerOptions) -> WorkerReport:
    """Run one worker in this process until SIGTERM or SIGINT; the `worker` command's body."""

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
        return await run_worker(settings, options, stop)

    if settings.metrics_port:
        observability.serve_metrics(settings.metrics_port)
    return asyncio.run(main())


# ---- several processes ----------------------------------------------------------------------------


def _child(
    settings: EdgeSettings,
    options: WorkerOptions,
    stop_flag: Any,
    ready_flag: Any,
    reports: Any,
    log_format: str,
    log_level: str,
) -> None:
    """A spawned worker process: runs until the parent sets `stop_flag` or it gets SIGTERM;
    sets `ready_flag` once its schema is in place and it is about to claim."""
    os.environ.setdefault("RUST_LOG", "off")
    observability.configure_logging(log_format, log_level)  # type: ignore[arg-type]
    if settings.metrics_port:
        observability.serve_metrics(settings.metrics_port)

    async def main() -> WorkerReport:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        async def watch() -> None:
            while not stop.is_set():
                if stop_flag.is_set():
                    stop.set()
                    return
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            return await run_worker(settings, options, stop, ready=ready_flag.set)
        finally:
            watcher.cancel()

    try:
        report = asyncio.run(main())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides the exit code
        report = WorkerReport(settings.worker_id, error=f"{type(exc).__name__}: {exc}")
        reports.put(report.as_dict())
        raise SystemExit(1) from None
    reports.put(report.as_dict())


@dataclass
class WorkerProcesses:
    """Worker processes started with `spawn`, and the means to stop them and collect their reports."""

    processes: list[multiprocessing.process.BaseProcess]
    stop_flag: Any
    ready_flags: list[Any]
    reports: Any

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every worker is about to claim; False if one died or time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(flag.is_set() for flag in self.ready_flags):
                return True
            if self.alive() < len(self.processes):
                return False
            time.sleep(0.02)
        return False

    def stop(self, timeout: float) -> list[WorkerReport]:
        """Ask every worker to stop, wait for them, and return their reports."""
        self.stop_flag.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():  # did not stop in time: it has had its grace period
                process.kill()
                process.join(5)
        found = []
        while True:
            try:
                found.append(WorkerReport(**self.reports.get(timeout=0.2)))
            except Exception:  # noqa: BLE001 - queue.Empty: every report is in
                break
        return found

    def exit_codes(self) -> list[int | None]:
        return [p.exitcode for p in self.processes]


def start_processes(
    settings: EdgeSettings,
    options: WorkerOptions,
    count: int,
    *,
    log_format: str = "console",
    log_level: str = "warning",
    per_worker: Callable[[int, EdgeSettings], EdgeSettings] | None = None,
) -> WorkerProcesses:
    """Start `count` worker processes (spawn). Each gets its own worker id (`<id>-<n>`) and,
    when metrics are on, its own port (`metrics_port + n`); `per_worker` may change more."""
    context = multiprocessing.get_context("spawn")
    stop_flag, reports = context.Event(), context.Queue()
    processes, ready_flags = [], []
    for index in range(count):
        update: dict[str, Any] = {
            "worker_id": f"{settings.worker_id}-{index + 1}" if count > 1 else settings.worker_id
        }
        if settings.metrics_port and count > 1:
            update["metrics_port"] = settings.metrics_port + index
        mine = settings.model_copy(update=update)
        if per_worker is not None:
            mine = per_worker(index, mine)
        ready_flags.append(context.Event())
        process = context.Process(
            target=_child,
            args=(mine, options, stop_flag, ready_flags[-1], reports, log_format, log_level),
            name=f"harel-edge-worker-{index + 1}",
        )
        process.start()
        processes.append(process)
    return WorkerProcesses(processes, stop_flag, ready_flags, reports)


def run_processes(
    settings: EdgeSettings, options: WorkerOptions, count: int, *, log_format: str, log_level: str
) -> int:
    """The `worker --processes N` body: N spawned workers, stopped together on SIGTERM/SIGINT."""
    group = start_processes(settings, options, count, log_format=log_format, log_level=log_level)
    stopping = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stopping["now"] = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping["now"] and group.alive() == count:
            time.sleep(0.1)
        reports = group.stop(timeout=options.grace + 10)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = [r for r in reports if r.error] + [None for code in group.exit_codes() if code not in (0, None)]
    return 1 if failed else 0
