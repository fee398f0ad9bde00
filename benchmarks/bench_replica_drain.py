"""Three edge processes, each with its own embedded replica, draining one queue on a real sqld.

`--messages` messages over `--groups` groups are published to the primary, then three spawned
processes drain them together, each claiming and acking until the queue is empty:

- harel 0.9's `LibsqlTransport` on an embedded replica (its claim is an interactive
  transaction through the replica: BEGIN IMMEDIATE, SELECT, UPDATE, COMMIT);
- harel_edge on the replica profile: `EventTransport` over the Hrana executor, with
  `claim_many(--n)` and `ack_many` (one statement leases n groups' heads; their acks are one
  unit).

Reported: the wall time from the three starting together to the last one finding the queue
empty, messages per second, and the ratio. `--delay` adds a latency proxy (seconds each way).

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_replica_drain.py
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path

from harel.spec.states import Event

from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings

PROCESSES = 3


def drain_harel(url: str, token: str, db: str, prefix: str, start, done) -> None:  # noqa: ANN001
    from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport  # noqa: PLC0415

    t = HarelLibsqlTransport(db, sync_url=url, auth_token=token, prefix=prefix, create_schema=False)
    start.wait()
    count = 0
    while True:
        try:
            lease = t.claim("harel", 30)
        except Exception:  # noqa: BLE001 - harel's claim times out under contention; try again
            continue
        if lease is None:
            break
        t.ack(lease)
        count += 1
    done.put((time.perf_counter(), count))


def drain_edge(url: str, token: str, db: str, prefix: str, n: int, start, done) -> None:  # noqa: ANN001
    from harel_edge.executor import open_executor  # noqa: PLC0415
    from harel_edge.queue import EventPath, EventTransport  # noqa: PLC0415

    settings = ExplicitSettings.load(profile="replica", db_path=db, sync_url=url, auth_token=token, prefix=prefix)

    async def main() -> int:
        executor = open_executor(settings)
        transport = EventTransport(EventPath(executor, settings))
        count = 0
        try:
            while leases := await transport.claim_many("edge", 30, n):
                await transport.ack_many(leases)
                count += len(leases)
        finally:
            await executor.aclose()
        return count

    start.wait()
    count = asyncio.run(main())
    done.put((time.perf_counter(), count))


def run(kind: str, server, url: str, tmp: Path, prefix: str, messages: int, groups: int, n: int) -> tuple[float, int]:
    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=prefix)
    publisher = LibsqlTransport(settings=direct)
    publisher.publish_many(Message(f"g{i % groups}", Event(kind="e")) for i in range(messages))
    publisher.close()
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Barrier(PROCESSES + 1), ctx.Queue()
    procs = []
    for p in range(PROCESSES):
        db = str(tmp / f"{kind}-{p}.db")
        if kind == "harel":
            args = (url, server.rw_token, db, prefix, start, done)
            procs.append(ctx.Process(target=drain_harel, args=args))
        else:
            args = (url, server.rw_token, db, prefix, n, start, done)
            procs.append(ctx.Process(target=drain_edge, args=args))
    for proc in procs:
        proc.start()
    start.wait()
    began = time.perf_counter()
    results = [done.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return max(r[0] for r in results) - began, sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--groups", type=int, default=60)
    parser.add_argument("--n", type=int, default=16, help="claim_many's n")
    parser.add_argument("--delay", type=float, default=0.0, help="proxy delay each way, seconds")
    args = parser.parse_args()
    from harel_edge import observability  # noqa: PLC0415
    from harel_edge.testing import start_sqld_primary  # noqa: PLC0415
    from harel_edge.testing.proxy import LatencyProxy  # noqa: PLC0415

    observability.configure_logging(level="warning")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, start_sqld_primary() as server:
        proxy = LatencyProxy(server.http_port, delay=args.delay) if args.delay else None
        url = proxy.url if proxy else server.http_url
        try:
            for kind in ("harel", "edge"):
                rows[kind] = run(kind, server, url, Path(tmp), f"d_{kind}", args.messages, args.groups, args.n)
        finally:
            if proxy is not None:
                proxy.close()
    print(f"\n{PROCESSES} replica processes, {args.messages} messages over {args.groups} groups, delay {args.delay * 1000:g} ms\n")
    print("| transport | seconds | messages | messages/s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    base = rows["harel"][1] / rows["harel"][0]
    for kind, name in (("harel", "harel 0.9 LibsqlTransport (replica)"), ("edge", f"harel_edge replica, claim_many({args.n}) + ack_many")):
        seconds, count = rows[kind]
        print(f"| {name} | {seconds:.2f} | {count} | {count / seconds:,.0f} | {count / seconds / base:.2f}x |")


if __name__ == "__main__":
    main()
