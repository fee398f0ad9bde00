"""One `harel-edge worker` process far from its primary: its peak resident memory, at its window.

Starts a sqld primary, seeds `--orders` executions of the demo's order statechart (four events
each) without delay, then runs the worker command as a deployment does, reaching the primary
through `harel_edge.testing.proxy.LatencyProxy` (`--rtt` ms round trips), until the queue is
empty; prints the worker's peak resident memory (VmHWM) and its rate, start-up included.

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_worker_memory.py
    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_worker_memory.py --max-in-flight 256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_worker import EXAMPLES, seed_edge

from harel_edge.executor import Stmt, open_executor
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.proxy import LatencyProxy

COMMAND = str(Path(sys.executable).parent / "harel-edge")


async def drained(settings, table: str) -> None:
    executor = open_executor(settings)
    try:
        while (await executor.execute(Stmt(f"SELECT count(*) FROM {table}"))).rows[0][0]:
            await asyncio.sleep(0.1)
    finally:
        await executor.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=2000, help="executions; each gets 4 events")
    parser.add_argument("--rtt", type=float, default=100.0, help="round trip to the primary, milliseconds")
    parser.add_argument("--max-in-flight", type=int, help="HAREL_EDGE_MAX_IN_FLIGHT (default: the setting's)")
    args = parser.parse_args()
    with start_sqld_primary() as server, LatencyProxy(server.http_port, delay=args.rtt / 2000) as proxy:
        direct = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix="mem")
        seed_edge(direct, args.orders)
        env = dict(os.environ, HAREL_EDGE_PROFILE="sqld", HAREL_EDGE_URL=proxy.url, HAREL_EDGE_PREFIX="mem")
        env["HAREL_EDGE_AUTH_TOKEN"] = server.rw_token
        if args.max_in_flight:
            env["HAREL_EDGE_MAX_IN_FLIGHT"] = str(args.max_in_flight)
        with tempfile.TemporaryDirectory() as cwd:
            began = time.perf_counter()
            worker = subprocess.Popen(
                [COMMAND, "--log-level", "warning", "worker", "-D", str(EXAMPLES)],
                env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                asyncio.run(drained(direct, "mem_transport_messages"))
                seconds = time.perf_counter() - began
                status = Path(f"/proc/{worker.pid}/status").read_text()
            finally:
                worker.terminate()
                worker.wait(timeout=60)
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    print(f"| {args.rtt:g} ms | {args.max_in_flight or 'default'} | {args.orders * 4} | "
          f"{args.orders * 4 / seconds:,.0f} | {peak / 1024:.1f} |")


if __name__ == "__main__":
    main()
