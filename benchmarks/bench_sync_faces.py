"""The sync faces (`LibsqlTransport`, `EdgeStore`) against harel 0.9's own, three measures in one run.

(a) harel 0.9's sync `Worker` (`harel.engine.distributed.Worker`, in its default `background`
    execution and in `inline`) given the sync faces, one worker in this process, on the demo's order statechart
    (`--orders` orders, four events each: Start, Pay, Ship, Deliver): events per second from its
    first step to the queue empty, on a local file, on the sqld profile and on the replica profile
    (a real sqld on loopback, no added delay); each remote rate as a ratio of the local one.
    Rounds interleave the profiles; medians. A peer row: the same worker on harel 0.9's own
    `LibsqlStore` + `LibsqlTransport` on a local file (its ratio is to the faces apart). The faces
    apart (`EdgeStore(settings)`, an executor each) and paired (`LibsqlTransport(..., pair_with_store=True)` and `EdgeStore(transport=t)`: the
    store on the transport's core, its claims bring the execution, its commit carries the ack).
(b) three spawned replica processes drain `--messages` messages (`bench_replica_drain.py`):
    harel 0.9's `LibsqlTransport` against the sync `LibsqlTransport`, the same claim + ack loop,
    and the sync face with `claim_many` + `ack_many`; work span, ratios to harel's.
(c) claim + ack one at a time on a local file (`bench_transport.py`'s drain, 100 groups x 20
    messages by default): the sync `LibsqlTransport` against harel 0.9's `LibsqlTransport` (the
    same libsql driver); rounds interleaved, medians.

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_sync_faces.py

Only ratios of one run mean anything: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_replica_drain  # noqa: E402
import bench_transport  # noqa: E402
from harel.engine.distributed import Worker  # noqa: E402
from harel.engine.execution import Execution  # noqa: E402
from harel.spec.states import Event  # noqa: E402

from harel_edge import LibsqlTransport, Message, logs  # noqa: E402
from harel_edge.settings import ExplicitSettings  # noqa: E402
from harel_edge.store import EdgeStore  # noqa: E402
from harel_edge.worker import load_definitions  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "harel_edge" / "examples"
STEPS = (("Start", {}), ("Pay", {"amount": 1.0}), ("Ship", {}), ("Deliver", {}))
PROFILES = ("local", "sqld", "replica")
PAIRINGS = ("apart", "paired")


# ---- (a) harel's sync Worker on the sync faces ------------------------------------------------


def orders_and_events(orders: int) -> tuple[list[Execution], list[Message]]:
    executions = [Execution(id=f"order-{i:04d}", definition_id="order", priority=i % 4) for i in range(orders)]
    events = [Message(f"order-{i:04d}", Event(kind=k, data=d), i % 4) for i in range(orders) for k, d in STEPS]
    return executions, events


def drain_worker(store, transport, definitions, count_done, execution: str) -> tuple[float, int, int]:  # noqa: ANN001
    """One harel sync Worker stepping until nothing is claimable: (seconds, events, orders done)."""
    worker = Worker(store, transport, definitions, worker_id="bench", execution=execution)
    events = 0
    start = time.perf_counter()
    while worker.step():
        events += 1
    return time.perf_counter() - start, events, count_done()


def edge_worker(settings, orders: int, definitions, execution: str, paired: bool) -> tuple[float, int, int]:  # noqa: ANN001
    """`paired`: the store on the transport's core (`EdgeStore(transport=...)`), else apart."""
    executions, events = orders_and_events(orders)
    with LibsqlTransport(settings=settings, pair_with_store=paired) as transport, (
        EdgeStore(transport=transport) if paired else EdgeStore(settings)
    ) as store:
        for exe in executions:
            store.save(exe)
        transport.publish_many(events)
        done_sql = f"SELECT count(*) FROM {settings.prefix}_executions WHERE json_extract(data, '$.status') = 'DONE'"
        return drain_worker(store, transport, definitions, lambda: store.execute(done_sql)[0][0], execution)


def harel_worker(path: str, orders: int, definitions, execution: str) -> tuple[float, int, int]:  # noqa: ANN001
    from harel.engine.store.libsql import LibsqlStore  # noqa: PLC0415
    from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport  # noqa: PLC0415

    executions, events = orders_and_events(orders)
    store, transport = LibsqlStore(path), HarelLibsqlTransport(path)
    for exe in executions:
        store.save(exe)
    for message in events:
        transport.publish(message.group_id, message.event, message.priority)

    def count_done() -> int:
        return sum(1 for exe in executions if store.load(exe.id).status.value == "DONE")

    return drain_worker(store, transport, definitions, count_done, execution)


