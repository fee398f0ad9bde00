"""Does the async path keep the event loop free, and does it overlap operations in flight?

For each profile (local file, sqld over HTTP, embedded replica) and each count of operations in
flight (1, 8, 32 by default), N coroutines run claim+ack loops on one `AsyncLibsqlTransport`
over a queue of 64 groups, while a ticker coroutine asks the loop for a 1 ms sleep again and
again. Reported per cell:

- throughput: messages claimed and acked per second (each message is two operations);
- loop lag: how late the 1 ms ticker woke (p50, p99, worst), in ms. A loop that a driver call
  freezes shows the call's duration here;
- CPU ms per message, of this process (the ticker's wake-ups included).

sqld and replica reach a real sqld (started by `harel_edge.testing`, a fresh primary per profile)
through `harel_edge.testing.proxy.LatencyProxy`, which adds `--delay` seconds each way (10 ms:
a 20 ms round trip) on loopback, since this machine has no netem.

    .venv/bin/python benchmarks/bench_event_loop.py
    .venv/bin/python benchmarks/bench_event_loop.py --profiles sqld --inflight 8 --seconds 3

`--durable` measures the durable stores instead, on sqld and replica (the local profile is
`benchmarks/bench_durable.py`'s, against plain sqlite3): one `Database` (`connect(settings)`,
its statements on the profile's executor: Hrana over HTTP from the event loop, units sent
together coalesced into one exchange), and N coroutines each looping on a workflow of its own
over one operation:

- `record`: one fenced `record` (one statement, one unit);
- `transact`: `transact` with a Python effect (one INSERT): BEGIN IMMEDIATE, fence, effect,
  record, COMMIT on a Hrana stream of its own, one round trip a statement;
- `sql transact`: `transact` with `SqlEffect` (the same INSERT): fence, effect and record as
  ONE unit, one request;
- `queue`: make_ready, next_ready, done (one cycle, three operations, counts as one).

Reported per cell: operations per second, HTTP exchanges per operation
(`database.executor.exchanges`: below 1 when operations in flight share exchanges), and the
loop lag as above.

    .venv/bin/python benchmarks/bench_event_loop.py --durable --seconds 3
    .venv/bin/python benchmarks/bench_event_loop.py --durable --profiles sqld --ops "record,sql transact" --inflight 1,8

Results go to stdout as a markdown table, and as JSON to `--json` if given. Numbers depend on
the machine and on what else runs on it; compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from harel.spec.states import Event

from harel_edge import AsyncLibsqlTransport, Message
from harel_edge.durable import LibsqlCheckpointer, LibsqlScheduler, SqlEffect, connect, migrate
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.loop import lag_ticker, percentile
from harel_edge.testing.proxy import LatencyProxy

GROUPS = 64


def cpu_seconds() -> float:
    """CPU time of this process (not the proxy's, not sqld's)."""
    return sum(os.times()[:2])


async def measure(settings, inflight: int, seconds: float, per_group: int) -> dict:
    transport = await AsyncLibsqlTransport.from_settings(settings)
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
        tick = asyncio.create_task(lag_ticker(stop, lags))
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
        row = await measure(settings, inflight, args.seconds, per_group)
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

DURABLE_OPS = ("record", "transact", "sql transact", "queue")
_EFFECTS = "CREATE TABLE IF NOT EXISTS bench_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"
_EFFECT = "INSERT INTO bench_effects (workflow, step) VALUES (?, ?)"


def bench_effect(workflow: str, step: str, tx) -> int:
    """The `transact` op's Python effect: one INSERT, on the step's own transaction."""
    return tx.execute(_EFFECT + " RETURNING id", (workflow, step))[0][0]


def _prepare(connection) -> None:
    connection.execute(_EFFECTS)


async def measure_durable(settings, op: str, inflight: int, seconds: float) -> dict:
    from datetime import timedelta

    database = connect(settings)
    try:
        await migrate(database)
        await database.run(_prepare)
        run_id = os.urandom(4).hex()
        workflows = [f"bench-{run_id}-{k}" for k in range(inflight)]
        checkpointer = LibsqlCheckpointer(database)
        scheduler = LibsqlScheduler(database, namespace=f"bench-{run_id}")
        holders = [await checkpointer.claim(w, timedelta(hours=1), timedelta(hours=1)) for w in workflows]
        done = 0
        deadline = 0.0
        step = 0  # a fresh step name for every operation, warm-up included

        async def one(k: int) -> None:
            nonlocal step
            step += 1
            key = f"s{step}"
            if op == "record":
                await checkpointer.record(holders[k], key, step)
            elif op == "transact":
                await checkpointer.transact(
                    holders[k], key, functools.partial(bench_effect, workflows[k], key)
                )
            elif op == "sql transact":
                await checkpointer.transact(
                    holders[k], key, SqlEffect((_EFFECT, (workflows[k], key)), value=step)
                )
            else:
                await scheduler.make_ready(workflows[k])
                delivery = await scheduler.next_ready(timedelta(0))
                if delivery is not None:
                    await scheduler.done(delivery)

        async def worker(k: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one(k)
                done += 1

        # Warm up: the HTTP connections opened and used, the statements seen once.
        deadline = time.perf_counter() + 0.5
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        done = 0
        stop = asyncio.Event()
        lags: list[float] = []
        tick = asyncio.create_task(lag_ticker(stop, lags))
        await asyncio.sleep(0.05)
        lags.clear()
        exchanges = database.executor.exchanges
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(worker(k) for k in range(inflight)))
        elapsed = time.perf_counter() - start
        exchanges = database.executor.exchanges - exchanges
        stop.set()
        await tick
        return {
            "op": op,
            "inflight": inflight,
            "ops": done,
            "ops_per_s": round(done / elapsed, 1),
            "exchanges_per_op": round(exchanges / done, 2) if done else float("nan"),
            "lag_p50_ms": round(percentile(lags, 0.50), 2),
            "lag_p99_ms": round(percentile(lags, 0.99), 2),
            "lag_max_ms": round(max(lags), 2) if lags else float("nan"),
        }
    finally:
        await database.aclose()


async def run_durable_profile(profile: str, args, tmp: Path, url: str, token: str) -> list[dict]:
    rows = []
    n = 0
    for op in args.ops.split(","):
        for inflight in args.inflight:
            n += 1
            # A replica's settings name a file of its own per cell (settings_for), although the
            # durable Database sends every statement to the primary.
            settings = settings_for(profile, tmp, n, url, token)
            row = await measure_durable(settings, op, inflight, args.seconds)
            row["profile"] = profile
            rows.append(row)
            print(
                f"  {profile:8} {op:13} in flight {inflight:2}: {row['ops_per_s']:7.1f} ops/s  lag p50 "
                f"{row['lag_p50_ms']:6.2f}  p99 {row['lag_p99_ms']:7.2f}  max {row['lag_max_ms']:7.2f} ms  "
                f"({row['ops']} ops, {row['exchanges_per_op']} exchanges/op)",
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
                continue  # the local profile against sqlite3: benchmarks/bench_durable.py
            (tmp / profile).mkdir()
            with (
                start_sqld_primary(backend=args.backend) as server,
                LatencyProxy(server.http_port, args.delay) as proxy,
            ):
                rows += asyncio.run(
                    run_durable_profile(profile, args, tmp / profile, proxy.url, server.rw_token)
                )
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, durable Database on the "
        f"executor, added latency {args.delay * 1000:g} ms each way, {args.seconds:g} s per cell\n"
    )
    print(
        "| profile | operation | in flight | ops/s | HTTP exchanges/op | lag p50 ms | lag p99 ms | lag max ms |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['profile']} | {row['op']} | {row['inflight']} | {row['ops_per_s']} | "
            f"{row['exchanges_per_op']} | {row['lag_p50_ms']} | {row['lag_p99_ms']} | {row['lag_max_ms']} |"
        )
    print()
    for key in dict.fromkeys((r["profile"], r["op"]) for r in rows):
        by = {r["inflight"]: r["ops_per_s"] for r in rows if (r["profile"], r["op"]) == key}
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
    parser.add_argument("--backend", default="binary", help="sqld backend: binary or docker")
    parser.add_argument("--per-group-local", type=int, default=150)
    parser.add_argument("--per-group-remote", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--durable", action="store_true", help="measure the durable Database instead")
    parser.add_argument("--ops", default=",".join(DURABLE_OPS), help="durable operations (with --durable)")
    args = parser.parse_args()
    if args.durable:
        if args.profiles == "local,sqld,replica":
            args.profiles = "sqld,replica"
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

    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, AsyncLibsqlTransport, "
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
        args.json.write_text(json.dumps({"delay": args.delay, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
