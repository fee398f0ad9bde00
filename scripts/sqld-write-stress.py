#!/usr/bin/env python3
"""Does a sqld primary keep answering many concurrent writers? With its automatic checkpoint and with a timer.

Why: sqld 0.24 checkpoints its WAL, by default, inside the commit that fills 1,000 pages; under
concurrent writers that has wedged its write-lock queue for good (every request waits, sqld
spins at 200 % CPU). harel_edge's launcher and compose file start primaries with
`--checkpoint-interval-s` instead. Each run starts a fresh primary (binary or Docker, as the
tests pick) and has 16 writers commit `--batches` transactions each (`concurrent_writes`).

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python scripts/sqld-write-stress.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harel_edge.testing import start_sqld_primary
from harel_edge.testing.sqld import CHECKPOINT_INTERVAL_S
from harel_edge.testing.sqld.stress import concurrent_writes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--batches", type=int, default=100, help="transactions each writer commits")
    parser.add_argument("--stall", type=float, default=10.0, help="seconds without an answer that count as wedged")
    args = parser.parse_args()
    for label, interval in (("automatic checkpoint (sqld's default)", None), (f"--checkpoint-interval-s {CHECKPOINT_INTERVAL_S}", CHECKPOINT_INTERVAL_S)):
        for run in range(1, args.runs + 1):
            with start_sqld_primary(checkpoint_interval_s=interval) as server:
                outcome = asyncio.run(
                    concurrent_writes(server.http_url, server.rw_token, writers=args.writers, batches=args.batches, stall=args.stall)
                )
            state = "answered throughout" if outcome.finished else f"WEDGED (no answer for {args.stall:g} s)"
            print(
                f"{label}, run {run}: {outcome.committed} of {args.writers * args.batches} commits in "
                f"{outcome.seconds:.1f} s, {state}; refused and retried: {outcome.refused or 'none'}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
