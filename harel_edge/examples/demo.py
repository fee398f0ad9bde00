"""`harel-edge demo`: the whole job on one machine, in a few seconds (steps: docs/quickstart.md).

It ignores HAREL_EDGE_* settings on purpose: it must not write into a deployment's database.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from harel.engine.execution import Execution, Status
from harel.spec.states import Event
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harel_edge.connection import EdgeConnection
from harel_edge.durable import Database, LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler
from harel_edge.examples.workflow import LEDGER_DDL
from harel_edge.loop_thread import run_main
from harel_edge.migration import migrate
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import EdgeSettings, ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.supervisor import WorkerProcesses, start_processes
from harel_edge.worker import WorkerOptions, WorkerReport, parse_workflow

EXAMPLES = Path(__file__).parent
ROUTING_KEYS = ("eu", "us", "ap")
NAMESPACE = "fulfil"
STEPS = (("Start", {}), ("Pay", {"amount": 0.0}), ("Ship", {}), ("Deliver", {}))
WORKERS = (("edge-1", ()), ("edge-2", ("eu",)))


def demo_settings(path: Path) -> EdgeSettings:
    return ExplicitSettings.load(profile="local", db_path=str(path), worker_id="edge", visibility=10.0)


def prepare_database(settings: EdgeSettings) -> None:
    """The schema, and the table the sample workflow's charges go to."""
    migrate(settings)
    with EdgeStore(settings, create_schema=False) as store:
        store.execute(LEDGER_DDL)


def seed(settings: EdgeSettings, orders: int) -> dict[str, str]:
    """Create the orders and queue their events; return each order's routing key."""
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as transport:
        keys: dict[str, str] = {}
        batch: list[Message] = []
        for i in range(orders):
            order = f"order-{i + 1:03d}"
            keys[order] = ROUTING_KEYS[i % len(ROUTING_KEYS)]
            if store.load(order) is None:
                store.save(Execution(id=order, definition_id="order", priority=i % 4))
            for kind, data in STEPS:
                payload = {"amount": 10.0 + i} if kind == "Pay" else data
                batch.append(Message(order, Event(kind=kind, data=payload), i % 4, keys[order]))
        transport.publish_many(batch)
        return keys


async def _look(durable: LibsqlDurable, confirmed: set[str]) -> tuple[int, int, int]:
    """(events left in the queue, orders delivered, workflows finished); on the way, delivers
    the confirmation of every workflow that has charged, as a warehouse would."""

    def read(c):  # noqa: ANN001, ANN202 - EdgeConnection
        prefix = c.settings.prefix
        left = c.execute(f"SELECT count(*) FROM {prefix}_transport_messages")[0][0]
        done = c.execute(
            f"SELECT count(*) FROM {prefix}_executions WHERE json_extract(data, '$.status') = ?",
            (Status.DONE.value,),
        )[0][0]
        finished = c.execute("SELECT count(*) FROM workflow_checkpoint WHERE step = '$result'")[0][0]
        charged = [r[0] for r in c.execute("SELECT workflow FROM workflow_checkpoint WHERE step = 'charge'")]
        return int(left), int(done), int(finished), charged

    left, done, finished, charged = await durable.database.run(read)
    for workflow in charged:
        if workflow not in confirmed:
            await durable.arrive(workflow, "confirmation", {"by": "demo"})
            confirmed.add(workflow)
    return left, done, finished


def run_demo(path: Path, *, orders: int, workflows: int, timeout: float, console: Console) -> bool:
    """Run the demo on `path`; print progress and a summary; True when everything completed."""
    return run_main(_demo(path, orders, workflows, timeout, console))


