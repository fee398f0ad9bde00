"""harel_edge's worker on one file against what a user would pick instead: DBOS and huey.

Durable workflows: `n` workflows of three steps (reserve, charge: an exactly-once insert, ship),
drained by harel_edge's worker (`run_worker`, what `harel-edge worker --workflow` runs) and by
DBOS 3.4's SQLite queue: harel_edge with 32 passes at once (its default), 16 and 1, DBOS with
16 (what it sustains on SQLite here: at 32 its writers time out on the write lock). Statechart events: the demo's order
statechart, four events an order, drained by harel_edge's worker, against huey 3.5's SqliteHuey
doing the same work per task by hand (read the order's state, apply the event, write it back),
and a huey task that only inserts a row. Every file is SQLite in WAL with synchronous=FULL.

Each measurement runs in a fresh process, rounds interleaved, medians reported. The peers run in
a venv of their own (`.cache/peers-venv`, made on first use with pip), from `peer_workloads.py`.

    .venv/bin/python benchmarks/bench_peers.py
    .venv/bin/python benchmarks/bench_peers.py --workflows 200 --orders 200 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS_VENV = HERE.parent / ".cache" / "peers-venv"
PEERS = ("dbos==3.4.0", "huey==3.5.4")
NAMESPACE = "bench"
LEDGER = "CREATE TABLE IF NOT EXISTS bench_ledger (workflow TEXT PRIMARY KEY, amount REAL NOT NULL)"


def peers_python() -> Path:
    """The peers' interpreter, installing them on first use."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS], check=True)
    return python


def count(path: Path, sql: str) -> int:
    """Through libsql, as the worker in this process: a second SQLite library on a file in the
    same process breaks SQLite's locks (docs/operations.md, "One SQLite library a process")."""
    import libsql  # noqa: PLC0415

    conn = libsql.connect(str(path))
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


async def wait_for(path: Path, sql: str, target: int, timeout: float = 600.0) -> float:
    """When `sql` counts `target` (perf_counter), polled every 10 ms off the event loop, on a new
    connection each time, as the peers are."""

    def poll() -> float:
        deadline = time.monotonic() + timeout
        while count(path, sql) < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sql!r} did not reach {target} within {timeout:.0f} s")
            time.sleep(0.01)
        return time.perf_counter()

    return await asyncio.to_thread(poll)


# ---- harel_edge, in the process `--one` starts ------------------------------------------------------


async def fulfil(ctx):  # noqa: ANN001, ANN201 - the worker loads it as __main__:fulfil
    """The workflow DBOS runs too: reserve, charge exactly once, ship."""
    from harel_edge.durable import SqlEffect  # noqa: PLC0415

    k = int(ctx.workflow.removeprefix("wf-"))
    reservation = await ctx.step("reserve", lambda: {"order": k, "items": 1})
    charge = await ctx.transact(
        "charge", SqlEffect(("INSERT INTO bench_ledger VALUES (?, ?)", (ctx.workflow, 5.0 + k % 50)), value=k)
    )
    shipment = await ctx.step("ship", lambda: {"carrier": "edge-post", "order": k})
    return {"reservation": reservation, "charge": charge, "shipment": shipment}


def edge_settings(directory: Path, **overrides: object):  # noqa: ANN201
    from harel_edge.settings import ExplicitSettings  # noqa: PLC0415

    return ExplicitSettings.load(profile="local", db_path=str(directory / "edge.db"), durability="full", **overrides)


async def edge_workflows(directory: Path, n: int, passes: int) -> dict:
    from harel_edge.durable import LibsqlScheduler, connect, migrate  # noqa: PLC0415
    from harel_edge.migration import migrate as migrate_schema  # noqa: PLC0415
    from harel_edge.worker import WorkerOptions, parse_workflow, run_worker  # noqa: PLC0415

    settings = edge_settings(directory, max_workflow_passes=passes)
    migrate_schema(settings)
    database = connect(settings)
    try:
        await migrate(database)
        await database.execute("bench.ledger", LEDGER)
        scheduler = LibsqlScheduler(database, namespace=NAMESPACE)
        await asyncio.gather(*(scheduler.make_ready(f"wf-{k}") for k in range(n)))
    finally:
        await database.aclose()
    path = Path(settings.db_path)
    stop, began = asyncio.Event(), []
    options = WorkerOptions(workflows=(parse_workflow(f"{NAMESPACE}=__main__:fulfil"),), poll=0.01, sample_every=3600)
    worker = asyncio.create_task(run_worker(settings, options, stop, ready=lambda: began.append(time.perf_counter())))
    ended = await wait_for(path, "SELECT count(*) FROM workflow_checkpoint WHERE step = 'ship'", n)
    left = count(path, "SELECT count(*) FROM workflow_queue")
    stop.set()
    await worker
    return {"peer": f"harel_edge worker, {passes} passes at once", "work": n, "per_s": n / (ended - began[0]),
            "ledger_rows": count(path, "SELECT count(*) FROM bench_ledger"), "queue_left": left}


