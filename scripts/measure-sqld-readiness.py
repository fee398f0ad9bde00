#!/usr/bin/env python3
"""Measure how long a sqld takes to answer /health, per backend (docker, binary).

Why: the test suite starts many sqld servers; knowing what one costs (and whether the
container backend is much slower than the binary) tells where a session-scoped server
is worth its shared state. Prints min / median / max over --runs starts of a primary,
a restart of it, and a replica node.

    .venv/bin/python scripts/measure-sqld-readiness.py --runs 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harel_edge.testing import backend_unavailable_reason, start_sqld_primary, start_sqld_replica_node


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"min {ms[0]:7.1f} ms  median {statistics.median(ms):7.1f} ms  max {ms[-1]:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--backend", action="append", choices=["docker", "binary"])
    args = parser.parse_args()
    for backend in args.backend or ["docker", "binary"]:
        reason = backend_unavailable_reason(backend)
        if reason:
            print(f"{backend:6}: unavailable: {reason}")
            continue
        start, whole, restart, replica = [], [], [], []
        for _ in range(args.runs):
            began = time.monotonic()
            with start_sqld_primary(backend=backend) as primary:
                whole.append(time.monotonic() - began)
                start.append(primary.ready_seconds or 0.0)
                primary.restart()
                restart.append(primary.ready_seconds or 0.0)
                with start_sqld_replica_node(primary) as node:
                    replica.append(node.ready_seconds or 0.0)
        print(f"{backend:6} primary start to /health : {summary(start)}")
        print(f"{backend:6} start_sqld_primary() call: {summary(whole)}")
        print(f"{backend:6} primary restart           : {summary(restart)}")
        print(f"{backend:6} replica node start        : {summary(replica)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
