"""Several workers on one primary: the aggregate rate of N `harel-edge worker` processes 20 ms from
one sqld, against one worker, and whether every event was applied once.

`--orders` executions of the demo's order statechart (four events each) are queued on a real sqld
(`harel_edge.testing`), reached through `harel_edge.testing.proxy.LatencyProxy` (`--delay` each
way); then N worker processes (the `harel-edge worker` command, on the sqld or replica profile)
drain them. Reported per N: events/s from the first event handled to the queue empty, the rate
against one worker's, every order Delivered, and events applied (harel's processed-event records,
one per event: a second application of an event would be refused by their key, and its order
would not end Delivered).

    .venv/bin/python benchmarks/bench_workers_share.py
    .venv/bin/python benchmarks/bench_workers_share.py --workers 1,2,3 --orders 300 --profile replica

Compare rows of one run: the machine is shared and noisy (2 cores here run sqld, the proxy and
every worker).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_worker import DELIVERED, EXAMPLES, STEPS, seed_edge

from harel_edge import logs
from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.proxy import LatencyProxy

COMMAND = str(Path(sys.executable).parent / "harel-edge")


def drain(n: int, settings, direct, tmp: Path, orders: int, timeout: float) -> dict:
    """Seed, start `n` worker processes, time the drain, stop them; the row for `n`."""
    seed_edge(settings, orders)
    total = orders * len(STEPS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAREL_")}
    env.update(
        HAREL_EDGE_PROFILE=settings.profile,
        HAREL_EDGE_PREFIX=settings.prefix,
        HAREL_EDGE_AUTH_TOKEN=settings.auth_token.get_secret_value(),
        HAREL_EDGE_VISIBILITY="30",
    )
    if settings.profile == "sqld":
        env["HAREL_EDGE_URL"] = settings.url
    else:
        env["HAREL_EDGE_SYNC_URL"] = settings.sync_url
    watcher = Statements(direct)
    p = settings.prefix
    workers = []
    try:
        for i in range(n):
            worker_env = dict(env, HAREL_EDGE_WORKER_ID=f"share-{p}-{i}")
            if settings.profile == "replica":
                worker_env["HAREL_EDGE_DB_PATH"] = str(tmp / f"{p}-{i}.db")
            workers.append(
                subprocess.Popen(  # noqa: S603
                    [COMMAND, "--log-level", "warning", "worker", "-D", str(EXAMPLES)],
                    env=worker_env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )
        started = ended = None
        left_at_start = total
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = watcher.execute(f"SELECT count(*) FROM {p}_transport_messages")[0][0]
            now = time.perf_counter()
            if started is None and left < total:
                started, left_at_start = now, left
            if left == 0:
                ended = now
                break
            time.sleep(0.02)  # the watcher's polling pace
        delivered = watcher.execute(DELIVERED.format(p=p))[0][0]
        applied = watcher.execute(f"SELECT count(*) FROM {p}_processed_events")[0][0]
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
        watcher.close()
    rate = left_at_start / (ended - started) if ended and started and ended > started else 0.0
    return {"workers": n, "events_per_s": rate, "delivered": delivered == orders, "applied": applied, "events": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,3")
    parser.add_argument("--profile", default="sqld", choices=("sqld", "replica"))
    parser.add_argument("--orders", type=int, default=300, help="executions; each gets 4 events")
    parser.add_argument("--delay", type=float, default=0.010, help="proxy delay each way, seconds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    logs.configure_logging(level="warning", stream=sys.stderr)
    counts = [int(x) for x in args.workers.split(",")]
    rows: dict[int, list[dict]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp_dir, start_sqld_primary() as server:
        tmp = Path(tmp_dir)
        with LatencyProxy(server.http_port, delay=args.delay) as proxy:
            cell = 0
            for _ in range(args.rounds):
                for n in counts:
                    cell += 1
                    common = {"prefix": f"s{cell}", "worker_id": f"seed-{cell}", "auth_token": server.rw_token}
                    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, **common)
                    if args.profile == "sqld":
                        settings = ExplicitSettings.load(profile="sqld", url=proxy.url, **common)
                    else:
                        settings = ExplicitSettings.load(
                            profile="replica", sync_url=proxy.url, db_path=str(tmp / f"seed{cell}.db"), **common
                        )
                    rows[n].append(drain(n, settings, direct, tmp, args.orders, args.timeout))
    print(f"\n{args.profile}, {args.orders * 4} events, proxy {args.delay * 1000:g} ms each way, median of {args.rounds} interleaved rounds\n")
    print("| workers | events/s | vs one worker | every order Delivered | events applied |")
    print("| ---: | ---: | ---: | --- | ---: |")
    one = statistics.median(r["events_per_s"] for r in rows[counts[0]])
    for n in counts:
        rate = statistics.median(r["events_per_s"] for r in rows[n])
        ok = all(r["delivered"] for r in rows[n])
        applied = ", ".join(f"{r['applied']} of {r['events']}" for r in rows[n])
        print(f"| {n} | {rate:.0f} | {rate / one:.2f}x | {ok} | {applied} |")


if __name__ == "__main__":
    main()
