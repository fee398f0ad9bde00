"""Many databases, one worker: a sqld serving namespaces 20 ms away (through `LatencyProxy`).

(a) `--tenants` namespaces with `--orders` orders each (the demo's statechart, 4 events an
    order) drained by ONE worker process serving them all (`run_process` on HAREL_EDGE_DATABASES),
    against the same events in ONE database drained by the same worker: the rate as a ratio, each
    tenant's finish time (from the worker's start to its last commit) against the median tenant's,
    and whether every order of every tenant was delivered.
(b) `--idle` namespaces with nothing to do: the requests the worker sends the primary a second
    (counted at the executor), and how long one event published to one of them waits to be handled.
    With `--doorbell`, the deployment has one (HAREL_EDGE_DOORBELL): the worker's idle pauses grow
    to 90 s, so the count waits `--idle-warmup` seconds first, and the event's publish rings.

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_databases.py
    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_databases.py --tenants 50 --orders 100 --idle 500
    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_databases.py --tenants 2 --orders 10 --idle 500 \
        --doorbell --idle-warmup 240 --idle-seconds 90

Only ratios of one run mean anything: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import time
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

from harel.engine.execution import Execution  # noqa: E402
from harel.spec.states import Event  # noqa: E402

import harel_edge.examples.actions as actions  # noqa: E402
from harel_edge import logs  # noqa: E402
from harel_edge.deployment import create_database  # noqa: E402
from harel_edge.executor import Stmt, open_executor  # noqa: E402
from harel_edge.executor.http import PrimaryHttp  # noqa: E402
from harel_edge.migration import migrate  # noqa: E402
from harel_edge.queue import LibsqlTransport, Message  # noqa: E402
from harel_edge.settings import ExplicitSettings  # noqa: E402
from harel_edge.store import EdgeStore  # noqa: E402
from harel_edge.testing import start_sqld_primary  # noqa: E402
from harel_edge.testing.proxy import LatencyProxy  # noqa: E402
from harel_edge.worker import WorkerOptions, parse_workflow  # noqa: E402
from harel_edge.worker_process import run_process, tune_garbage_collector  # noqa: E402

EXAMPLES = str(Path(actions.__file__).parent)
STEPS = (("Start", {}), ("Pay", {"amount": 2.0}), ("Ship", {}), ("Deliver", {}))
# sqld keeps 100 namespaces open by default, and one evicted while others are asked for answered
# "doesn't exist" at times (docs/deploy.md): the deployment measured keeps all of them open.
ACTIVE = ("--max-active-namespaces", "2000")
WATCH_EVERY = 0.02  # seconds between two looks at a queue's length, one database at a time
SENT = [0]  # the worker's requests to the primary (through the proxy), counted at the executor


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of this process (the worker, the watch) and of every sqld process here."""
    tick, sqld = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sqld":
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                sqld += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue  # gone meanwhile
    return sum(os.times()[:2]), sqld


def count_requests(through: str) -> None:
    send = PrimaryHttp.send

    async def counted(self, *args, **kwargs):  # noqa: ANN001, ANN202
        SENT[0] += self.where == through  # the watchers and the seeding reach the primary directly
        return await send(self, *args, **kwargs)

    PrimaryHttp.send = counted


def create(server, names: list[str]) -> None:
    """Make each namespace as `harel-edge databases create` does (waiting until sqld serves it)."""
    made = ExplicitSettings.load(
        profile="sqld", url=server.http_url, auth_token=server.rw_token, admin_url=server.admin_url, databases=",".join(names)
    )
    for name in names:
        create_database(made, name)


def seed(settings, orders: int, tenant: str) -> None:
    migrate(settings)
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        for i in range(orders):
            store.save(Execution(id=f"{tenant}-{i}", definition_id="order"))
        t.publish_many(Message(f"{tenant}-{i}", Event(kind=k, data=d)) for i in range(orders) for k, d in STEPS)


