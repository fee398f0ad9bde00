"""The durable checkpoint store on the local profile against plain sqlite3, in one run.

Run: `.venv/bin/python benchmarks/bench_durable.py [--ops N] [--rounds R] [--inflight N]
[--durability full|normal] [--dir DIR]`. Prints the rates and the ratios that
docs/benchmarks.md reports.

What is compared, on the same schema, the same disk and at the same durability (WAL and
synchronous=FULL by default: every operation is on disk when its call returns, on every side):

- `harel_edge`: `LibsqlCheckpointer.record` / `.transact`, as an application calls them: async,
  through the `Database` and its executor (`LocalExecutor`: units queued together share one
  BEGIN IMMEDIATE..COMMIT, so one fsync for many), under the retry policy, on libsql.
- `sqlite3 inline`: the same statements through Python's sqlite3, called directly in a loop:
  the floor, with no event loop and no thread. One at a time only.
- `sqlite3 async`: the same statements through sqlite3, each operation sent to a thread with
  `asyncio.to_thread`: the least an async application must do so a commit's fsync does not
  freeze its event loop (what the sqlite3 store of the spec does, without its guard). One
  commit per operation.

Each is measured twice: one operation at a time (one coroutine, one workflow), and with
`--inflight` (32) coroutines in flight, each on a workflow of its own, sharing the `--ops`
operations. There harel_edge coalesces the units that wait into shared commits; sqlite3 async
still does one `to_thread` and one commit per operation (a lock keeps one caller at a time in
its connection, as one connection needs: a transaction must not interleave with another).

The operations:

- record: one fenced insert-and-renew statement per step (the `workflow_record` view).
- transact: a Python effect (one INSERT): BEGIN IMMEDIATE, the fence-and-lookup UPDATE, the
  effect, the record statement, COMMIT, on the `Database`'s connection (`Database.call`).
- sql transact: the same INSERT as an `SqlEffect`: fence, guards, effect and record as ONE
  executor unit, which shares a commit with other units in flight. Its sqlite3 baseline is the
  `transact` measurement of the same round (the same statements, less the guards).

The sides are interleaved over rounds and every figure that matters is a ratio of measurements
from the same round (the median of the rounds is reported, with the range), because absolute
times on shared machines vary with whatever else uses the disk and the CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

from harel_edge.durable import LibsqlCheckpointer, SqlEffect, connect, migrate  # noqa: E402
from harel_edge.durable.checkpoint_statements import CLAIM, RECORD, TRANSACT_FENCE  # noqa: E402
from harel_edge.migration import migrate as migrate_schema  # noqa: E402
from harel_edge.settings import EdgeSettings, ExplicitSettings  # noqa: E402

BUDGET, ALIVE = timedelta(hours=1), timedelta(minutes=30)
EFFECT = "INSERT INTO bench_effects (workflow, step) VALUES (?, ?)"
EFFECTS_TABLE = "CREATE TABLE IF NOT EXISTS bench_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"
KINDS = ("record", "transact", "sql transact")
SQLITE3_KINDS = ("record", "transact")  # sql transact's baseline is transact (same statements)
COMMITS: dict[tuple[str, int], list[float]] = {}  # harel_edge's operations per executor commit


async def _spread(ops: int, inflight: int, operation: Callable[[int, int], object]) -> float:
    """`ops` calls of `await operation(k, index)` by `inflight` coroutines (k: the coroutine's
    workflow), each taking the next index as soon as its last call returned; operations/s."""
    indices = iter(range(ops))

    async def coroutine(k: int) -> None:
        for index in indices:
            await operation(k, index)

    start = time.perf_counter()
    await asyncio.gather(*(coroutine(k) for k in range(inflight)))
    return ops / (time.perf_counter() - start)


# ---- harel_edge ------------------------------------------------------------------------------


async def _edge(path: str, ops: int, kind: str, durability: str, inflight: int) -> float:
    database = connect(EdgeSettings(db_path=path, durability=durability))
    await migrate(database)
    await database.run(lambda c: c.execute(EFFECTS_TABLE))
    checkpointer = LibsqlCheckpointer(database)
    holders = [await checkpointer.claim(f"bench-{k}", BUDGET, ALIVE) for k in range(inflight)]

    async def record(k: int, index: int) -> None:
        await checkpointer.record(holders[k], f"step-{index}", {"n": index})

    async def transact(k: int, index: int) -> None:
        step, workflow = f"step-{index}", holders[k].workflow
        await checkpointer.transact(holders[k], step, lambda tx: tx.execute(EFFECT, (workflow, step)))

    async def sql_transact(k: int, index: int) -> None:
        step = f"step-{index}"
        await checkpointer.transact(
            holders[k], step, SqlEffect((EFFECT, (holders[k].workflow, step)), value=step)
        )

    operation = {"record": record, "transact": transact, "sql transact": sql_transact}[kind]
    commits = database.executor.exchanges
    rate = await _spread(ops, inflight, operation)
    commits = database.executor.exchanges - commits
    if commits:  # a Python effect's transaction is its own commit, outside the executor's count
        COMMITS.setdefault((kind, inflight), []).append(ops / commits)
    await database.aclose()
    return rate


def harel_edge(path: str, ops: int, kind: str, durability: str, inflight: int) -> float:
    return asyncio.run(_edge(path, ops, kind, durability, inflight))


# ---- plain sqlite3, same statements, same durability ----------------------------------------


def _sqlite3_operation(
    path: str, kind: str, durability: str, inflight: int
) -> tuple[sqlite3.Connection, Callable[[int, int], None]]:
    """A sqlite3 connection set up like the local profile, and one operation of `kind` on the
    workflow of coroutine k, one caller at a time."""
    # The schema first, through harel_edge (libsql), closed before sqlite3 opens the file: two
    # SQLite libraries open on one file in one process release each other's locks.
    migrate_schema(ExplicitSettings.load(profile="local", db_path=path))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={durability.upper()}")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute(EFFECTS_TABLE)
    tokens = [
        conn.execute(CLAIM, (f"bench-{k}", BUDGET.total_seconds(), ALIVE.total_seconds(), None)).fetchall()[
            0
        ][0]
        for k in range(inflight)
    ]
    lock = threading.Lock()  # one connection: one caller inside it at a time

    def record(k: int, index: int) -> None:
        with lock:
            rows = conn.execute(
                RECORD, (f"bench-{k}", f"step-{index}", json.dumps({"n": index}), tokens[k], None)
            ).fetchall()
        assert rows[0][0]

    def transact(k: int, index: int) -> None:
        workflow, step = f"bench-{k}", f"step-{index}"
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            fence = conn.execute(TRANSACT_FENCE, (workflow, tokens[k], step, None)).fetchall()
            assert fence and fence[0][0] is None
            conn.execute(EFFECT, (workflow, step))
            assert conn.execute(RECORD, (workflow, step, json.dumps(step), tokens[k], None)).fetchall()[0][0]
            conn.execute("COMMIT")

    return conn, record if kind == "record" else transact


def sqlite3_inline(path: str, ops: int, kind: str, durability: str, inflight: int) -> float:
    assert inflight == 1, "a plain loop has one operation in flight"
    conn, operation = _sqlite3_operation(path, kind, durability, 1)
    start = time.perf_counter()
    for index in range(ops):
        operation(0, index)
    rate = ops / (time.perf_counter() - start)
    conn.close()
    return rate


def sqlite3_async(path: str, ops: int, kind: str, durability: str, inflight: int) -> float:
    conn, operation = _sqlite3_operation(path, kind, durability, inflight)

    async def one(k: int, index: int) -> None:
        await asyncio.to_thread(operation, k, index)

    rate = asyncio.run(_spread(ops, inflight, one))
    conn.close()
    return rate


SIDES: dict[str, Callable[[str, int, str, str, int], float]] = {
    "sqlite3 inline": sqlite3_inline,
    "sqlite3 async": sqlite3_async,
    "harel_edge": harel_edge,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000, help="operations per measurement")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median kept)")
    parser.add_argument(
        "--inflight", type=int, default=32, help="coroutines in flight, the concurrent column"
    )
    parser.add_argument(
        "--durability",
        choices=("full", "normal"),
        default="full",
        help="synchronous=FULL (the stores' default: one fsync per commit) or NORMAL (no fsync per "
        "commit under WAL, which leaves the per-operation cost of each side's own layers)",
    )
    parser.add_argument(
        "--dir",
        default=None,
        help="put the run's fresh directory here (default: the system temp dir); use a real disk",
    )
    args = parser.parse_args()
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="bench-durable-", dir=args.dir))
    print(
        f"files in {base}; {args.ops} operations x {args.rounds} rounds, 1 and {args.inflight} in flight; "
        f"WAL + synchronous={args.durability.upper()} on every side"
    )
    # (kind, side, in flight) -> one rate per round
    rates: dict[tuple[str, str, int], list[float]] = {}
    cells = [
        (kind, name, inflight)
        for inflight in (1, args.inflight)
        for kind in KINDS
        for name in SIDES
        if (name == "harel_edge" or kind in SQLITE3_KINDS) and (name != "sqlite3 inline" or inflight == 1)
    ]
    counter = 0
    for _round in range(args.rounds):
        for kind, name, inflight in cells:
            counter += 1
            path = str(base / f"{name.replace(' ', '-')}-{kind.replace(' ', '-')}-{inflight}-{counter}.db")
            rate = SIDES[name](path, args.ops, kind, args.durability, inflight)
            rates.setdefault((kind, name, inflight), []).append(rate)

    def baseline(kind: str) -> str:
        return kind if kind in SQLITE3_KINDS else "transact"

    def ratio(kind: str, inflight: int, name: str, their_inflight: int) -> str:
        ours = rates[(kind, "harel_edge", inflight)]
        theirs = rates[(baseline(kind), name, their_inflight)]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"

    def median(kind: str, name: str, inflight: int) -> float:
        return statistics.median(rates[(baseline(kind) if name != "harel_edge" else kind, name, inflight)])

    n = args.inflight
    print()
    print(
        f"| operation | sqlite3 inline /s | sqlite3 async /s | harel_edge /s | vs inline | vs async "
        f"| sqlite3 async, {n} in flight /s | harel_edge, {n} in flight /s | {n} in flight: vs async "
        f"| vs inline (one at a time) |"
    )
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | --- | --- |")
    for kind in KINDS:
        edge_1 = median(kind, "harel_edge", 1)
        print(
            f"| {kind} | {median(kind, 'sqlite3 inline', 1):.0f} | {median(kind, 'sqlite3 async', 1):.0f} "
            f"| {edge_1:.0f} | {ratio(kind, 1, 'sqlite3 inline', 1)} | {ratio(kind, 1, 'sqlite3 async', 1)} "
            f"| {median(kind, 'sqlite3 async', n):.0f} | {median(kind, 'harel_edge', n):.0f} "
            f"| {ratio(kind, n, 'sqlite3 async', n)} | {ratio(kind, n, 'sqlite3 inline', 1)} |"
        )
    print()
    for kind in KINDS:
        extra = [
            f"{1e6 / median(kind, 'harel_edge', 1) - 1e6 / median(kind, name, 1):+.0f} us/op vs {name}"
            for name in ("sqlite3 inline", "sqlite3 async")
        ]
        print(f"{kind}, one at a time: harel_edge {', '.join(extra)}")
    for (kind, inflight), per_commit in COMMITS.items():
        print(
            f"harel_edge {kind}, {inflight} in flight: {statistics.median(per_commit):.1f} operations per commit"
        )
    print("harel_edge transact (a Python effect): one commit per operation, its own transaction")
    print("(sql transact is compared with sqlite3's transact of the same round: the same statements)")


if __name__ == "__main__":
    main()
