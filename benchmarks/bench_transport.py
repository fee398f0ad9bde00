"""The transport on the local profile, side by side with harel 0.9's own transports, in one run.

Run: `.venv/bin/python benchmarks/bench_transport.py [--quick]`. Prints a table and the ratios
that docs/benchmarks.md reports. Times on these machines are noisy, so every figure that matters
is a ratio of two measurements taken in the same run, interleaved over rounds (median kept).

Durable settings for everyone: WAL and synchronous=FULL for harel_edge (its default) and for
harel's SqliteTransport (WAL; Python's sqlite3 defaults to synchronous=FULL); harel's
LibsqlTransport runs as harel configures it (rollback journal, synchronous=FULL).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

from harel.engine.transport import LibsqlTransport as HarelLibsql  # noqa: E402
from harel.engine.transport import SqliteTransport as HarelSqlite  # noqa: E402
from harel.spec.states import Event  # noqa: E402

from harel_edge import LibsqlTransport, Message  # noqa: E402

IMPLEMENTATIONS: dict[str, Callable[[str], object]] = {
    "harel SqliteTransport": lambda path: HarelSqlite(path),
    "harel LibsqlTransport": lambda path: HarelLibsql(path),
    "harel_edge LibsqlTransport": lambda path: LibsqlTransport(path),
}


def fresh(tmp: Path, name: str) -> str:
    fresh.n = getattr(fresh, "n", 0) + 1
    return str(tmp / f"{name.replace(' ', '_')}_{fresh.n}.db")


def publish_and_drain(make, path: str, groups: int, per_group: int) -> tuple[float, float, list[float]]:
    """Publish groups x per_group one at a time, then claim+ack them all: rates and claim latencies."""
    t = make(path)
    events = [(f"g{g}", Event(kind=f"e{i}")) for i in range(per_group) for g in range(groups)]
    start = time.perf_counter()
    for group, event in events:
        t.publish(group, event)
    publish_rate = len(events) / (time.perf_counter() - start)
    latencies = []
    start = time.perf_counter()
    while True:
        before = time.perf_counter()
        lease = t.claim("w", 30)
        latencies.append(time.perf_counter() - before)
        if lease is None:
            break
        t.ack(lease)
    drain_rate = len(events) / (time.perf_counter() - start)
    t.close()
    return publish_rate, drain_rate, latencies


def batch_publish_rate(path: str, groups: int, per_group: int) -> float:
    t = LibsqlTransport(path)
    batch = [Message(f"g{g}", Event(kind=f"e{i}")) for i in range(per_group) for g in range(groups)]
    start = time.perf_counter()
    t.publish_many(batch)
    rate = len(batch) / (time.perf_counter() - start)
    t.close()
    return rate


def claim_ack_cost(t: LibsqlTransport, n: int) -> float:
    """Median seconds of one claim+ack over n, on a queue prepared by the caller."""
    costs = []
    for _ in range(n):
        start = time.perf_counter()
        lease = t.claim("w", 30)
        t.ack(lease)
        costs.append(time.perf_counter() - start)
    return statistics.median(costs)


def backlog_cost(path: str, backlog: int, groups: int = 100, n: int = 400) -> float:
    t = LibsqlTransport(path)
    per = backlog // groups
    t.publish_many(Message(f"g{g}", Event(kind="e")) for i in range(per) for g in range(groups))
    cost = claim_ack_cost(t, n)
    t.close()
    return cost


def in_flight_cost(path: str, in_flight: int, free_groups: int = 100, n: int = 400) -> float:
    t = LibsqlTransport(path)
    t.publish_many(Message(f"busy{g}", Event(kind="e")) for g in range(in_flight))
    for _ in range(in_flight):  # lease every busy group for the whole measurement
        assert t.claim("holder", 3600) is not None
    t.publish_many(Message(f"free{g}", Event(kind="e")) for i in range(10) for g in range(free_groups))
    cost = claim_ack_cost(t, n)
    t.close()
    return cost


def drain_memory(path: str, total: int) -> tuple[int, int]:
    """Python heap (tracemalloc) after the first and the last tenth of a drain of `total`."""
    t = LibsqlTransport(path)
    t.publish_many(Message(f"g{i % 100}", Event(kind="e")) for i in range(total))
    tracemalloc.start()
    marks = []
    done = 0
    while (lease := t.claim("w", 30)) is not None:
        t.ack(lease)
        done += 1
        if done in (total // 10, total - 1):
            gc.collect()
            marks.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    t.close()
    return marks[0], marks[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    groups, per_group = (20, 10) if args.quick else (100, 20)
    big = 10_000 if args.quick else 100_000
    rounds = 1 if args.quick else args.rounds

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in IMPLEMENTATIONS}
        batch_rates = []
        for _ in range(rounds):  # interleaved, so drift hits everyone alike
            for name, make in IMPLEMENTATIONS.items():
                pub, drain, lat = publish_and_drain(make, fresh(tmp, name), groups, per_group)
                results[name].append((pub, drain, statistics.median(lat[:-1]) * 1000))
            batch_rates.append(batch_publish_rate(fresh(tmp, "batch"), groups, per_group))

        print(f"\n{groups} groups x {per_group} messages, local files, {rounds} round(s), medians\n")
        print(f"{'transport':30} {'publish/s':>10} {'claim+ack/s':>12} {'claim p50 ms':>13}")
        summary = {}
        for name, rows in results.items():
            pub, drain, p50 = (statistics.median(col) for col in zip(*rows, strict=True))
            summary[name] = (pub, drain, p50)
            print(f"{name:30} {pub:10.0f} {drain:12.0f} {p50:13.3f}")
        batch = statistics.median(batch_rates)
        print(f"{'harel_edge publish_many':30} {batch:10.0f}")

        edge = summary["harel_edge LibsqlTransport"]
        print("\nratios (targets in brackets)")
        print(f"  claim+ack vs harel SqliteTransport   {edge[1] / summary['harel SqliteTransport'][1]:6.2f}x  [>= 1.0]")
        print(f"  claim+ack vs harel LibsqlTransport   {edge[1] / summary['harel LibsqlTransport'][1]:6.2f}x")
        print(f"  publish vs harel SqliteTransport     {edge[0] / summary['harel SqliteTransport'][0]:6.2f}x")
        print(f"  batch publish vs single publish      {batch / edge[0]:6.1f}x  [>= 10]")

        small, large = backlog_cost(fresh(tmp, "b1k"), 1_000), backlog_cost(fresh(tmp, "bbig"), big)
        print(f"  claim+ack cost, {big:,} vs 1,000 backlog  {large / small:6.2f}   [<= 1.5]  ({small*1e3:.3f} -> {large*1e3:.3f} ms)")
        idle, busy = in_flight_cost(fresh(tmp, "f0"), 0), in_flight_cost(fresh(tmp, "f1k"), 1_000)
        print(f"  claim+ack cost, 1,000 vs 0 in flight  {busy / idle:6.2f}   [<= 1.5]  ({idle*1e3:.3f} -> {busy*1e3:.3f} ms)")
        first, last = drain_memory(fresh(tmp, "mem"), big)
        print(f"  Python heap draining {big:,}: {first/1024:.0f} KiB after 10%, {last/1024:.0f} KiB at the end ({last / max(first, 1):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
