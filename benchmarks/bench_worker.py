"""The worker, the product's main job: events per second and event-loop lag, one process.

For each profile, `orders` executions of the demo's order statechart (`order.stm`) get their
four events (Start, Pay, Ship, Deliver) queued, then ONE worker (`harel_edge.worker.run_worker`,
what `harel-edge worker` runs, concurrency 32) drains them in this process while a ticker
coroutine asks the loop for 1 ms sleeps. Reported per row: events/s from the first event
handled to the queue empty, the ticker's lateness (p50, p99, worst) in that window, and whether
every order ended Delivered.

sqld and replica reach a real sqld (`harel_edge.testing`, binary or Docker) through
`harel_edge.testing.proxy.LatencyProxy`, `--delay` seconds each way (10 ms: a 20 ms round trip).
`harel-local` is harel 0.9's own async worker (`AsyncWorker`) on its `AsyncSqliteStore` and
`AsyncSqliteTransport`, on a local file, the peer for the local profile's ratio.

    .venv/bin/python benchmarks/bench_worker.py
    .venv/bin/python benchmarks/bench_worker.py --profiles sqld --orders 100 --delay 0.01

Compare rows of one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_edge import logs
from harel_edge.executor import Stmt, open_executor
from harel_edge.migration import migrate
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions, run_worker
from harel_edge.worker_process import tune_garbage_collector

EXAMPLES = Path(__file__).resolve().parents[1] / "harel_edge" / "examples"
STEPS = (("Start", {}), ("Pay", {"amount": 1.0}), ("Ship", {}), ("Deliver", {}))


def messages(orders: int) -> list[Message]:
    return [
        Message(f"order-{i:04d}", Event(kind=kind, data=data), priority=i % 4)
        for i in range(orders)
        for kind, data in STEPS
    ]


def seed_edge(settings, orders: int) -> None:
    migrate(settings)
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        for i in range(orders):
            store.save(Execution(id=f"order-{i:04d}", definition_id="order", priority=i % 4))
        t.publish_many(messages(orders))


class Probe:
    """The ticker's lateness and the drain's window, while `depth()` is polled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.lags: list[float] = []
        self.started: float | None = None
        self.ended: float | None = None
        self.left_at_start = total
        self.depths: list[tuple[float, int]] = []  # (time, messages left) at each poll

    async def tick(self, done: asyncio.Event) -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            if self.started is not None:
                self.lags.append(time.perf_counter() - before - 0.001)

    async def watch(self, depth, done: asyncio.Event, timeout: float) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = await depth()
            now = time.perf_counter()
            self.depths.append((now, left))
            if self.started is None and left < self.total:
                # From the last poll that saw nothing handled: a fast drain (a local file) can
                # be over before the poll after its first event, and would count as no rate.
                self.started = self.depths[-2][0] if len(self.depths) > 1 else now
                self.left_at_start = self.total
            if left == 0:
                self.ended = now
                break
            await asyncio.sleep(0.02)
        done.set()

    def steady_rate(self) -> float:
        """Events/s over the middle half of the drain (from 3/4 left to 1/4 left): the rate once
        the window has grown and before the last executions' events come one at a time."""
        upper = next(((t, n) for t, n in self.depths if n <= self.total * 3 / 4), None)
        lower = next(((t, n) for t, n in self.depths if n <= self.total / 4), None)
        if upper is None or lower is None or lower[0] <= upper[0]:
            return 0.0
        return round((upper[1] - lower[1]) / (lower[0] - upper[0]), 1)

    def row(self, name: str, delivered: int, orders: int) -> dict:
        ms = sorted(lag * 1000 for lag in self.lags) or [0.0]
        window = (self.ended or time.perf_counter()) - (self.started or time.perf_counter())
        handled = self.left_at_start if self.ended else 0
        return {
            "worker": name,
            "events": self.total,
            "events_per_s": round(handled / window, 1) if self.ended and window > 0 else 0.0,
            "steady_per_s": self.steady_rate(),
            "lag_p50_ms": round(statistics.median(ms), 2),
            "lag_p99_ms": round(ms[int(len(ms) * 0.99) - 1 if len(ms) > 1 else 0], 2),
            "lag_max_ms": round(ms[-1], 2),
            "all_delivered": delivered == orders,
        }


DELIVERED = "SELECT count(*) FROM {p}_executions WHERE json_extract(data, '$.status') = '" + Status.DONE.value + "'"


