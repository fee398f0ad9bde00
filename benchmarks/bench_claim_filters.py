"""A claim's cost against the number of waiting groups, for each filter a claim can carry.

Run: `.venv/bin/python benchmarks/bench_claim_filters.py` (`--sizes 1000,10000,50000`,
`--claims 300`). For each size a fresh local file (WAL, synchronous=FULL) holds that many groups
of three messages; group i has routing key eu/us/ap/af by i % 4 and priority i % 4, except the
newest 2% of groups, which have priority 4 (work that arrived behind a backlog). Each row times
`--claims` claims (median, in ms), each followed by an untimed `nack(0)`, so the number of
waiting groups never changes. The last row first leases half the groups (visibility 1 h) and
then claims among the other half. Prints the table and, per row, the 50k/1k ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harel.spec.states import Event

from harel_edge import logs
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings

KEYS = ("eu", "us", "ap", "af")
ROWS = [
    ("no key", {}),
    ("one key", {"routing_keys": ["eu"]}),
    ("two keys", {"routing_keys": ["eu", "us"]}),
    ("three keys", {"routing_keys": ["eu", "us", "ap"]}),
    ("priority floor 3", {"min_priority": 3}),
    ("priority floor 4 (newest 2%)", {"min_priority": 4}),
    ("two keys + floor 3", {"routing_keys": ["eu", "us"], "min_priority": 3}),
    ("no key, half in flight", {}),
]


def build(path: Path, groups: int) -> LibsqlTransport:
    transport = LibsqlTransport(settings=ExplicitSettings.load(profile="local", db_path=str(path)))
    newest = groups - max(1, groups // 50)
    transport.publish_many(
        Message(f"g{i}", Event(kind=f"e{m}"), 4 if i >= newest else i % 4, KEYS[i % 4])
        for m in range(3)
        for i in range(groups)
    )
    return transport


def median_claim_ms(transport: LibsqlTransport, claims: int, filters: dict) -> float:
    for _ in range(20):  # warm the page cache and the statement cache
        transport.nack(transport.claim("w", 30, **filters))
    times = []
    for _ in range(claims):
        started = time.perf_counter()
        lease = transport.claim("w", 30, **filters)
        times.append(time.perf_counter() - started)
        assert lease is not None, "every row has claimable groups"
        transport.nack(lease)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()
    logs.configure_logging(level="warning")
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict[int, float]] = {name: {} for name, _ in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            transport = build(Path(tmp) / f"claims{size}.db", size)
            try:
                for name, filters in ROWS:
                    if name.endswith("half in flight"):
                        for _ in range(size // 2):
                            transport.claim("holder", 3600)
                    results[name][size] = median_claim_ms(transport, args.claims, filters)
            finally:
                transport.close()
    head = " | ".join(f"{s // 1000}k groups" for s in sizes)
    print(f"\nclaim median, ms (local file, {args.claims} claims, 3 messages a group)\n")
    print(f"| claim | {head} | {sizes[-1] // 1000}k/{sizes[0] // 1000}k |")
    print(f"| --- |{' ---: |' * (len(sizes) + 1)}")
    for name, _ in ROWS:
        row = results[name]
        cells = " | ".join(f"{row[s]:.3f}" for s in sizes)
        print(f"| {name} | {cells} | {row[sizes[-1]] / row[sizes[0]]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
