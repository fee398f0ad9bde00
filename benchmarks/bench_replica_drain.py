"""Three edge processes, each with its own embedded replica, draining one queue on a real sqld.

`--messages` messages over `--groups` groups are published to the primary, then three spawned
processes drain them together, each claiming and acking until it finds nothing to claim:

- `harel`: harel 0.9's `LibsqlTransport` on an embedded replica (its claim is an interactive
  transaction through the replica: BEGIN IMMEDIATE, SELECT, UPDATE, COMMIT), claim + ack;
- `sync`: harel_edge's sync `LibsqlTransport` on the replica profile, the same claim + ack loop
  (one statement each, sent to the primary over Hrana);
- `sync-many`: the same face with `claim_many(--n)` + `ack_many` (one statement leases n groups'
  heads; their acks are one statement).

Reported: the work span (from the three starting together to the last one done), messages per
second, and each ratio to harel's. `--delay` adds a latency proxy (seconds each way).
`benchmarks/bench_sync_faces.py` runs the same measurement beside its other two.

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_replica_drain.py
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import tempfile
import time
from pathlib import Path

from harel.spec.states import Event

from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings

PROCESSES = 3
KINDS = ("harel", "sync", "sync-many")
NAMES = {
    "harel": "harel 0.9 LibsqlTransport (replica), claim + ack",
    "sync": "harel_edge sync LibsqlTransport (replica), claim + ack",
    "sync-many": "harel_edge sync LibsqlTransport (replica), claim_many({n}) + ack_many",
}


def drain_harel(url: str, token: str, db: str, prefix: str, n: int, start, done) -> None:  # noqa: ANN001, ARG001
    import os  # noqa: PLC0415

    os.environ.setdefault("RUST_LOG", "error")
    from harel.engine.transport import LibsqlTransport as HarelLibsqlTransport  # noqa: PLC0415

    t = HarelLibsqlTransport(db, sync_url=url, auth_token=token, prefix=prefix, create_schema=False)
    start.wait()
    count = 0
    while True:
        try:
            lease = t.claim("harel", 30)
        except Exception:  # noqa: BLE001 - harel's claim times out under contention; try again
            continue
        if lease is None:
            break
        t.ack(lease)
        count += 1
    done.put((time.perf_counter(), count))


def drain_sync(url: str, token: str, db: str, prefix: str, n: int, start, done) -> None:  # noqa: ANN001
    """The sync face, claim + ack one at a time (`n` == 1) or `claim_many(n)` + `ack_many`."""
    from harel_edge import logs  # noqa: PLC0415

    logs.configure_logging(level="warning")
    settings = ExplicitSettings.load(profile="replica", db_path=db, sync_url=url, auth_token=token, prefix=prefix)
    with LibsqlTransport(settings=settings, create_schema=False) as t:
        start.wait()
        count = 0
        if n == 1:
            while (lease := t.claim("edge", 30)) is not None:
                t.ack(lease)
                count += 1
        else:
            while leases := t.claim_many("edge", 30, n):
                t.ack_many(leases)
                count += len(leases)
        done.put((time.perf_counter(), count))


def drain(kind: str, server, url: str, tmp: Path, prefix: str, messages: int, groups: int, n: int) -> tuple[float, int]:  # noqa: ANN001
    """Publish `messages` on the primary, then drain them with three `kind` processes: the work
    span in seconds and the messages they acked."""
    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=prefix)
    with LibsqlTransport(settings=direct) as publisher:
        publisher.publish_many(Message(f"g{i % groups}", Event(kind="e")) for i in range(messages))
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Barrier(PROCESSES + 1), ctx.Queue()
    target, per_claim = (drain_harel, 1) if kind == "harel" else (drain_sync, 1 if kind == "sync" else n)
    procs = [
        ctx.Process(target=target, args=(url, server.rw_token, str(tmp / f"{prefix}-{p}.db"), prefix, per_claim, start, done))
        for p in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    start.wait(timeout=300)
    began = time.perf_counter()
    results = [done.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    return max(r[0] for r in results) - began, sum(r[1] for r in results)


def measure(tmp: Path, messages: int, groups: int, n: int, delay: float = 0.0, kinds=KINDS) -> dict[str, tuple[float, int]]:  # noqa: ANN001
    """Each kind's (work span, messages acked), one after another, each on a primary of its own
    (`delay` seconds away each way): a new replica replays its primary's whole log, and sqld reads
    the whole schema into every new stream, so kinds sharing one would pay for those before them."""
    from harel_edge.testing import start_sqld_primary  # noqa: PLC0415
    from harel_edge.testing.proxy import LatencyProxy  # noqa: PLC0415

    rows = {}
    for kind in kinds:
        with start_sqld_primary() as server, contextlib.ExitStack() as stack:
            url = stack.enter_context(LatencyProxy(server.http_port, delay=delay)).url if delay else server.http_url
            rows[kind] = drain(kind, server, url, tmp, f"d_{kind.replace('-', '_')}", messages, groups, n)
    return rows


def table(rows: dict[str, tuple[float, int]], n: int) -> list[str]:
    base = rows["harel"][1] / rows["harel"][0]
    lines = ["| transport | seconds | messages | messages/s | vs harel |", "| --- | ---: | ---: | ---: | ---: |"]
    for kind, (seconds, count) in rows.items():
        rate = count / seconds
        lines.append(f"| {NAMES[kind].format(n=n)} | {seconds:.2f} | {count} | {rate:,.0f} | {rate / base:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--groups", type=int, default=60)
    parser.add_argument("--n", type=int, default=16, help="claim_many's n")
    parser.add_argument("--delay", type=float, default=0.0, help="proxy delay each way, seconds")
    args = parser.parse_args()
    from harel_edge import logs  # noqa: PLC0415

    logs.configure_logging(level="warning")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp), args.messages, args.groups, args.n, args.delay)
    print(f"\n{PROCESSES} replica processes, {args.messages} messages over {args.groups} groups, delay {args.delay * 1000:g} ms\n")
    print("\n".join(table(rows, args.n)))


if __name__ == "__main__":
    main()