async def run_edge(settings, direct, orders: int, timeout: float) -> dict:
    """`direct`: settings that reach the data without the proxy, for seeding and the watcher's
    polls (seeding one execution at a time through a 100 ms proxy would take minutes)."""
    seed_edge(direct, orders)
    watcher = open_executor(direct)
    probe = Probe(orders * len(STEPS))
    done, stop = asyncio.Event(), asyncio.Event()
    p = settings.prefix

    async def depth() -> int:
        return int((await watcher.execute(Stmt(f"SELECT count(*) FROM {p}_transport_messages"))).rows[0][0])

    options = WorkerOptions(definitions_dir=str(EXAMPLES), idle_sleep=0.005, sample_every=5.0)
    worker = asyncio.create_task(run_worker(settings, options, stop))
    await asyncio.gather(probe.tick(done), probe.watch(depth, done, timeout))
    stop.set()
    await worker
    delivered = int((await watcher.execute(Stmt(DELIVERED.format(p=p)))).rows[0][0])
    await watcher.aclose()
    return probe.row(f"harel_edge {settings.profile}", delivered, orders)


async def run_harel_local(db: Path, orders: int, timeout: float) -> dict:
    """harel 0.9's own async worker on its SQLite store and transport (one file)."""
    from harel.engine.aio.distributed import AsyncWorker  # noqa: PLC0415
    from harel.engine.aio_store import AsyncSqliteStore  # noqa: PLC0415
    from harel.engine.aio_transport import AsyncSqliteTransport  # noqa: PLC0415
    from harel.engine.store import SqliteStore  # noqa: PLC0415
    from harel.engine.transport import SqliteTransport  # noqa: PLC0415
    from harel.worker import load_definitions  # noqa: PLC0415

    seed_store, seed_transport = SqliteStore(str(db)), SqliteTransport(str(db))
    for i in range(orders):
        seed_store.save(Execution(id=f"order-{i:04d}", definition_id="order", priority=i % 4))
    for message in messages(orders):
        seed_transport.publish(message.group_id, message.event, priority=message.priority)
    store, transport = await AsyncSqliteStore.create(str(db)), await AsyncSqliteTransport.create(str(db))
    worker = AsyncWorker(store, transport, load_definitions(str(EXAMPLES)), worker_id="harel", concurrency=32)
    probe = Probe(orders * len(STEPS))
    done, stop = asyncio.Event(), asyncio.Event()

    async def depth() -> int:
        return seed_transport._conn.execute("SELECT count(*) FROM harel_transport_messages").fetchone()[0]

    running = asyncio.create_task(worker.run(stop))
    await asyncio.gather(probe.tick(done), probe.watch(depth, done, timeout))
    stop.set()
    await running
    delivered = seed_store._conn.execute(DELIVERED.format(p="harel")).fetchone()[0]
    await store.close()
    await transport.close()
    return probe.row("harel 0.9 AsyncWorker, sqlite", delivered, orders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="harel-local,local,sqld,replica")
    parser.add_argument("--orders", type=int, default=100, help="executions; each gets 4 events")
    parser.add_argument("--delay", type=float, default=0.010, help="proxy delay each way, seconds")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tune_garbage_collector()  # as a worker process does (`serve`)
    logs.configure_logging(level="warning", stream=sys.stderr)
    profiles = args.profiles.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        server = proxy = None
        if {"sqld", "replica"} & set(profiles):
            from harel_edge.testing import start_sqld_primary  # noqa: PLC0415
            from harel_edge.testing.proxy import LatencyProxy  # noqa: PLC0415

            server = start_sqld_primary()
            proxy = LatencyProxy(server.http_port, delay=args.delay)
        try:
            for n, profile in enumerate(profiles):
                if profile == "harel-local":
                    rows.append(asyncio.run(run_harel_local(tmp_path / "harel.db", args.orders, args.timeout)))
                    continue
                common = {"prefix": f"b{n}", "worker_id": f"bench-{n}", "visibility": 30.0}
                if profile == "local":
                    settings = direct = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "edge.db"), **common)
                else:
                    remote = {"auth_token": server.rw_token, **common}
                    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, **remote)
                    if profile == "sqld":
                        settings = ExplicitSettings.load(profile="sqld", url=proxy.url, **remote)
                    else:
                        settings = ExplicitSettings.load(
                            profile="replica", db_path=str(tmp_path / f"replica{n}.db"), sync_url=proxy.url, **remote
                        )
                rows.append(asyncio.run(run_edge(settings, direct, args.orders, args.timeout)))
        finally:
            if proxy is not None:
                proxy.close()
            if server is not None:
                server.close()
    peer = next((r["events_per_s"] for r in rows if r["worker"].startswith("harel 0.9")), None)
    print(f"\nOne worker process, demo statechart, {args.orders * 4} events, proxy {args.delay * 1000:g} ms each way\n")
    print("| worker | events/s | vs harel's worker | loop lag p50 / p99 / max (ms) | all delivered |")
    print("| --- | ---: | ---: | --- | --- |")
    for r in rows:
        ratio = f"{r['events_per_s'] / peer:.2f}x" if peer and r["worker"].endswith("local") else ""
        print(
            f"| {r['worker']} | {r['events_per_s']} | {ratio} | {r['lag_p50_ms']} / {r['lag_p99_ms']} / "
            f"{r['lag_max_ms']} | {r['all_delivered']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
