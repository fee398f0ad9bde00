"""Hot groups: one worker's rate when a few executions have many events queued (a device streaming
readings, an order receiving its steps at once), against harel 0.9's own worker on the same shape.

Each shape is `groups x events`: that many executions of a counter statechart (a Start, then
Ticks that each add one), every event queued before ONE worker (`run_worker`, what `harel-edge
worker` runs) starts. Reported per cell: events/s from the worker's start (its loops about to
run) to the queue empty, the first claim's round trip included,
the same per group, the rate as a share of the same profile's at 0 ms, and whether every counter
ended at its number of ticks. sqld and replica reach a real sqld through `LatencyProxy` at each
round trip of `--rtts`; `harel` is harel 0.9's own `AsyncWorker` on its SQLite store and transport
(one file), the peer for the local rows.

    .venv/bin/python benchmarks/bench_hot_groups.py
    .venv/bin/python benchmarks/bench_hot_groups.py --shapes 4x301 --profiles sqld,replica --rtts 0,100
    .venv/bin/python benchmarks/bench_hot_groups.py --max-run 1        # one commit an event, for contrast

Each cell runs in a process of its own, with a primary of its own. Compare rows of one run: the
machine is shared and noisy.

`--offered RATE` measures the worker's event loop at a fixed offered load instead (a lag measured
at saturation only measures the queue's length): a publisher process queues RATE Ticks a second,
round robin over the groups of each shape, for `--seconds`, straight to the primary, while a
ticker in the worker's loop asks for a 1 ms sleep again and again. Reported: how late the ticker
woke (p50, p99, worst) while the load was offered, the rate the worker kept up with, and whether
every counter ended right. Take RATE as half the saturated rate of the same shape and profile.
With `--pin` the worker has a core of its own, and sqld, the proxy and the publisher the others
(a primary elsewhere does not take the worker's CPU; binary sqld only).

    .venv/bin/python benchmarks/bench_hot_groups.py --offered 500 --shapes 4x1 --profiles sqld,replica --rtts 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_edge_tax import cores_apart  # the benchmarks directory is this script's
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import logs
from harel_edge.executor import Stmt, open_executor
from harel_edge.migration import migrate
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing.machines import COUNTER
from harel_edge.worker import WorkerOptions, run_worker
from harel_edge.worker_process import tune_garbage_collector

POLL = 0.005  # seconds between looks at the queue's depth


def shape(text: str) -> tuple[int, int]:
    groups, events = text.split("x")
    return int(groups), int(events)


def messages(groups: int, events: int) -> list[Message]:
    """Every group's Start, then its Ticks; published group after group, as a burst arrives."""
    return [
        Message(f"c-{g:04d}", Event(kind="Start" if i == 0 else "Tick"))
        for g in range(groups)
        for i in range(events)
    ]