async def edge_events(directory: Path, orders: int) -> dict:
    sys.path.insert(0, str(HERE))
    from bench_worker import DELIVERED, EXAMPLES, STEPS, seed_edge  # noqa: PLC0415

    from harel_edge.worker import WorkerOptions, run_worker  # noqa: PLC0415

    settings = edge_settings(directory)
    seed_edge(settings, orders)
    path = Path(settings.db_path)
    stop, began = asyncio.Event(), []
    options = WorkerOptions(definitions_dir=str(EXAMPLES), idle_sleep=0.005, sample_every=3600)
    worker = asyncio.create_task(run_worker(settings, options, stop, ready=lambda: began.append(time.perf_counter())))
    # The queue empties with the commit of the last event's transition (its ack is in that commit).
    # Whether any message is left, not how many: the poll runs in the worker's process, and libsql
    # holds the GIL while it counts (a count of thousands of rows every 10 ms is the worker's time).
    left = f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {settings.prefix}_transport_messages) THEN 0 ELSE {orders} END"
    ended = await wait_for(path, left, orders)
    stop.set()
    await worker
    events = orders * len(STEPS)
    return {"peer": "harel_edge worker, the order statechart", "work": events, "per_s": events / (ended - began[0]),
            "done": count(path, DELIVERED.format(p=settings.prefix))}


def one(kind: str, directory: Path, size: int) -> dict:
    from harel_edge import logs  # noqa: PLC0415
    from harel_edge.worker_process import tune_garbage_collector  # noqa: PLC0415

    logs.configure_logging(level="warning", stream=sys.stderr)
    tune_garbage_collector()  # as a worker process does (`serve`)
    if kind.startswith("edge-workflows-"):
        return asyncio.run(edge_workflows(directory, size, int(kind.rsplit("-", 1)[1])))
    return asyncio.run(edge_events(directory, size // 4))


# ---- the runs --------------------------------------------------------------------------------------


def measure(kind: str, size: int) -> dict:
    """One measurement in a fresh process, on a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as directory:
        if kind.startswith("edge-"):
            command = [sys.executable, str(Path(__file__).resolve()), "--one", kind, directory, str(size)]
        else:
            command = [str(peers_python()), str(HERE / "peer_workloads.py"), kind, directory, str(size)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{kind} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--orders", type=int, default=2000, help="orders of four events each (shorter runs are noisy)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("KIND", "DIR", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, directory, size = args.one
        print(json.dumps(one(kind, Path(directory), int(size))), flush=True)
        return
    peers_python()
    jobs = [
        ("workflows", "edge-workflows-32", args.workflows),
        ("workflows", "edge-workflows-16", args.workflows),
        ("workflows", "edge-workflows-1", args.workflows),
        ("workflows", "dbos", args.workflows),
        ("events", "edge-events", args.orders * 4),
        ("events", "huey", args.orders * 4),
        ("events", "huey-bare", args.orders * 4),
    ]
    results: dict[str, list[dict]] = {kind: [] for _, kind, _ in jobs}
    for r in range(args.rounds):
        for _, kind, size in jobs:
            result = measure(kind, size)
            results[kind].append(result)
            print(f"round {r + 1}: {kind}: {result['per_s']:.0f}/s {json.dumps(result)}", file=sys.stderr, flush=True)
    median = {kind: statistics.median(r["per_s"] for r in rows) for kind, rows in results.items()}
    baseline = {"workflows": median["dbos"], "events": median["huey"]}
    print("| work | runs it | per second (median) | rounds | vs the peer |")
    print("| --- | --- | ---: | --- | ---: |")
    for work, kind, _ in jobs:
        rows = results[kind]
        spread = ", ".join(f"{r['per_s']:.0f}" for r in rows)
        print(f"| {work} | {rows[0]['peer']} | {median[kind]:,.0f} | {spread} | {median[kind] / baseline[work]:.2f}x |")
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
