"""The claim's shape on a real sqld: the spec's multi-statement transaction vs one statement.

Run: `.venv/bin/python benchmarks/bench_claim_shapes.py`. Starts its own sqld (harel_edge.testing)
and measures claim+ack through harel 0.9's LibsqlTransport (BEGIN IMMEDIATE, SELECT, two
UPDATEs, COMMIT; ack in a transaction too) and through harel_edge's (one UPDATE ... RETURNING;
one DELETE), on the sqld profile (remote connection) and the replica profile (embedded
replica), from one process. Prints medians and the ratio.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RUST_LOG", "error")

from harel.engine.transport import LibsqlTransport as HarelLibsql  # noqa: E402
from harel.spec.states import Event  # noqa: E402

from harel_edge import LibsqlTransport  # noqa: E402
from harel_edge.testing import start_sqld_primary  # noqa: E402

MESSAGES = 150


def measure(transport) -> tuple[float, float]:
    for i in range(MESSAGES):
        transport.publish(f"g{i % 10}", Event(kind="e"))
    claims, acks = [], []
    for _ in range(MESSAGES):
        start = time.perf_counter()
        lease = transport.claim("w", 30)
        middle = time.perf_counter()
        transport.ack(lease)
        acks.append(time.perf_counter() - middle)
        claims.append(middle - start)
    transport.close()
    return statistics.median(claims) * 1000, statistics.median(acks) * 1000


def main() -> int:
    tmp = tempfile.mkdtemp()
    # Without auth: harel 0.9's LibsqlTransport passes its token only to an embedded replica.
    with start_sqld_primary(auth=False) as primary:
        token = ""
        rows = []
        for profile in ("sqld", "replica"):
            for name, cls in (("harel 0.9 (transaction)", HarelLibsql), ("harel_edge (one statement)", LibsqlTransport)):
                prefix = f"{profile}_{'h' if cls is HarelLibsql else 'e'}"
                if profile == "sqld":
                    t = cls(primary.http_url, auth_token=token, prefix=prefix)
                else:
                    t = cls(f"{tmp}/{prefix}.db", auth_token=token, sync_url=primary.http_url, prefix=prefix)
                claim, ack = measure(t)
                rows.append((profile, name, claim, ack))
    print(f"\n{MESSAGES} claim+ack, one process, sqld 0.24.32 on loopback, medians\n")
    print(f"{'profile':8} {'transport':28} {'claim ms':>9} {'ack ms':>8}")
    for profile, name, claim, ack in rows:
        print(f"{profile:8} {name:28} {claim:9.2f} {ack:8.2f}")
    for profile in ("sqld", "replica"):
        h, e = [r for r in rows if r[0] == profile]
        print(f"{profile}: one statement is {(h[2] + h[3]) / (e[2] + e[3]):.1f}x faster per claim+ack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
