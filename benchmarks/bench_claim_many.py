"""The transport alone on a local file: messages claimed and acked per second.

harel 0.9's `SqliteTransport` (claim + ack, one message at a time) against harel_edge's event
path (`EventTransport`): `claim` + `ack` one at a time, and `claim_many(n)` + `ack_many` (one
statement leases n groups' heads; their acks are one unit). `--groups` groups x `--per-group`
messages each, WAL + synchronous=FULL for both, interleaved over `--rounds`, medians kept.

    .venv/bin/python benchmarks/bench_claim_many.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from harel.engine.transport import SqliteTransport
from harel.spec.states import Event

from harel_edge import logs
from harel_edge.executor import open_executor
from harel_edge.queue import EventTransport, LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings


def harel_rate(db: Path, groups: int, per_group: int) -> float:
    t = SqliteTransport(str(db))
    t._conn.execute("PRAGMA journal_mode=WAL")  # noqa: SLF001 - harel's transport has no setting for it
    t._conn.execute("PRAGMA synchronous=FULL")  # noqa: SLF001
    for g in range(groups):
        for i in range(per_group):
            t.publish(f"g{g}", Event(kind=f"e{i}"))
    started, done = time.perf_counter(), 0
    while (lease := t.claim("w", 30)) is not None:
        t.ack(lease)
        done += 1
    return done / (time.perf_counter() - started)


async def edge_rate(db: Path, groups: int, per_group: int, n: int) -> float:
    settings = ExplicitSettings.load(profile="local", db_path=str(db))
    LibsqlTransport(settings=settings).publish_many(
        Message(f"g{g}", Event(kind=f"e{i}")) for g in range(groups) for i in range(per_group)
    )
    executor = open_executor(settings)
    transport = EventTransport(executor, settings)
    started, done = time.perf_counter(), 0
    try:
        while True:
            if n == 1:
                lease = await transport.claim("w", 30)
                if lease is None:
                    break
                await transport.ack(lease)
                done += 1
            else:
                leases = await transport.claim_many("w", 30, n)
                if not leases:
                    break
                await transport.ack_many(leases)
                done += len(leases)
    finally:
        await executor.aclose()
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--per-group", type=int, default=20)
    parser.add_argument("--n", type=int, default=32, help="claim_many's n")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logs.configure_logging(level="warning")
    rates: dict[str, list[float]] = {"harel": [], "one": [], "many": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rates["harel"].append(harel_rate(Path(tmp) / f"h{r}.db", args.groups, args.per_group))
            rates["one"].append(asyncio.run(edge_rate(Path(tmp) / f"o{r}.db", args.groups, args.per_group, 1)))
            rates["many"].append(asyncio.run(edge_rate(Path(tmp) / f"m{r}.db", args.groups, args.per_group, args.n)))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n{args.groups} groups x {args.per_group} messages, local file, {args.rounds} rounds (medians)\n")
    print("| transport | claim+ack/s | vs harel SqliteTransport |")
    print("| --- | ---: | ---: |")
    print(f"| harel 0.9 SqliteTransport, claim + ack | {med['harel']:,.0f} | 1.00x |")
    print(f"| harel_edge EventTransport, claim + ack | {med['one']:,.0f} | {med['one'] / med['harel']:.2f}x |")
    print(
        f"| harel_edge EventTransport, claim_many({args.n}) + ack_many | {med['many']:,.0f} | "
        f"{med['many'] / med['harel']:.2f}x |"
    )


if __name__ == "__main__":
    main()