async def drain(depth, started: asyncio.Future, timeout: float) -> float:  # noqa: ANN001
    """Seconds from the worker's start (`started`: its loops about to run, the schema in place) to
    the queue empty, polling `depth`: the first claim's round trip counts, as a user waits for it."""
    began = await asyncio.wait_for(started, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await depth() == 0:
            return time.perf_counter() - began
        await asyncio.sleep(POLL)
    raise SystemExit(f"the queue did not drain within {timeout} s")


class Seeded:
    """The counters seeded through `direct` (no proxy), each with `events` queued, and one worker
    (`run_worker`) on `settings` started on them; `depth` and `counts` read through `direct`."""

    def __init__(self, settings: ExplicitSettings, direct: ExplicitSettings, groups: int, events: int, definitions: Path) -> None:
        migrate(direct)
        with EdgeStore(direct, create_schema=False) as store, LibsqlTransport(settings=direct, create_schema=False) as transport:
            for g in range(groups):
                store.save(Execution(id=f"c-{g:04d}", definition_id="counter", context={"n": 0}))
            transport.publish_many(messages(groups, events))
        self.watcher, self.prefix = open_executor(direct), settings.prefix
        self.stop, self.started = asyncio.Event(), asyncio.get_running_loop().create_future()
        options = WorkerOptions(definitions_dir=str(definitions), idle_sleep=0.005)
        ready = lambda: self.started.set_result(time.perf_counter())  # noqa: E731
        self.worker = asyncio.create_task(run_worker(settings, options, self.stop, ready=ready))

    async def depth(self) -> int:
        return int((await self.watcher.execute(Stmt(f"SELECT count(*) FROM {self.prefix}_transport_messages"))).rows[0][0])

    async def counts(self) -> list[int]:
        """Stops the worker; every counter's count."""
        self.stop.set()
        await self.worker
        rows = (await self.watcher.execute(Stmt(f"SELECT json_extract(data, '$.context.n') FROM {self.prefix}_executions"))).rows
        await self.watcher.aclose()
        return [row[0] for row in rows]


async def run_edge(settings: ExplicitSettings, direct: ExplicitSettings, groups: int, events: int, definitions: Path, timeout: float) -> dict:
    """`direct` reaches the data without the proxy: seeding and the depth polls."""
    seeded = Seeded(settings, direct, groups, events, definitions)
    seconds = await drain(seeded.depth, seeded.started, timeout)
    counts = await seeded.counts()
    return {"seconds": seconds, "counts_right": len(counts) == groups and all(n == events - 1 for n in counts)}


async def run_harel(db: Path, groups: int, events: int, definitions: Path, timeout: float) -> dict:
    """harel 0.9's own async worker on its SQLite store and transport, on one file."""
    from harel.engine.aio.distributed import AsyncWorker  # noqa: PLC0415
    from harel.engine.aio_store import AsyncSqliteStore  # noqa: PLC0415
    from harel.engine.aio_transport import AsyncSqliteTransport  # noqa: PLC0415
    from harel.engine.store import SqliteStore  # noqa: PLC0415
    from harel.engine.transport import SqliteTransport  # noqa: PLC0415
    from harel.worker import load_definitions  # noqa: PLC0415

    seed_store, seed_transport = SqliteStore(str(db)), SqliteTransport(str(db))
    for g in range(groups):
        seed_store.save(Execution(id=f"c-{g:04d}", definition_id="counter", context={"n": 0}))
    for message in messages(groups, events):
        seed_transport.publish(message.group_id, message.event)
    store, transport = await AsyncSqliteStore.create(str(db)), await AsyncSqliteTransport.create(str(db))
    worker = AsyncWorker(store, transport, load_definitions(str(definitions)), worker_id="harel", concurrency=32)

    async def depth() -> int:
        return seed_transport._conn.execute("SELECT count(*) FROM harel_transport_messages").fetchone()[0]

    stop, started = asyncio.Event(), asyncio.get_running_loop().create_future()
    started.set_result(time.perf_counter())
    running = asyncio.create_task(worker.run(stop, idle_sleep=0.005))
    seconds = await drain(depth, started, timeout)
    stop.set()
    await running
    counts = [r[0] for r in seed_store._conn.execute("SELECT json_extract(data, '$.context.n') FROM harel_executions")]
    await store.close()
    await transport.close()
    return {"seconds": seconds, "counts_right": len(counts) == groups and all(c == events - 1 for c in counts)}


async def ticking(lags: list[float], stop: asyncio.Event) -> None:
    """How late a 1 ms sleep wakes, again and again, until `stop`."""
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - began - 0.001)


def publish_at(settings: ExplicitSettings, groups: int, rate: float, seconds: float) -> None:
    """The publisher process: `rate` Ticks a second, round robin over the groups, in 10 ms batches."""
    with LibsqlTransport(settings=settings, create_schema=False) as transport:
        began, sent, total = time.monotonic(), 0, int(rate * seconds)
        while sent < total:
            due = min(total, int((time.monotonic() - began) * rate) + 1)
            if due > sent:
                transport.publish_many(Message(f"c-{(sent + i) % groups:04d}", Event(kind="Tick")) for i in range(due - sent))
                sent = due
            time.sleep(0.01)


