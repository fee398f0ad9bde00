"""The durable checkpoint store on the local profile against plain sqlite3, in one run.

Run: `.venv/bin/python benchmarks/bench_durable.py [--ops N] [--rounds R]`. Prints the rates and
the ratios that docs/durable.md reports.

What is compared: `LibsqlCheckpointer.record` and `.transact` (async, through the Database's
thread hand-off, guard and retry policy, on the libsql driver) against the same statements
issued by hand through Python's sqlite3, on the same schema and at the same durability: WAL
and synchronous=FULL, one commit (one fsync) per operation on both sides.

- record: one fenced insert-and-renew statement per step (the `workflow_record` view).
- transact: BEGIN IMMEDIATE, the fence-and-lookup UPDATE, the effect (one INSERT), the record
  statement, COMMIT.

Both sides run on the same disk, interleaved over rounds, and every figure that matters is a
ratio of two measurements from the same run (median of the rounds), because absolute times on
these machines vary from run to run with the disk.
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
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

from harel_edge import schema  # noqa: E402
from harel_edge.durable import LibsqlCheckpointer, connect, migrate  # noqa: E402
from harel_edge.durable.checkpointer import _CLAIM, _RECORD, _TRANSACT_FENCE  # noqa: E402
from harel_edge.settings import EdgeSettings  # noqa: E402

BUDGET, ALIVE = timedelta(hours=1), timedelta(minutes=30)
EFFECT = "INSERT INTO bench_effects (workflow, step) VALUES (?, ?)"


def _effects_table() -> str:
    return "CREATE TABLE IF NOT EXISTS bench_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)"


# ---- harel_edge ------------------------------------------------------------------------------


async def _edge(path: str, ops: int, kind: str, durability: str) -> float:
    database = connect(EdgeSettings(db_path=path, durability=durability))
    await migrate(database)
    await database.run(lambda c: c.execute(_effects_table()))
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


def edge(path: str, ops: int, kind: str, durability: str) -> float:
    return asyncio.run(_edge(path, ops, kind, durability))


# ---- plain sqlite3, same statements, same durability ----------------------------------------


def plain(path: str, ops: int, kind: str, durability: str) -> float:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={durability.upper()}")
    conn.execute("PRAGMA busy_timeout=5000")
    schema.migrate(lambda sql: conn.execute(sql).fetchall())
    conn.execute(_effects_table())
    token = conn.execute(_CLAIM, ("bench", BUDGET.total_seconds(), ALIVE.total_seconds(), None)).fetchall()[
        0
    ][0]
    start = time.perf_counter()
    if kind == "record":
        for index in range(ops):
            held, _, _, _ = conn.execute(
                _RECORD, ("bench", f"step-{index}", json.dumps({"n": index}), token, None)
            ).fetchone()
            assert held
    else:
        for index in range(ops):
            step = f"step-{index}"
            conn.execute("BEGIN IMMEDIATE")
            fence = conn.execute(_TRANSACT_FENCE, ("bench", token, step, None)).fetchall()
            assert fence and fence[0][0] is None
            conn.execute(EFFECT, ("bench", step))
            held = conn.execute(_RECORD, ("bench", step, json.dumps(step), token, None)).fetchone()[0]
            assert held
            conn.execute("COMMIT")
    rate = ops / (time.perf_counter() - start)
    conn.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="operations per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    parser.add_argument(
        "--durability",
        choices=("full", "normal"),
        default="full",
        help="synchronous=FULL (the stores' default: one fsync per commit) or NORMAL (no fsync per "
        "commit under WAL, which leaves the per-operation cost of harel_edge's own layers)",
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
        f"WAL + synchronous={args.durability.upper()} on both sides"
    )
    results: dict[tuple[str, str], list[float]] = {}
    counter = 0
    for _round in range(args.rounds):
        for kind in ("record", "transact"):
            for name, run in (("sqlite3", plain), ("harel_edge", edge)):
                counter += 1
                path = str(base / f"{name}-{kind}-{counter}.db")
                results.setdefault((kind, name), []).append(run(path, args.ops, kind, args.durability))
    print(f"{'operation':<10} {'sqlite3 /s':>12} {'harel_edge /s':>14} {'ratio':>7}")
    for kind in ("record", "transact"):
        baseline = statistics.median(results[(kind, "sqlite3")])
        ours = statistics.median(results[(kind, "harel_edge")])
        per_round = [
            e / s for e, s in zip(results[(kind, "harel_edge")], results[(kind, "sqlite3")], strict=True)
        ]
        print(
            f"{kind:<10} {baseline:>12.0f} {ours:>14.0f} {ours / baseline:>6.2f}x"
            f"   per-round ratios: median {statistics.median(per_round):.2f},"
            f" range {min(per_round):.2f}-{max(per_round):.2f};"
            f" harel_edge {1e6 / ours - 1e6 / baseline:+.0f} us per operation"
        )


if __name__ == "__main__":
    main()
