"""The durable checkpoint store on the local profile against plain sqlite3, in one run.

Run: `.venv/bin/python benchmarks/bench_durable.py [--ops N] [--rounds R] [--durability full|normal]
[--dir DIR]`. Prints the rates and the ratios that docs/durable.md reports.

What is compared, on the same schema, the same disk and at the same durability (WAL and
synchronous=FULL by default, so one commit = one fsync per operation on every side):

- `harel_edge`: `LibsqlCheckpointer.record` / `.transact`, as an application calls them: async,
  through the Database's thread hand-off and guard, under the retry policy, on libsql.
- `sqlite3 inline`: the same statements through Python's sqlite3, called directly in a loop:
  the floor, with no event loop and no thread.
- `sqlite3 async`: the same statements through sqlite3, each operation sent to a thread with
  `asyncio.to_thread`: the least an async application must do so a commit's fsync does not
  freeze its event loop (what the sqlite3 store of the spec does, without its guard).

The operations:

- record: one fenced insert-and-renew statement per step (the `workflow_record` view).
- transact: BEGIN IMMEDIATE, the fence-and-lookup UPDATE, the effect (one INSERT), the record
  statement, COMMIT.

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
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

from harel_edge import schema  # noqa: E402
from harel_edge.durable import LibsqlCheckpointer, connect, migrate  # noqa: E402
from harel_edge.durable.checkpointer import _CLAIM, _RECORD, _TRANSACT_FENCE  # noqa: E402
from harel_edge.settings import EdgeSettings  # noqa: E402

BUDGET, ALIVE = timedelta(hours=1), timedelta(minutes=30)
EFFECT = "INSERT INTO bench_effects (workflow, step) VALUES (?, ?)"
EFFECTS_TABLE = "CREATE TABLE IF NOT EXISTS bench_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"


# ---- harel_edge ------------------------------------------------------------------------------


async def _edge(path: str, ops: int, kind: str, durability: str) -> float:
    database = connect(EdgeSettings(db_path=path, durability=durability))
    await migrate(database)
    await database.run(lambda c: c.execute(EFFECTS_TABLE))
    checkpointer = LibsqlCheckpointer(database)
    holder = await checkpointer.claim("bench", BUDGET, ALIVE)
    start = time.perf_counter()
    if kind == "record":
        for index in range(ops):
            await checkpointer.record(holder, f"step-{index}", {"n": index})
    else:
        for index in range(ops):
            step = f"step-{index}"
            await checkpointer.transact(
                holder, step, lambda tx, step=step: tx.execute(EFFECT, ("bench", step))
            )
    rate = ops / (time.perf_counter() - start)
    await database.aclose()
    return rate


def harel_edge(path: str, ops: int, kind: str, durability: str) -> float:
    return asyncio.run(_edge(path, ops, kind, durability))


# ---- plain sqlite3, same statements, same durability ----------------------------------------


def _sqlite3_operation(
    path: str, kind: str, durability: str
) -> tuple[sqlite3.Connection, Callable[[int], None]]:
    """A sqlite3 connection set up like the local profile, and one operation of `kind`."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={durability.upper()}")
    conn.execute("PRAGMA busy_timeout=5000")
    schema.migrate(lambda sql: conn.execute(sql).fetchall())
    conn.execute(EFFECTS_TABLE)
    token = conn.execute(_CLAIM, ("bench", BUDGET.total_seconds(), ALIVE.total_seconds(), None)).fetchall()[
        0
    ][0]

    def record(index: int) -> None:
        rows = conn.execute(
            _RECORD, ("bench", f"step-{index}", json.dumps({"n": index}), token, None)
        ).fetchall()
        assert rows[0][0]

    def transact(index: int) -> None:
        step = f"step-{index}"
        conn.execute("BEGIN IMMEDIATE")
        fence = conn.execute(_TRANSACT_FENCE, ("bench", token, step, None)).fetchall()
        assert fence and fence[0][0] is None
        conn.execute(EFFECT, ("bench", step))
        assert conn.execute(_RECORD, ("bench", step, json.dumps(step), token, None)).fetchall()[0][0]
        conn.execute("COMMIT")

    return conn, record if kind == "record" else transact


def sqlite3_inline(path: str, ops: int, kind: str, durability: str) -> float:
    conn, operation = _sqlite3_operation(path, kind, durability)
    start = time.perf_counter()
    for index in range(ops):
        operation(index)
    rate = ops / (time.perf_counter() - start)
    conn.close()
    return rate


def sqlite3_async(path: str, ops: int, kind: str, durability: str) -> float:
    conn, operation = _sqlite3_operation(path, kind, durability)

    async def run() -> float:
        start = time.perf_counter()
        for index in range(ops):
            await asyncio.to_thread(operation, index)
        return ops / (time.perf_counter() - start)

    rate = asyncio.run(run())
    conn.close()
    return rate


SIDES: dict[str, Callable[[str, int, str, str], float]] = {
    "sqlite3 inline": sqlite3_inline,
    "sqlite3 async": sqlite3_async,
    "harel_edge": harel_edge,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per measurement")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median kept)")
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
        f"files in {base}; {args.ops} operations x {args.rounds} rounds; "
        f"WAL + synchronous={args.durability.upper()} on every side"
    )
    rates: dict[tuple[str, str], list[float]] = {}
    counter = 0
    for _round in range(args.rounds):
        for kind in ("record", "transact"):
            for name, side in SIDES.items():
                counter += 1
                path = str(base / f"{name.replace(' ', '-')}-{kind}-{counter}.db")
                rates.setdefault((kind, name), []).append(side(path, args.ops, kind, args.durability))
    print(f"{'operation':<10}" + "".join(f"{name + ' /s':>18}" for name in SIDES) + "   harel_edge vs")
    for kind in ("record", "transact"):
        medians = {name: statistics.median(rates[(kind, name)]) for name in SIDES}
        line = f"{kind:<10}" + "".join(f"{medians[name]:>18.0f}" for name in SIDES)
        for name in ("sqlite3 inline", "sqlite3 async"):
            ratios = [
                ours / theirs
                for ours, theirs in zip(rates[(kind, "harel_edge")], rates[(kind, name)], strict=True)
            ]
            line += (
                f"   {name}: {statistics.median(ratios):.2f}x"
                f" ({min(ratios):.2f}-{max(ratios):.2f}, {1e6 / medians['harel_edge'] - 1e6 / medians[name]:+.0f} us/op)"
            )
        print(line)


if __name__ == "__main__":
    main()