async def drain(settings, direct: dict, orders: int, timeout: float) -> dict:
    """Run one worker process on `settings` until every database in `direct` is empty.

    The watch asks one database at a time, WATCH_EVERY apart whatever their number, so it costs
    sqld and the loop the same with one database as with fifty; each tenant's finish is its last
    commit's own stamp (harel's `updated_at`), not the moment the watch saw it empty."""
    watchers = {name: open_executor(one) for name, one in direct.items()}
    stop = asyncio.Event()
    options = WorkerOptions(definitions_dir=EXAMPLES)  # what `harel-edge worker` runs
    began, began_wall, sent, cpu = time.monotonic(), time.time(), SENT[0], cpu_seconds()
    worker = asyncio.create_task(run_process(settings, options, stop))
    waiting = list(watchers)
    while waiting and time.monotonic() - began < timeout and not worker.done():
        name = waiting.pop(0)
        left = (await watchers[name].execute(Stmt("SELECT count(*) FROM bench_transport_messages"))).rows[0][0]
        if left:
            waiting.append(name)
        await asyncio.sleep(WATCH_EVERY)
    requests = SENT[0] - sent
    worker_cpu, sqld_cpu = (after - before for after, before in zip(cpu_seconds(), cpu, strict=True))
    stop.set()
    await worker
    delivered, finished = 0, {}
    for name, watcher in watchers.items():
        sql = "SELECT count(*) FROM bench_executions WHERE json_extract(data, '$.active_path') = 'Delivered'"
        delivered += (await watcher.execute(Stmt(sql))).rows[0][0]
        last = "SELECT max(json_extract(data, '$.updated_at')) FROM bench_executions"
        finished[name] = (await watcher.execute(Stmt(last))).rows[0][0] - began_wall
        await watcher.aclose()
    seconds = max(finished.values())
    events = len(watchers) * orders * len(STEPS) if len(watchers) > 1 else orders * len(STEPS)
    return {"seconds": seconds, "events": events, "rate": events / seconds, "finished": finished, "delivered": delivered,
            "requests": requests, "worker_cpu": worker_cpu, "sqld_cpu": sqld_cpu}