async def _demo(path: Path, orders: int, workflows: int, timeout: float, console: Console) -> bool:
    started = time.monotonic()
    settings = demo_settings(path)
    prepare_database(settings)
    workflow_ids = [f"fulfil-{i + 1:03d}" for i in range(workflows)]
    events_total = orders * len(STEPS)

    options = WorkerOptions(
        definitions_dir=str(EXAMPLES),
        workflows=(parse_workflow(f"{NAMESPACE}=harel_edge.examples.workflow:fulfil"),),
        idle_sleep=0.01,
        poll=0.05,
        grace=10.0,
        sample_every=1.0,
        group_counts=True,
    )
    routing = dict(WORKERS)

    def per_worker(index: int, mine: EdgeSettings) -> EdgeSettings:
        name = WORKERS[index][0]
        return mine.model_copy(update={"worker_id": name, "routing_keys": routing[name]})

    console.print(
        f"harel-edge demo: {orders} orders ({events_total} events, routing keys {', '.join(ROUTING_KEYS)}, "
        f"priorities 0-3) and {workflows} durable workflows, two worker processes, in {path}",
        markup=False,
    )
    group = start_processes(settings, options, len(WORKERS), log_level="warning", per_worker=per_worker)
    completed = False
    database = Database(EdgeConnection(settings))
    keys: dict[str, str] = {}
    ready_after = work_seconds = None
    try:
        with console.status("starting two worker processes (spawn)"):
            ready = await asyncio.to_thread(group.wait_ready, 60.0)
        if ready:
            ready_after = time.monotonic() - started
            keys = await asyncio.to_thread(seed, settings, orders)
            completed = await _watch(database, group, workflow_ids, orders, events_total, timeout, console)
            work_seconds = time.monotonic() - started - ready_after
        else:
            console.print("the workers did not start; see their errors above", markup=False)
    finally:
        reports = await asyncio.to_thread(group.stop, options.grace + 10)
        ledger = await database.run(
            lambda c: c.execute("SELECT count(*), count(DISTINCT workflow) FROM demo_ledger")[0]
        )
        await database.aclose()
    elapsed = time.monotonic() - started
    charges, charged_workflows = int(ledger[0]), int(ledger[1])
    _summary(console, reports, keys, routing)
    exactly_once = charges == charged_workflows == workflows
    ok = completed and exactly_once and len(reports) == len(WORKERS) and all(r.error is None for r in reports)
    console.print(
        f"{'done' if ok else 'INCOMPLETE'} in {elapsed:.1f} s: {orders} orders delivered, "
        f"{workflows} workflows finished, {charges} charges for {charged_workflows} workflows "
        f"({'each exactly once' if exactly_once else 'NOT exactly once'})",
        markup=False,
    )
    if ready_after is not None and work_seconds is not None:
        console.print(
            f"workers ready after {ready_after:.1f} s; publishing and processing took {work_seconds:.2f} s",
            markup=False,
        )
    return ok


async def _watch(
    database: Database,
    group: WorkerProcesses,
    workflow_ids: list[str],
    orders: int,
    events_total: int,
    timeout: float,
    console: Console,
) -> bool:
    """Start the workflows, then show progress until everything is done; True if it was."""
    durable = LibsqlDurable(LibsqlCheckpointer(database), LibsqlScheduler(database, namespace=NAMESPACE))
    for name in workflow_ids:
        await durable.scheduler.make_ready(name)
    confirmed: set[str] = set()
    with Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        events_bar = progress.add_task("statechart events", total=events_total)
        orders_bar = progress.add_task("orders delivered", total=orders)
        flows_bar = progress.add_task("workflows finished", total=len(workflow_ids))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left, done, finished = await _look(durable, confirmed)
            progress.update(events_bar, completed=events_total - left)
            progress.update(orders_bar, completed=done)
            progress.update(flows_bar, completed=finished)
            if left == 0 and done == orders and finished == len(workflow_ids):
                return True
            if group.alive() < len(group.processes):
                console.print("a worker process stopped early; see its error above", markup=False)
                return False
            await asyncio.sleep(0.05)
    console.print(f"not finished after {timeout:g} s", markup=False)
    return False


def _summary(console: Console, reports: list[WorkerReport], keys: dict[str, str], routing: dict) -> None:
    table = Table(title="what each worker did")
    for column in ("worker", "keys", "claims", "acked", "acked by key", "workflow passes", "steps"):
        table.add_column(column, justify="right" if column in ("claims", "acked", "steps") else "left")
    for report in sorted(reports, key=lambda r: r.worker_id):
        by_key: dict[str, int] = {}
        for group, count in report.groups.items():
            by_key[keys.get(group, "-")] = by_key.get(keys.get(group, "-"), 0) + count
        passes = ", ".join(f"{k} {v}" for k, v in sorted(report.passes.items())) or "-"
        table.add_row(
            report.worker_id,
            ", ".join(routing.get(report.worker_id, ())) or "any",
            str(report.claims),
            str(report.acks),
            ", ".join(f"{k} {v}" for k, v in sorted(by_key.items())) or "-",
            passes,
            str(report.steps),
        )
        if report.error:
            console.print(f"{report.worker_id} failed: {report.error}", markup=False)
    console.print(table)
