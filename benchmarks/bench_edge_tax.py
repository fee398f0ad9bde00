"""The edge tax: one worker's rate as its primary moves away (0, 20 and 100 ms round trips).

ONE `harel-edge worker` (`run_worker`, in this process) drains the demo's order statechart
(`--orders` executions, four events each) from a sqld primary reached through
`harel_edge.testing.proxy.LatencyProxy`, on the sqld and replica profiles. Cells run in
interleaved rounds (every latency of a profile, then the next round) and the median of the rounds
is reported, with each latency's rate as a share of the same profile's rate at 0 ms (over the
whole drain, and over its middle half: the rate of a steady stream, without the window's ramp
and the last executions' events that come one at a time), the loop's
lag (p99 / worst), the window the worker ended with, the peak resident memory of the cell's
process (each cell runs in a process of its own, as a worker does) and the bytes the worker sent
and received through the proxy an event (a replica's syncs included).

    .venv/bin/python benchmarks/bench_edge_tax.py
    .venv/bin/python benchmarks/bench_edge_tax.py --orders 1200 --rounds 1 --rtts 0,100
    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_edge_tax.py --pin

`--pin` gives the worker a core of its own, as a primary on another machine would. Compare rows
of one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_worker import run_edge

from harel_edge import logs, observability
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.proxy import LatencyProxy
from harel_edge.worker_process import tune_garbage_collector


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def cores_apart(enabled: bool):  # noqa: ANN201
    """With `enabled`, what starts inside (the primary, the proxy) runs on every core but the
    first, and this process (the worker) on the first once `worker_core()` is called: a primary on
    another machine does not take the worker's CPU, and on a shared one it preempts the worker."""
    if not enabled:
        yield lambda: None
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"--pin needs at least 2 cores; this process may use {len(cores)}")
    if os.environ.get("HAREL_EDGE_SQLD_BACKEND") != "binary":
        raise SystemExit("--pin pins sqld by inheritance: run it with HAREL_EDGE_SQLD_BACKEND=binary")

    def worker_core() -> None:
        for thread in os.listdir("/proc/self/task"):  # threads made later inherit the core
            os.sched_setaffinity(int(thread), cores[:1])

    os.sched_setaffinity(0, cores[1:])  # the children started next inherit it
    yield worker_core


