"""Does the async transport keep the event loop free, and does it overlap operations in flight?

For each profile (local file, sqld over HTTP, embedded replica) and each count of operations in
flight (1, 8, 32 by default), N coroutines run claim+ack loops on one `AsyncLibsqlTransport`
over a queue of 64 groups, while a ticker coroutine asks the loop for a 1 ms sleep again and
again. Reported per cell:

- throughput: messages claimed and acked per second (each message is two operations);
- loop lag: how late the 1 ms ticker woke (p50, p99, worst), in ms. A loop that a driver call
  freezes shows the call's duration here.

sqld and replica reach a real sqld (started by `harel_edge.testing`, a fresh primary per profile)
through `harel_edge.testing.proxy.LatencyProxy`, which adds `--delay` seconds each way (10 ms:
a 20 ms round trip) on loopback, since this machine has no netem.

    .venv/bin/python benchmarks/bench_event_loop.py                  # the default design
    .venv/bin/python benchmarks/bench_event_loop.py --profiles sqld --inflight 8 --seconds 3

`--durable` measures the durable stores' `Database` instead, on sqld and replica, in both
designs (threads: `async_processes=0`, the connection in this process; processes: the default,
the connection in a worker process, plus spare processes on sqld for operations without a
transaction). Operations, each coroutine on a workflow of its own: `record` (one statement),
`transact` (BEGIN IMMEDIATE, fence, an INSERT effect, record, COMMIT: one request to the
worker), `queue` (make_ready, next_ready, done: one cycle, three operations, counts as one), and
`record/N db`, `transact/N db` (each coroutine with a Database of its own: N connections;
processes design only, since N connections in one process, in transactions, time out on sqld,
docs/executor.md).

    .venv/bin/python benchmarks/bench_event_loop.py --durable
    .venv/bin/python benchmarks/bench_event_loop.py --durable --profiles sqld --ops record --inflight 1,8

Results go to stdout as a markdown table, and as JSON to `--json` if given. Numbers depend on
the machine and on what else runs on it; compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from harel.spec.states import Event

from harel_edge import AsyncLibsqlTransport, Message
from harel_edge.durable import LibsqlCheckpointer, LibsqlScheduler, connect, migrate
from harel_edge.procpool import worker_settings
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.proxy import LatencyProxy

GROUPS = 64


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - start - 0.001) * 1000)


def cpu_seconds() -> float:
    """CPU time of this process and of its worker processes (not the proxy's, not sqld's)."""
    total = sum(os.times()[:2])
    tick = os.sysconf("SC_CLK_TCK")
    for child in multiprocessing.active_children():
        if child.name.startswith("latency-proxy"):
            continue
        try:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


async def open_transport(settings, processes: int | None) -> AsyncLibsqlTransport:
    if processes is None:
        return await AsyncLibsqlTransport.from_settings(settings)
    if "processes" not in inspect.signature(AsyncLibsqlTransport.from_settings).parameters:
        raise SystemExit("this AsyncLibsqlTransport has no `processes` option")
    return await AsyncLibsqlTransport.from_settings(settings, processes=processes)


async def measure(settings, inflight: int, seconds: float, processes: int | None, per_group: int) -> dict:
    transport = await open_transport(settings, processes)
    try:
        messages = [Message(f"g{g}", Event(kind=f"e{i}")) for i in range(per_group) for g in range(GROUPS)]
        await transport.publish_many(messages)
        # Warm up: as many calls in flight as the measurement will have (a pool grows to it).
        for _ in range(2):
            await asyncio.gather(*(transport.depth() for _ in range(inflight)))

        done = 0
        deadline = 0.0

        async def worker(k: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                lease = await transport.claim(f"w{k}", 60)
                if lease is None:
                    if await transport.depth() == 0:
                        return
                    await asyncio.sleep(0.001)
                    continue
                await transport.ack(lease)
                done += 1

        stop = asyncio.Event()
        lags: list[float] = []
        tick = asyncio.create_task(ticker(stop, lags))
        await asyncio.sleep(0.05)
        lags.clear()
        start, cpu_start = time.perf_counter(), cpu_seconds()
        deadline = start + seconds
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
        stop.set()
        await tick
        return {
            "inflight": inflight,
            "messages": done,
            "seconds": round(elapsed, 3),
            "msg_per_s": round(done / elapsed, 1),
            "lag_p50_ms": round(percentile(lags, 0.50), 2),
            "lag_p99_ms": round(percentile(lags, 0.99), 2),
            "lag_max_ms": round(max(lags), 2) if lags else float("nan"),
            "ticks": len(lags),
            "cpu_ms_per_msg": round(cpu * 1000 / done, 2) if done else float("nan"),
        }
    finally:
        await transport.close()


def settings_for(profile: str, tmp: Path, n: int, url: str | None, token: str | None):
    values: dict = {"profile": profile, "prefix": f"bench{n}", "retry_deadline": 60.0}
    if profile == "local":
        values["db_path"] = str(tmp / f"local{n}.db")
    elif profile == "sqld":
        values.update(url=url, auth_token=token)
    else:
        values.update(db_path=str(tmp / f"replica{n}.db"), sync_url=url, auth_token=token)
    return ExplicitSettings.load(**values)


async def run_profile(profile: str, args, tmp: Path, url: str | None, token: str | None) -> list[dict]:
    rows = []
    for i, inflight in enumerate(args.inflight):
        # Enough messages that the queue does not drain before the time is up.
        per_group = args.per_group_local if profile == "local" else args.per_group_remote
        settings = settings_for(profile, tmp, i, url, token)
        row = await measure(settings, inflight, args.seconds, args.processes, per_group)
        row["profile"] = profile
        rows.append(row)
        print(
            f"  {profile:8} in flight {inflight:3}: {row['msg_per_s']:8.1f} msg/s  lag p50 "
            f"{row['lag_p50_ms']:6.2f}  p99 {row['lag_p99_ms']:7.2f}  max {row['lag_max_ms']:7.2f} ms"
            f"  cpu {row['cpu_ms_per_msg']:5.2f} ms/msg ({row['messages']} msgs, {row['ticks']} ticks)",
            file=sys.stderr,
            flush=True,
        )
    return rows


# ---- the durable stores (--durable) ------------------------------------------------------------

DURABLE_OPS = ("record", "transact", "queue", "record/N db", "transact/N db")
_EFFECTS = "CREATE TABLE IF NOT EXISTS bench_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"


def bench_effect(workflow: str, step: str, tx) -> int:
    """A transact effect that can travel to the worker process: one INSERT of its own."""
    return tx.execute(
        "INSERT INTO bench_effects (workflow, step) VALUES (?, ?) RETURNING id", (workflow, step)
    )[0][0]


def _prepare(connection) -> None:
    connection.execute(_EFFECTS)


async def measure_durable(settings, op: str, inflight: int, seconds: float, processes: int) -> dict:
    from datetime import timedelta

    settings = settings.model_copy(update={"async_processes": processes})
    count = inflight if op.endswith("/N db") else 1
    # On a replica every Database needs a replica file of its own (worker_settings names them).
    databases = [connect(worker_settings(settings, k)) for k in range(count)]
    try:
        for database in databases:
            await database.start()
        await migrate(databases[0])
        await databases[0].run(_prepare)
        run_id = os.urandom(4).hex()
        workflows = [f"bench-{run_id}-{k}" for k in range(inflight)]
        checkpointers = [LibsqlCheckpointer(databases[k % count]) for k in range(inflight)]
        scheduler = LibsqlScheduler(databases[0], namespace=f"bench-{run_id}")
        holders = [
            await checkpointers[k].claim(workflows[k], timedelta(hours=1), timedelta(hours=1))
            for k in range(inflight)
        ]
        done = 0
        deadline = 0.0

        async def one(k: int, i: int) -> None:
            if op.startswith("record"):
                await checkpointers[k].record(holders[k], f"s{i}", i)
            elif op.startswith("transact"):
                effect = functools.partial(bench_effect, workflows[k], f"s{i}")
                await checkpointers[k].transact(holders[k], f"s{i}", effect)
            else:
                await scheduler.make_ready(workflows[k])
                delivery = await scheduler.next_ready(timedelta(0))
                if delivery is not None:
                    await scheduler.done(delivery)

        async def worker(k: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < deadline:
                await one(k, i)
                i += 1
                done += 1

        # Warm up: every connection (and on sqld every spare process) made and used once.
        deadline = time.perf_counter() + 0.5
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        done = 0
        stop = asyncio.Event()
        lags: list[float] = []
        tick = asyncio.create_task(ticker(stop, lags))
        await asyncio.sleep(0.05)
        lags.clear()
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        elapsed = time.perf_counter() - start
        stop.set()
        await tick
        return {
            "op": op,
            "inflight": inflight,
            "design": "threads" if processes == 0 else "processes",
            "processes": sum(database.processes for database in databases),
            "ops": done,
            "ops_per_s": round(done / elapsed, 1),
            "lag_p50_ms": round(percentile(lags, 0.50), 2),
            "lag_p99_ms": round(percentile(lags, 0.99), 2),
            "lag_max_ms": round(max(lags), 2) if lags else float("nan"),
        }
    finally:
        for database in databases:
            await database.aclose()


async def run_durable_profile(profile: str, args, tmp: Path, url: str, token: str) -> list[dict]:
    rows = []
    n = 0
    for design in args.designs.split(","):
        processes = 0 if design == "threads" else args.durable_processes
        for op in args.ops.split(","):
            if op.endswith("/N db") and processes == 0:
                # N connections in one process, each in a transaction: a waiter holds the GIL
                # while the lock holder cannot run, and sqld aborts the holder after 5 s
                # (docs/executor.md). That is the failure processes exist to avoid, not a measurement.
                continue
            for inflight in args.inflight:
                n += 1
                settings = settings_for(profile, tmp, n, url, token)
                row = await measure_durable(settings, op, inflight, args.seconds, processes)
                row["profile"] = profile
                rows.append(row)
                print(
                    f"  {profile:8} {row['design']:9} {op:14} in flight {inflight:2}: "
                    f"{row['ops_per_s']:7.1f} ops/s  lag p50 {row['lag_p50_ms']:6.2f}  p99 "
                    f"{row['lag_p99_ms']:7.2f}  max {row['lag_max_ms']:7.2f} ms  ({row['ops']} ops, "
                    f"{row['processes']} processes)",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def durable_main(args) -> None:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmpdir:
        tmp = Path(tmpdir)
        for profile in args.profiles.split(","):
            if profile == "local":
                continue  # the local profile's Database is unchanged (a thread); see bench_durable.py
            (tmp / profile).mkdir()
            with (
                start_sqld_primary(backend=args.backend) as server,
                LatencyProxy(server.http_port, args.delay) as proxy,
            ):
                rows += asyncio.run(
                    run_durable_profile(profile, args, tmp / profile, proxy.url, server.rw_token)
                )
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, durable Database, "
        f"added latency {args.delay * 1000:g} ms each way, {args.seconds:g} s per cell\n"
    )
    print("| profile | design | operation | in flight | ops/s | lag p50 ms | lag p99 ms | lag max ms |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['profile']} | {row['design']} | {row['op']} | {row['inflight']} | {row['ops_per_s']} | "
            f"{row['lag_p50_ms']} | {row['lag_p99_ms']} | {row['lag_max_ms']} |"
        )
    print()
    for key in sorted({(r["profile"], r["design"], r["op"]) for r in rows}):
        by = {r["inflight"]: r["ops_per_s"] for r in rows if (r["profile"], r["design"], r["op"]) == key}
        if 1 in by and by[1]:
            ratios = ", ".join(f"{n}: {by[n] / by[1]:.2f}x" for n in sorted(by) if n != 1)
            print(f"{' / '.join(key)}: throughput relative to 1 in flight: {ratios}")
    if args.json:
        args.json.write_text(json.dumps({"durable": True, "delay": args.delay, "rows": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profiles", default="local,sqld,replica")
    parser.add_argument("--inflight", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per cell")
    parser.add_argument("--delay", type=float, default=0.010, help="added latency each way, seconds")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (0: threads only)")
    parser.add_argument("--backend", default="binary", help="sqld backend: binary or docker")
    parser.add_argument("--per-group-local", type=int, default=150)
    parser.add_argument("--per-group-remote", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--durable", action="store_true", help="measure the durable Database instead")
    parser.add_argument("--ops", default=",".join(DURABLE_OPS), help="durable operations (with --durable)")
    parser.add_argument("--designs", default="threads,processes", help="durable designs (with --durable)")
    parser.add_argument(
        "--durable-processes",
        type=int,
        default=8,
        help="async_processes of the durable Database (processes design)",
    )
    args = parser.parse_args()
    if args.durable:
        if args.profiles == "local,sqld,replica":
            args.profiles = "sqld,replica"
        if args.inflight == [1, 8, 32]:
            args.inflight = [1, 8]
        durable_main(args)
        return

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmpdir:
        tmp = Path(tmpdir)
        for profile in args.profiles.split(","):
            if profile == "local":
                rows += asyncio.run(run_profile(profile, args, tmp / profile, None, None))
                continue
            with (
                start_sqld_primary(backend=args.backend) as server,
                LatencyProxy(server.http_port, args.delay) as proxy,
            ):
                rows += asyncio.run(run_profile(profile, args, tmp / profile, proxy.url, server.rw_token))

    design = "event path" if args.processes is None else ("threads" if args.processes == 0 else f"processes={args.processes}")
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, {design}, "
        f"added latency {args.delay * 1000:g} ms each way, {args.seconds:g} s per cell\n"
    )
    print("| profile | in flight | msg/s (claim+ack) | lag p50 ms | lag p99 ms | lag max ms | CPU ms/msg |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['profile']} | {row['inflight']} | {row['msg_per_s']} | {row['lag_p50_ms']} | "
            f"{row['lag_p99_ms']} | {row['lag_max_ms']} | {row['cpu_ms_per_msg']} |"
        )
    for profile in {row["profile"] for row in rows}:
        by = {row["inflight"]: row["msg_per_s"] for row in rows if row["profile"] == profile}
        if 1 in by and by[1]:
            ratios = ", ".join(f"{n}: {by[n] / by[1]:.2f}x" for n in sorted(by) if n != 1)
            print(f"\n{profile}: throughput relative to 1 in flight: {ratios}")
    if args.json:
        args.json.write_text(json.dumps({"design": design, "delay": args.delay, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
