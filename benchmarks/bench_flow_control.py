"""Flow control measured: a rate limit held by three processes, and what limits cost a claim.

1. Rate: `--messages` groups of one key, limited to `--rate` claims a second; three processes
   (the sync `LibsqlTransport`, as a user's workers) claim until `--seconds` have passed on the
   primary's clock. Reported: the rate they achieved over the whole span (target: within 10 % of
   the limit) and the busiest one-second window (target: never above the limit), from each
   claim's stamp on the primary.
2. Claim cost, in SQLite virtual-machine steps (not time): a `claim_many(32)` with no limit set,
   with 32 and 1,000 keys limited (concurrency and rate), as ratios to the claim with none.
3. The worker with no limits set and with one set on a key no event uses (so every claim reads
   the limits), beside harel 0.9's own worker, on a local file: events/s in interleaved rounds.

    .venv/bin/python benchmarks/bench_flow_control.py
    .venv/bin/python benchmarks/bench_flow_control.py --profiles local,sqld,replica --seconds 10

Compare rows of one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_worker import run_edge, run_harel_local
from harel.spec.states import Event

from harel_edge import LibsqlTransport, Message, limits, logs
from harel_edge.access import Statements, primary_settings
from harel_edge.migration import migrate
from harel_edge.queue.statements import claim_params, claim_sql
from harel_edge.schema import EdgeNames
from harel_edge.settings import ExplicitSettings


def claim_until(settings, barrier, seconds: float, results) -> None:
    """One process: claim one message at a time (never acked: each claim's stamp stays readable)
    until `seconds` after the barrier; report how many it leased."""
    transport = LibsqlTransport(settings=settings)
    try:
        barrier.wait(timeout=60)
        leased, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            if transport.claim("bench", 600) is None:
                time.sleep(0.005)  # polling pace while the key has no room
            else:
                leased += 1
        results.put(leased)
    finally:
        transport.close()


def measure_rate(settings, rate: int, seconds: float, messages: int) -> dict:
    """Three processes against one rate limit; the achieved rate and the busiest second."""
    migrate(settings)
    primary = Statements(primary_settings(settings)) if settings.profile != "local" else Statements(settings)
    try:
        limits.set_limit(primary.execute, settings.prefix, "api", rate=rate, period=1.0)
        with LibsqlTransport(settings=settings, create_schema=False) as t:
            t.publish_many(Message(f"g{i}", Event(kind="e"), 0, "api") for i in range(messages))
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(3), ctx.Queue()
        processes = [ctx.Process(target=claim_until, args=(settings, barrier, seconds, results)) for _ in range(3)]
        for process in processes:
            process.start()
        leased = [results.get(timeout=seconds + 120) for _ in processes]
        for process in processes:
            process.join(30)
        rows = primary.execute(
            f"SELECT claimed_at FROM {settings.prefix}_transport_messages WHERE claimed_at IS NOT NULL ORDER BY 1"
        )
    finally:
        primary.close()
    stamps = [row[0] for row in rows]
    span_end = stamps[0] + seconds
    within = [u for u in stamps if u < span_end]
    busiest = max(sum(1 for u in stamps if t0 - 1.0 < u <= t0) for t0 in stamps)
    return {
        "profile": settings.profile,
        "claims": len(stamps),
        "by_process": leased,
        "rate": len(within) / seconds,
        "busiest_second": busiest,
    }


def claim_steps(path: str, *, limited: bool, keys: int) -> int:
    """SQLite VM steps of one claim of 32 (rolled back), with `keys` keys limited."""
    db = sqlite3.connect(path, isolation_level=None)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    try:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO harel_transport_limits (key, concurrency, rate, period) VALUES (?, 100, 1000, 60)",
            [(f"k{i}",) for i in range(keys)],
        )
        _token, params = claim_params("w", 30, 0, (), 1010.0)
        db.set_progress_handler(count, 1)
        rows = db.execute(claim_sql(EdgeNames(), 0, many=True, limited=limited), (*params, 32)).fetchall()
        db.set_progress_handler(None, 0)
        db.execute("ROLLBACK")
        assert len(rows) == 32
        return steps[0]
    finally:
        db.close()


def claim_costs(tmp: Path) -> list[tuple[str, int]]:
    path = str(tmp / "cost.db")
    with LibsqlTransport(path, lambda: 1000.0) as t:
        t.publish_many(Message(f"g{i}", Event(kind="e"), 0, None, f"k{i % 1000}") for i in range(2000))
    return [
        ("no limit set (the claim that does not read limits)", claim_steps(path, limited=False, keys=0)),
        ("no limit set, the claim that reads them", claim_steps(path, limited=True, keys=0)),
        ("32 keys limited", claim_steps(path, limited=True, keys=32)),
        ("1,000 keys limited", claim_steps(path, limited=True, keys=1000)),
    ]


async def worker_rate(tmp: Path, n: int, orders: int, *, one_limit: bool) -> float:
    settings = ExplicitSettings.load(
        profile="local", db_path=str(tmp / f"w{n}.db"), prefix="harel", worker_id=f"w{n}", visibility=30.0
    )
    if one_limit:
        migrate(settings)
        with contextlib.closing(Statements(settings)) as db:
            limits.set_limit(db.execute, settings.prefix, "no-event-has-this-key", concurrency=1)
    return (await run_edge(settings, settings, orders, 300.0))["events_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="local,sqld,replica")
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--orders", type=int, default=200, help="the worker part: executions of 4 events")
    parser.add_argument("--rounds", type=int, default=3, help="the worker part: interleaved rounds")
    args = parser.parse_args()
    logs.configure_logging(level="warning", stream=sys.stderr)
    profiles = args.profiles.split(",")
    messages = int(args.rate * args.seconds * 1.5)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = None
        if {"sqld", "replica"} & set(profiles):
            from harel_edge.testing import start_sqld_primary  # noqa: PLC0415

            server = start_sqld_primary()
        try:
            rates = []
            for n, profile in enumerate(profiles):
                common = {"prefix": f"r{n}", "worker_id": f"rate-{n}"}
                if profile == "local":
                    settings = ExplicitSettings.load(profile="local", db_path=str(tmp / "rate.db"), **common)
                elif profile == "sqld":
                    settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, **common)
                else:
                    settings = ExplicitSettings.load(
                        profile="replica", db_path=str(tmp / f"replica{n}.db"), sync_url=server.http_url,
                        auth_token=server.rw_token, **common,
                    )
                rates.append(measure_rate(settings, args.rate, args.seconds, messages))
        finally:
            if server is not None:
                server.close()
        costs = claim_costs(tmp)
        runs: dict[str, list[float]] = {"harel": [], "none": [], "one": []}
        for r in range(args.rounds):
            runs["harel"].append(asyncio.run(run_harel_local(tmp / f"harel{r}.db", args.orders, 300.0))["events_per_s"])
            runs["none"].append(asyncio.run(worker_rate(tmp, 2 * r, args.orders, one_limit=False)))
            runs["one"].append(asyncio.run(worker_rate(tmp, 2 * r + 1, args.orders, one_limit=True)))
    print(f"\nA rate limit of {args.rate} a second, three processes, {args.seconds:g} s on the primary's clock\n")
    print("| profile | claims | rate achieved | vs the limit | busiest second |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rates:
        print(
            f"| {r['profile']} | {r['claims']} | {r['rate']:.1f}/s | {r['rate'] / args.rate:.3f}x |"
            f" {r['busiest_second']} (limit {args.rate}) |"
        )
    print("\nOne claim_many(32), SQLite VM steps (2,000 groups, 1,000 keys)\n")
    print("| claim | steps | vs no limit set |")
    print("| --- | ---: | ---: |")
    for name, steps in costs:
        print(f"| {name} | {steps} | {steps / costs[0][1]:.2f}x |")
    harel = statistics.median(runs["harel"])
    print(f"\nThe worker on a local file, {args.orders * 4} events, median of {args.rounds} interleaved rounds\n")
    print("| worker | events/s | vs harel's worker |")
    print("| --- | ---: | ---: |")
    for name, key in (("harel 0.9 AsyncWorker", "harel"), ("harel-edge, no limit set", "none"),
                      ("harel-edge, one limit set (every claim reads the limits)", "one")):
        rate = statistics.median(runs[key])
        print(f"| {name} | {rate:.0f} | {rate / harel:.2f}x |")


if __name__ == "__main__":
    main()