def measure_worker(tmp: Path, orders: int, rounds: int, modes: list[str]) -> dict[tuple[str, str], list]:
    """Each (execution mode, faces and profile)'s (seconds, events, orders done) per round. Each
    remote cell has a primary of its own: sqld reads the whole schema into every new stream, so
    cells sharing one would slow down as their tables pile up."""
    from harel_edge.testing import start_sqld_primary  # noqa: PLC0415

    definitions = load_definitions(str(EXAMPLES))
    results: dict[tuple[str, str], list] = {}
    for r in range(rounds):
        for mode in modes:
            for pairing in PAIRINGS:
                for profile in PROFILES:
                    name = f"{pairing}-{r}-{mode}-{profile}"
                    values = {"profile": profile, "prefix": name.replace("-", "_"), "worker_id": "bench"}
                    with contextlib.ExitStack() as stack:
                        if profile == "local":
                            values["db_path"] = str(tmp / f"worker-{name}.db")
                        else:
                            server = stack.enter_context(start_sqld_primary())
                            if profile == "sqld":
                                values.update(url=server.http_url, auth_token=server.rw_token)
                            else:
                                values.update(sync_url=server.http_url, auth_token=server.rw_token, db_path=str(tmp / f"{name}.db"))
                        row = edge_worker(ExplicitSettings.load(**values), orders, definitions, mode, pairing == "paired")
                    results.setdefault((mode, f"{pairing} {profile}"), []).append(row)
            row = harel_worker(str(tmp / f"harel-worker-{r}-{mode}.db"), orders, definitions, mode)
            results.setdefault((mode, "harel-local"), []).append(row)
    return results


def worker_table(results: dict[tuple[str, str], list], orders: int, modes: list[str]) -> list[str]:
    rate = {key: statistics.median(events / seconds for seconds, events, _ in rows) for key, rows in results.items()}
    where = {"local": "local file", "sqld": "sqld profile (loopback)", "replica": "replica profile (loopback)"}
    names = {"harel-local": "harel 0.9 LibsqlStore + LibsqlTransport, local file"}
    for profile, place in where.items():
        names[f"apart {profile}"] = f"harel_edge faces apart, {place}"
        names[f"paired {profile}"] = f"harel_edge store on the transport's core, {place}"
    lines = [
        "| execution | store and transport | events/s | vs the same faces on a local file | every order delivered |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for mode in modes:
        for name in [f"{pairing} {profile}" for pairing in PAIRINGS for profile in PROFILES] + ["harel-local"]:
            key = (mode, name)
            delivered = all(done == orders and events == orders * len(STEPS) for _, events, done in results[key])
            base = rate[(mode, f"{name.split()[0]} local")] if name != "harel-local" else rate[(mode, "apart local")]
            lines.append(f"| {mode} | {names[name]} | {rate[key]:,.0f} | {rate[key] / base:.2f}x | {'yes' if delivered else 'NO'} |")
    return lines


# ---- (c) claim + ack one at a time on a local file --------------------------------------------


def measure_claim_ack(tmp: Path, groups: int, per_group: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport  # noqa: PLC0415

    makers = {"harel LibsqlTransport": HarelLibsqlTransport, "harel_edge sync LibsqlTransport": LibsqlTransport}
    results: dict[str, list] = {name: [] for name in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            publish, drain, latencies = bench_transport.publish_and_drain(make, bench_transport.fresh(tmp, name), groups, per_group)
            results[name].append((drain, statistics.median(latencies[:-1]) * 1000))
    return results


def claim_ack_table(results: dict[str, list[tuple[float, float]]]) -> list[str]:
    base = statistics.median(drain for drain, _ in results["harel LibsqlTransport"])
    lines = ["| transport | claim+ack/s | claim p50 ms | vs harel |", "| --- | ---: | ---: | ---: |"]
    for name, rows in results.items():
        drain, p50 = (statistics.median(column) for column in zip(*rows, strict=True))
        lines.append(f"| {name} | {drain:,.0f} | {p50:.3f} | {drain / base:.2f}x |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=100, help="(a) orders, four events each")
    parser.add_argument("--worker-rounds", type=int, default=3)
    parser.add_argument("--execution", default="background,inline", help="(a) harel's Worker execution modes")
    parser.add_argument("--messages", type=int, default=600, help="(b) messages drained")
    parser.add_argument("--groups", type=int, default=60, help="(b) groups")
    parser.add_argument("--n", type=int, default=16, help="(b) claim_many's n")
    parser.add_argument("--claim-groups", type=int, default=100, help="(c) groups")
    parser.add_argument("--per-group", type=int, default=20, help="(c) messages a group")
    parser.add_argument("--claim-rounds", type=int, default=3)
    parser.add_argument("--only", default="a,b,c", help="which measures, e.g. a,c")
    args = parser.parse_args()
    only = set(args.only.split(","))
    modes = args.execution.split(",")

    logs.configure_logging(level="warning")
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if "a" in only:
            results = measure_worker(tmp, args.orders, args.worker_rounds, modes)
            out += [
                f"\n(a) harel 0.9's sync Worker, {args.orders} orders x {len(STEPS)} events, one worker, "
                f"{args.worker_rounds} rounds interleaved, medians\n",
                *worker_table(results, args.orders, modes),
            ]
            print("\n".join(out), flush=True)
        if "b" in only:
            rows = bench_replica_drain.measure(tmp, args.messages, args.groups, args.n)
            part = [
                f"\n(b) {bench_replica_drain.PROCESSES} replica processes (spawn), {args.messages} messages over "
                f"{args.groups} groups, sqld on loopback, work span\n",
                *bench_replica_drain.table(rows, args.n),
            ]
            out += part
            print("\n".join(part), flush=True)
        if "c" in only:
            results = measure_claim_ack(tmp, args.claim_groups, args.per_group, args.claim_rounds)
            part = [
                f"\n(c) claim + ack one at a time, local files, {args.claim_groups} groups x {args.per_group} "
                f"messages, {args.claim_rounds} rounds interleaved, medians\n",
                *claim_ack_table(results),
            ]
            out += part
            print("\n".join(part), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