async def idle(settings, direct: dict, seconds: float, warmup: float, workflows: bool = False) -> dict:
    """The requests an idle worker of every database sends a second, then one event's wait.
    With `workflows`, each database's worker also runs the demo's durable workflow loop."""
    stop = asyncio.Event()
    loops = (parse_workflow("fulfil=harel_edge.examples.workflow:fulfil"),) if workflows else ()
    options = WorkerOptions(definitions_dir=EXAMPLES, workflows=loops)  # what `harel-edge worker` runs
    ready = asyncio.Event()
    worker = asyncio.create_task(run_process(settings, options, stop, ready=ready.set))
    await asyncio.wait_for(ready.wait(), 300)
    await asyncio.sleep(warmup)  # every idle backoff at (or near) its longest
    before, began = SENT[0], time.monotonic()
    await asyncio.sleep(seconds)
    per_second = (SENT[0] - before) / (time.monotonic() - began)
    name, one = next(iter(direct.items()))
    await asyncio.to_thread(seed, one, 1, "late")
    published = time.monotonic()
    watcher = open_executor(one)
    while (await watcher.execute(Stmt("SELECT count(*) FROM bench_transport_messages"))).rows[0][0] > 0:
        await asyncio.sleep(0.01)
    waited = time.monotonic() - published
    await watcher.aclose()
    stop.set()
    await worker
    return {"requests_per_second": per_second, "pickup_seconds": waited}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--orders", type=int, default=100, help="orders a tenant, 4 events each")
    parser.add_argument("--busy", type=int, help="how many of the tenants have orders (default: all); the rest stay idle")
    parser.add_argument("--idle", type=int, default=500, help="idle namespaces for (b); 0: skip it")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="how long the idle requests are counted")
    parser.add_argument("--idle-warmup", type=float, default=2.0, help="seconds idle before they are counted")
    parser.add_argument("--doorbell", action="store_true", help="give the deployment a doorbell for (b)")
    parser.add_argument("--workflows", action="store_true", help="(b)'s workers also run a durable workflow loop each")
    parser.add_argument("--rtt", type=float, default=20.0, help="milliseconds to the primary")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--max-in-flight", type=int, help="HAREL_EDGE_MAX_IN_FLIGHT of the worker (default: the setting's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logs.configure_logging(level="error")
    tune_garbage_collector()
    tag = secrets.token_hex(2)
    rows: dict = {}
    with start_sqld_primary(namespaces=True, extra_args=ACTIVE) as server, LatencyProxy(server.http_port, delay=args.rtt / 2000) as proxy:
        count_requests(proxy.url)
        common = {"prefix": "bench", "worker_id": "bench", "auth_token": server.rw_token}
        if args.max_in_flight:
            common["max_in_flight"] = args.max_in_flight

        def deployment(url: str, names: list[str], **more: str) -> ExplicitSettings:
            return ExplicitSettings.load(profile="sqld", url=url, databases=",".join(names), **common, **more)

        tenants = [f"t{tag}-{i}" for i in range(args.tenants)]
        busy = tenants[: args.busy or args.tenants]
        create(server, [f"one{tag}", *tenants])
        one = ExplicitSettings.load(profile="sqld", url=proxy.url, database=f"one{tag}", **common)
        one_direct = ExplicitSettings.load(profile="sqld", url=server.http_url, database=f"one{tag}", **common)
        for i in range(len(busy)):
            seed(one_direct, args.orders, f"t{i}")
        many, many_direct = deployment(proxy.url, tenants), deployment(server.http_url, tenants)
        for name in busy:
            seed(many_direct.for_database(name), args.orders, name)
        rows["one database"] = asyncio.run(drain(one, {"one": one_direct}, len(busy) * args.orders, args.timeout))
        direct = {name: many_direct.for_database(name) for name in busy}
        rows["many databases"] = asyncio.run(drain(many, direct, args.orders, args.timeout))
        if args.idle:
            quiet = [f"q{tag}-{i}" for i in range(args.idle)]
            bell = {"doorbell": f"bell{tag}"} if args.doorbell else {}
            quiet_direct = deployment(server.http_url, quiet, **bell)
            for name in [*quiet, *bell.values()]:
                # Each migrated as soon as made: sqld 0.24 loses a namespace made and not yet used
                # once --max-active-namespaces (100) others were made after it (docs/deploy.md).
                create(server, [name])
                migrate(quiet_direct.for_database(name))
            rows["idle"] = asyncio.run(idle(
                deployment(proxy.url, quiet, **bell), {name: quiet_direct.for_database(name) for name in quiet[:1]},
                args.idle_seconds, args.idle_warmup, args.workflows,
            ))
    single, spread = rows["one database"], rows["many databases"]
    finishes = sorted(spread["finished"].values())
    median = statistics.median(finishes) if finishes else float("nan")
    print(f"{args.tenants} tenants, {len(busy)} of them with {args.orders} orders (4 events each), "
          f"{args.rtt:g} ms to the primary\n")
    print("| drain | events/s | vs one database | requests to the primary | CPU s: worker / sqld "
          "| slowest tenant vs median | every order delivered |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    total = len(busy) * args.orders
    print(f"| one database | {single['rate']:.0f} | 1.00x | {single['requests']} "
          f"| {single['worker_cpu']:.1f} / {single['sqld_cpu']:.1f} | | {single['delivered'] == total} |")
    print(
        f"| {args.tenants} databases, one worker | {spread['rate']:.0f} | {spread['rate'] / single['rate']:.2f}x "
        f"| {spread['requests']} | {spread['worker_cpu']:.1f} / {spread['sqld_cpu']:.1f} "
        f"| {max(finishes) / median:.2f}x | {spread['delivered'] == total} |"
    )
    if "idle" in rows:
        quiet_row = rows["idle"]
        print(f"\n{args.idle} idle databases{' with a doorbell' if args.doorbell else ''}"
              f"{' and a workflow loop each' if args.workflows else ''}: "
              f"{quiet_row['requests_per_second']:.1f} requests/s to the primary; "
              f"one new event handled after {quiet_row['pickup_seconds']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