def run_cell(profile: str, rtt: float, orders: int, timeout: float, max_in_flight: int | None, pin: bool = False) -> dict:
    """One cell in this process, as a worker process runs: its own primary, proxy and window."""
    tune_garbage_collector()  # as a worker process does (`serve`)
    logs.configure_logging(level="warning", stream=sys.stderr)
    common = {"prefix": "tax", "worker_id": "tax"}
    if max_in_flight:
        common["max_in_flight"] = max_in_flight
    with cores_apart(pin) as worker_core, tempfile.TemporaryDirectory() as tmp, start_sqld_primary() as server, LatencyProxy(
        server.http_port, delay=rtt / 2000
    ) as proxy:
        worker_core()
        common["auth_token"] = server.rw_token
        direct = ExplicitSettings.load(profile="sqld", url=server.http_url, **common)
        if profile == "sqld":
            settings = ExplicitSettings.load(profile="sqld", url=proxy.url, **common)
        else:
            replica = str(Path(tmp) / "replica.db")
            settings = ExplicitSettings.load(profile="replica", db_path=replica, sync_url=proxy.url, **common)
        row = asyncio.run(run_edge(settings, direct, orders, timeout))
        traffic = proxy.stats()
    row["kb_up_per_event"] = round(traffic["bytes_up"] / row["events"] / 1024, 2)
    row["kb_down_per_event"] = round(traffic["bytes_down"] / row["events"] / 1024, 2)
    row["window"] = int(observability.WINDOW.collect()[0].samples[0].value)
    row["rss_mb"] = round(peak_rss_mb(), 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="sqld,replica")
    parser.add_argument("--rtts", default="0,20,100", help="round trips to the primary, milliseconds")
    parser.add_argument(
        "--orders", type=int, default=5000,
        help="executions; each gets 4 events (a drain of several seconds meets the primary's 5 s checkpoint, as a "
        "running worker does; a short one may miss it, and at 100 ms measures mostly the ramp-up)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--max-in-flight", type=int, help="HAREL_EDGE_MAX_IN_FLIGHT of the worker (default: the setting's)")
    parser.add_argument(
        "--pin", action="store_true",
        help="the worker on the first core, the primary and the proxy on the others (needs the sqld binary)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # "profile,rtt": run one cell, print its row as JSON
    args = parser.parse_args()
    if args.cell:
        profile, rtt = args.cell.split(",")
        print(json.dumps(run_cell(profile, float(rtt), args.orders, args.timeout, args.max_in_flight, args.pin)))
        return
    profiles, rtts = args.profiles.split(","), [float(x) for x in args.rtts.split(",")]
    cells: dict[tuple[str, float], list[dict]] = {}
    for _ in range(args.rounds):
        for profile in profiles:
            for rtt in rtts:
                # A process of its own, as a worker is: cells sharing one would carry each other's
                # garbage; and a primary of its own, since sqld reads the whole schema into every
                # new stream.
                command = [sys.executable, __file__, "--cell", f"{profile},{rtt:g}", "--orders", str(args.orders),
                           "--timeout", str(args.timeout)]
                if args.max_in_flight:
                    command += ["--max-in-flight", str(args.max_in_flight)]
                if args.pin:
                    command.append("--pin")
                done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                cells.setdefault((profile, rtt), []).append(row)
                print(f"{profile} {rtt:g} ms: {row}", file=sys.stderr)
    cores = "the worker on a core of its own, the primary and the proxy on the others" if args.pin else "all on every core"
    print(f"\nOne worker, demo statechart, {args.orders * 4} events, median of {args.rounds} rounds, {cores}\n")
    print(
        "| profile | RTT (ms) | events/s | vs 0 ms | middle half, events/s | vs 0 ms | loop lag p99 / max (ms) | window "
        "| peak RSS (MB) | KB up / down an event | all delivered |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |")
    table = []
    for profile in profiles:
        at_0 = cells.get((profile, 0.0), [{"events_per_s": 0, "steady_per_s": 0}])
        base = statistics.median(r["events_per_s"] for r in at_0)
        steady_base = statistics.median(r["steady_per_s"] for r in at_0)
        for rtt in rtts:
            rows = cells[(profile, rtt)]
            rate = statistics.median(r["events_per_s"] for r in rows)
            steady = statistics.median(r["steady_per_s"] for r in rows)
            summary = {
                "profile": profile,
                "rtt_ms": rtt,
                "events_per_s": round(rate),
                "vs_0ms": round(rate / base, 2) if base else None,
                "steady_per_s": round(steady),
                "steady_vs_0ms": round(steady / steady_base, 2) if steady_base else None,
                "lag_p99_ms": round(statistics.median(r["lag_p99_ms"] for r in rows), 1),
                "lag_max_ms": max(r["lag_max_ms"] for r in rows),
                "window": rows[-1]["window"],
                "rss_mb": max(r["rss_mb"] for r in rows),
                "kb_up_per_event": round(statistics.median(r["kb_up_per_event"] for r in rows), 2),
                "kb_down_per_event": round(statistics.median(r["kb_down_per_event"] for r in rows), 2),
                "all_delivered": all(r["all_delivered"] for r in rows),
            }
            table.append(summary)
            ratio = f"{summary['vs_0ms']:.2f}x" if summary["vs_0ms"] is not None else ""
            steady_ratio = f"{summary['steady_vs_0ms']:.2f}x" if summary["steady_vs_0ms"] is not None else ""
            print(
                f"| {profile} | {rtt:g} | {round(rate)} | {ratio} | {round(steady)} | {steady_ratio} | "
                f"{summary['lag_p99_ms']} / {summary['lag_max_ms']} | "
                f"{summary['window']} | {summary['rss_mb']} | {summary['kb_up_per_event']} / {summary['kb_down_per_event']} | "
                f"{summary['all_delivered']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