async def run_offered(settings: ExplicitSettings, direct: ExplicitSettings, groups: int, rate: float, seconds: float,
                      definitions: Path, timeout: float) -> dict:
    """The worker under `rate` events a second from a publisher process; the loop's lag meanwhile."""
    seeded = Seeded(settings, direct, groups, 1, definitions)
    await drain(seeded.depth, seeded.started, timeout)  # the Starts: the executions are running when the load begins
    lags: list[float] = []
    ticked = asyncio.Event()
    ticker = asyncio.create_task(ticking(lags, ticked))
    where = {"profile": direct.profile, "prefix": direct.prefix, "db_path": direct.db_path, "url": direct.url}
    command = [sys.executable, __file__, "--publish", json.dumps([where, groups, rate, seconds])]
    token = {"PUBLISH_TOKEN": direct.auth_token.get_secret_value()} if direct.auth_token else {}  # not on a command line
    others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
    if others:  # --pin: the publisher runs beside the primary, not on the worker's core
        token["PUBLISH_CORES"] = ",".join(map(str, sorted(others)))
    began = asyncio.get_running_loop().create_future()
    began.set_result(time.perf_counter())
    publisher = await asyncio.create_subprocess_exec(*command, env={**os.environ, **token})
    await publisher.wait()
    ticked.set()
    await ticker
    seconds_to_empty = await drain(seeded.depth, began, timeout)
    counts = await seeded.counts()
    lags.sort()
    total = int(rate * seconds)
    return {
        "lag_p50_ms": round(1000 * lags[len(lags) // 2], 3),
        "lag_p99_ms": round(1000 * lags[int(len(lags) * 0.99)], 3),
        "lag_max_ms": round(1000 * lags[-1], 3),
        "kept_up_per_s": round(total / seconds_to_empty),
        "counts_right": len(counts) == groups and sum(counts) == total,
    }


def run_cell(profile: str, rtt: float, groups: int, events: int, max_run: int | None, timeout: float,
             offered: tuple[float, float] | None = None, pin: bool = False) -> dict:
    """One cell, in this process: its own file or primary (and proxy)."""
    tune_garbage_collector()  # as a worker process does (`serve`)
    logs.configure_logging(level="warning", stream=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        definitions = Path(tmp) / "definitions"
        definitions.mkdir()
        (definitions / "counter.stm").write_text(COUNTER)
        if profile == "harel":
            return asyncio.run(run_harel(Path(tmp) / "harel.db", groups, events, definitions, timeout))
        common = {"prefix": "hot", "worker_id": "hot", **({"max_run": max_run} if max_run else {})}
        if profile == "local":
            settings = ExplicitSettings.load(profile="local", db_path=str(Path(tmp) / "edge.db"), **common)
            if offered:
                return asyncio.run(run_offered(settings, settings, groups, *offered, definitions, timeout))
            return asyncio.run(run_edge(settings, settings, groups, events, definitions, timeout))
        from harel_edge.testing import start_sqld_primary  # noqa: PLC0415
        from harel_edge.testing.proxy import LatencyProxy  # noqa: PLC0415

        with cores_apart(pin) as worker_core, start_sqld_primary() as server, LatencyProxy(
            server.http_port, delay=rtt / 2000
        ) as proxy:
            worker_core()
            common["auth_token"] = server.rw_token
            direct = ExplicitSettings.load(profile="sqld", url=server.http_url, **common)
            if profile == "sqld":
                settings = ExplicitSettings.load(profile="sqld", url=proxy.url, **common)
            else:
                settings = ExplicitSettings.load(
                    profile="replica", db_path=str(Path(tmp) / "replica.db"), sync_url=proxy.url, **common
                )
            if offered:
                return asyncio.run(run_offered(settings, direct, groups, *offered, definitions, timeout))
            return asyncio.run(run_edge(settings, direct, groups, events, definitions, timeout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x1001,4x301,400x4", help="groups x events, comma-separated")
    parser.add_argument("--profiles", default="harel,local,sqld,replica")
    parser.add_argument("--rtts", default="0,100", help="round trips to the primary (sqld, replica), milliseconds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-run", type=int, help="HAREL_EDGE_MAX_RUN of the worker (default: the setting's)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--offered", type=float, help="events/s offered while the loop's lag is measured")
    parser.add_argument("--pin", action="store_true",
                        help="the worker on a core of its own; sqld, the proxy and the publisher on the others (binary sqld)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the load is offered (with --offered)")
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # "profile,rtt,shape": one cell, its row as JSON
    parser.add_argument("--publish", help=argparse.SUPPRESS)  # the publisher process of --offered
    args = parser.parse_args()
    if args.publish:
        values, groups, rate, seconds = json.loads(args.publish)
        values["auth_token"] = os.environ.get("PUBLISH_TOKEN")
        if os.environ.get("PUBLISH_CORES"):
            os.sched_setaffinity(0, {int(core) for core in os.environ["PUBLISH_CORES"].split(",")})
        publish_at(ExplicitSettings.load(**{k: v for k, v in values.items() if v is not None}), groups, rate, seconds)
        return
    offered = (args.offered, args.seconds) if args.offered else None
    if args.cell:
        profile, rtt, text = args.cell.split(",")
        print(json.dumps(run_cell(profile, float(rtt), *shape(text), args.max_run, args.timeout, offered, args.pin)))
        return
    if offered:
        lag_main(args, offered)
        return
    cells: dict[tuple[str, str, float], list[float]] = {}
    right = True
    for _ in range(args.rounds):
        for text in args.shapes.split(","):
            for profile in args.profiles.split(","):
                for rtt in [float(x) for x in args.rtts.split(",")] if profile in ("sqld", "replica") else [0.0]:
                    command = [sys.executable, __file__, "--cell", f"{profile},{rtt:g},{text}", "--timeout", str(args.timeout)]
                    if args.max_run:
                        command += ["--max-run", str(args.max_run)]
                    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    groups, events = shape(text)
                    cells.setdefault((text, profile, rtt), []).append(groups * events / row["seconds"])
                    right = right and row["counts_right"]
                    print(f"{text} {profile} {rtt:g} ms: {row}", file=sys.stderr)
    run_note = f"HAREL_EDGE_MAX_RUN={args.max_run}" if args.max_run else "default HAREL_EDGE_MAX_RUN"
    print(f"\nOne worker, counter statechart, events queued first, median of {args.rounds} rounds, {run_note}\n")
    print("| shape | worker | RTT (ms) | events/s | per group | vs harel's worker | vs 0 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    table = []
    for (text, profile, rtt), rates in cells.items():
        rate = statistics.median(rates)
        harel = cells.get((text, "harel", 0.0))
        at_0 = cells.get((text, profile, 0.0))
        row = {
            "shape": text,
            "worker": profile,
            "rtt_ms": rtt,
            "events_per_s": round(rate),
            "per_group": round(rate / shape(text)[0], 1),
            "vs_harel": round(rate / statistics.median(harel), 2) if harel and profile == "local" else None,
            "vs_0ms": round(rate / statistics.median(at_0), 2) if at_0 and profile in ("sqld", "replica") else None,
        }
        table.append(row)
        vs_harel = f"{row['vs_harel']:.2f}x" if row["vs_harel"] else ""
        vs_0 = f"{row['vs_0ms']:.2f}x" if row["vs_0ms"] else ""
        print(f"| {text} | {profile} | {rtt:g} | {row['events_per_s']} | {row['per_group']} | {vs_harel} | {vs_0} |")
    print(f"\nevery counter right: {right}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    if not right:
        raise SystemExit("a counter ended wrong: an event was lost or applied twice")


def lag_main(args: argparse.Namespace, offered: tuple[float, float]) -> None:
    """Each cell once under the offered load: the loop's lag, and whether the worker kept up."""
    print(f"\nOne worker, counter statechart, {offered[0]:g} events/s offered for {offered[1]:g} s\n")
    print("| shape | worker | RTT (ms) | lag p50 (ms) | lag p99 (ms) | worst (ms) | kept up with (events/s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    right = True
    for text in args.shapes.split(","):
        for profile in args.profiles.split(","):
            for rtt in [float(x) for x in args.rtts.split(",")] if profile in ("sqld", "replica") else [0.0]:
                command = [sys.executable, __file__, "--cell", f"{profile},{rtt:g},{text}", "--timeout", str(args.timeout),
                           "--offered", str(offered[0]), "--seconds", str(offered[1])]
                if args.max_run:
                    command += ["--max-run", str(args.max_run)]
                if args.pin:
                    command.append("--pin")
                done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                right = right and row["counts_right"]
                print(f"| {text} | {profile} | {rtt:g} | {row['lag_p50_ms']} | {row['lag_p99_ms']} | {row['lag_max_ms']} "
                      f"| {row['kept_up_per_s']} |")
    print(f"\nevery counter right: {right}")
    if not right:
        raise SystemExit("a counter ended wrong: an event was lost or applied twice")


if __name__ == "__main__":
    main()
