"""Edge worker processes for the end-to-end tests (the compose files run `harel-edge worker`).

Why a module of its own: worker processes are started with the 'spawn' method (a libsql
connection must not cross a fork), so what they run has to be importable by name in a fresh
interpreter; the same loop also runs as a plain host process (`python tests/e2e/_workers.py`),
configured by HAREL_EDGE_* variables only.

The loop is the simplest honest worker: claim, process, ack, through
`harel_edge.LibsqlTransport` on whatever profile the settings describe.

What it writes down, and where. Around the processing of every message the worker inserts a
'start' row (after the claim returned) and an 'end' row (before the ack is sent) into
`e2e_log` ON THE PRIMARY, through a remote connection of its own:

- one clock and one order for every worker: the row's `id` is the primary's commit order and
  `at` the primary's clock, so per-group FIFO and "never two of a group in flight" are read off
  a single sequence, with no merge of per-process files and no trust in the workers' clocks;
- the observer does not share the path under test: on the replica profile the transport's
  writes go through the embedded replica's write delegation, the log's do not, so a fault in
  that path cannot also corrupt the evidence about it;
- each row checks the lease in the same statement: `claimed_at` is the lease's start by the
  primary's clock (its `lock_expiry` minus the visibility) and `held` says whether the primary
  still had the message leased to this claim's token when the row was written.

The [start, end] window is inside the true claim-to-ack interval, so windows of one group
that overlap prove a violation, and windows that never overlap are what the workers' handlers
actually saw.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harel.engine.schema import Names  # noqa: E402
from harel.engine.transport import Lease  # noqa: E402

from harel_edge import retry  # noqa: E402
from harel_edge.connection import EdgeConnection  # noqa: E402
from harel_edge.migration import migrate  # noqa: E402
from harel_edge.queue import LibsqlTransport  # noqa: E402
from harel_edge.settings import EdgeSettings, ExplicitSettings  # noqa: E402
from harel_edge.sync_sql import Statements

LOG_TABLE = "e2e_log"
# A worker with nothing to claim looks again after this long: an idle poll, not a wait for
# readiness. Short in the tests, which measure how fast the queue drains; longer for the
# long-running host worker, whose every empty claim is a write sent to the primary.
IDLE_POLL = 0.01
HOST_IDLE_POLL = 0.2


def log_schema() -> list[str]:
    """The log table, created on the primary by whoever comes first (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {LOG_TABLE} ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " worker TEXT NOT NULL,"
        " kind TEXT NOT NULL,"  # 'start' | 'end' | 'lost'
        " seq INTEGER NOT NULL,"
        " group_id TEXT NOT NULL,"
        " message TEXT NOT NULL,"  # the published event's id
        " token TEXT,"
        " claimed_at REAL,"
        " held INTEGER,"
        " at REAL NOT NULL DEFAULT (unixepoch('subsec')))"
    ]


def log_settings(settings: EdgeSettings) -> EdgeSettings:
    """A remote (sqld profile) connection to the primary the worker's settings point at."""
    return ExplicitSettings.load(
        profile="sqld",
        url=settings.server,
        auth_token=settings.auth_token,
        prefix=settings.prefix,
        retry_deadline=settings.retry_deadline,
    )


class PrimaryLog:
    """The worker's notes on the primary; see the module docstring for why there."""

    def __init__(self, settings: EdgeSettings, worker: str, visibility: float) -> None:
        self.worker = worker
        self.visibility = visibility
        self._messages = Names(settings.prefix).messages
        self._groups = Names(settings.prefix).groups
        self._conn = Statements(log_settings(settings))
        for statement in log_schema():
            self._conn.execute(statement)

    def record(self, kind: str, lease: Lease) -> None:
        # Under the retry policy like any write: sqld answers SQLITE_BUSY when four workers
        # contend for its write lock (a refusal before anything was written, so no duplicate).
        retry.call_with_retry(self._conn.settings, "log", lambda: self._record(kind, lease))

    def _record(self, kind: str, lease: Lease) -> None:
        self._conn.execute(
            f"INSERT INTO {LOG_TABLE} (worker, kind, seq, group_id, message, token, claimed_at, held)"
            f" VALUES (?, ?, ?, ?, ?, ?,"
            f" (SELECT lock_expiry - ? FROM {self._messages} WHERE seq = ? AND locked_by = ?),"
            f" EXISTS (SELECT 1 FROM {self._messages} WHERE seq = ? AND locked_by = ?))",
            (
                self.worker, kind, lease.seq, lease.group_id, lease.event.id, lease.token,
                self.visibility, lease.seq, lease.token,
                lease.seq, lease.token,
            ),
        )  # fmt: skip

    def remaining(self, routing_keys: Sequence[str], min_priority: int) -> int:
        """Messages on the primary this worker could ever claim, in flight ones included."""
        routing = f" AND g.routing_key IN ({', '.join('?' * len(routing_keys))})" if routing_keys else ""
        rows = self._conn.execute(
            f"SELECT count(*) FROM {self._messages} m JOIN {self._groups} g ON g.group_id = m.group_id"
            f" WHERE g.priority >= ?{routing}",
            (min_priority, *routing_keys),
        )
        return int(rows[0][0])

    def close(self) -> None:
        self._conn.close()


LOG_COLUMNS = "id, worker, kind, seq, group_id, message, claimed_at, held, at"


def read_log(conn: EdgeConnection) -> list[tuple]:
    """The whole log in the primary's commit order, as `LOG_COLUMNS`."""
    return conn.execute(f"SELECT {LOG_COLUMNS} FROM {LOG_TABLE} ORDER BY id")


def replay_log(rows: list[tuple], published: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """What the log shows about `published` (event id -> (group, index in the group)).

    duplicates: extra starts of a message; lost: messages never started or never ended;
    unknown: started messages nobody published; overlaps: starts of a group while one of its
    windows was open; out_of_order_groups: groups whose messages started out of publish order;
    unheld: rows written while the primary did not have the message leased to that claim;
    fairness_spread: the largest gap, at any point, between the groups with the most and the
    fewest completed messages; first_group_done_at: completions before the first group drained.
    """
    groups = {group for group, _ in published.values()}
    starts: dict[str, int] = dict.fromkeys(published, 0)
    ends: dict[str, int] = dict.fromkeys(published, 0)
    unknown = 0
    open_by_group: dict[str, str] = {}
    overlaps = 0
    order: dict[str, list[int]] = {group: [] for group in groups}
    completed = dict.fromkeys(groups, 0)
    remaining = {group: sum(1 for g, _ in published.values() if g == group) for group in groups}
    spread, done_at, total_done = 0, None, 0
    for _id, _worker, kind, _seq, group_id, message, _claimed_at, _held, _at in rows:
        if message not in published:
            unknown += kind == "start"
            continue
        if kind == "start":
            starts[message] += 1
            overlaps += group_id in open_by_group
            open_by_group[group_id] = message
            order[group_id].append(published[message][1])
        elif kind == "end":
            ends[message] += 1
            if open_by_group.get(group_id) == message:
                del open_by_group[group_id]
            completed[group_id] += 1
            total_done += 1
            spread = max(spread, max(completed.values()) - min(completed.values()))
            remaining[group_id] -= 1
            if remaining[group_id] == 0 and done_at is None:
                done_at = total_done
    return {
        "duplicates": sum(n - 1 for n in starts.values() if n > 1),
        "lost": sum(1 for m in published if starts[m] == 0 or ends[m] == 0),
        "unknown": unknown,
        "overlaps": overlaps,
        "out_of_order_groups": sorted(g for g, seen in order.items() if seen != sorted(seen)),
        "unheld": sum(1 for row in rows if row[1] and row[2] in ("start", "end") and row[7] != 1),
        "fairness_spread": spread,
        "first_group_done_at": done_at,
    }


def process(lease: Lease) -> int:
    """The handler: a little real work on the payload (its result is not kept)."""
    return len(json.dumps(lease.event.data, sort_keys=True))


def drain(
    transport: LibsqlTransport,
    log: PrimaryLog,
    *,
    worker: str,
    visibility: float,
    routing_keys: Sequence[str] = (),
    min_priority: int = 0,
    until_drained: bool = True,
    stop: Any = None,
    idle_poll: float = IDLE_POLL,
) -> dict[str, Any]:
    """Claim, process and ack until nothing this worker may claim is left on the primary
    (`until_drained`), or until `stop()` is true. Returns counts and timings."""
    counts = {"claimed": 0, "acked": 0, "lost": 0, "empty_claims": 0}
    claim_seconds: list[float] = []
    ack_seconds: list[float] = []
    log_seconds: list[float] = []
    began = time.monotonic()
    while not (stop is not None and stop()):
        asked = time.perf_counter()
        lease = transport.claim(worker, visibility, min_priority, routing_keys)
        if lease is None:
            counts["empty_claims"] += 1
            if until_drained and log.remaining(routing_keys, min_priority) == 0:
                break
            time.sleep(idle_poll)
            continue
        claimed = time.perf_counter()
        claim_seconds.append(claimed - asked)
        counts["claimed"] += 1
        log.record("start", lease)
        process(lease)
        log.record("end", lease)
        logged = time.perf_counter()
        log_seconds.append(logged - claimed)
        if transport.ack(lease):
            counts["acked"] += 1
        else:
            counts["lost"] += 1
            log.record("lost", lease)
        ack_seconds.append(time.perf_counter() - logged)
    return {
        "worker": worker,
        **counts,
        "seconds": time.monotonic() - began,
        "claim_p50_ms": _p50_ms(claim_seconds),
        "ack_p50_ms": _p50_ms(ack_seconds),
        "log_p50_ms": _p50_ms(log_seconds),  # both log rows and the handler
    }


def _p50_ms(samples: list[float]) -> float | None:
    return round(1000 * sorted(samples)[len(samples) // 2], 2) if samples else None


# --------------------------------------------------------------------------- spawn targets


def _settings(config: dict[str, Any]) -> EdgeSettings:
    return ExplicitSettings.load(**config)


def drain_process(config: dict[str, Any], spec: dict[str, Any], barrier: Any, results: Any) -> None:
    """A worker process of test_claim_serialization: open its own replica (or remote connection)
    and the log, wait for every worker to be ready, drain, report."""
    worker = spec["worker"]
    try:
        transport = LibsqlTransport.from_settings(_settings(config))
        log = PrimaryLog(transport.settings, worker, spec["visibility"])
        barrier.wait(timeout=120)
        summary = drain(
            transport,
            log,
            worker=worker,
            visibility=spec["visibility"],
            routing_keys=tuple(spec.get("routing_keys", ())),
            min_priority=spec.get("min_priority", 0),
        )
        log.close()
        transport.close()
        results.put(summary)
    except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
        barrier.abort()
        results.put({"worker": worker, "error": traceback.format_exc()})


def upgrading_process(
    config: dict[str, Any],
    spec: dict[str, Any],
    barrier: Any,
    routed_published: Any,
    results: Any,
) -> None:
    """A worker process of test_routing_migration: open the replica, then start harel_edge's
    transport on the old database at the same moment as its peer (the barrier), drain the old
    messages, then, once routed messages are published, drain those of its routing key (with
    `spec["path"] == "event"`, through the event path)."""
    worker = spec["worker"]
    try:
        settings = _settings(config)
        replica = EdgeConnection(settings)
        log = PrimaryLog(settings, worker, spec["visibility"])
        barrier.wait(timeout=120)
        started = time.time()
        migrate(settings)  # the schema step, as `harel-edge migrate` runs it
        transport = LibsqlTransport(settings=settings, create_schema=False)
        results.put(
            {"worker": worker, "phase": "started", "at": started}
        )
        old = drain(transport, log, worker=worker, visibility=spec["visibility"])
        results.put({"worker": worker, "phase": "old", **old})
        if not routed_published.wait(timeout=120):
            raise TimeoutError("the test never published the routed messages")
        keys = tuple(spec["routing_keys"])
        routed = drain(transport, log, worker=worker, visibility=spec["visibility"], routing_keys=keys)
        results.put({"worker": worker, "phase": "routed", **routed})
        log.close()
        transport.close()
        replica.close()
    except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
        barrier.abort()
        results.put({"worker": worker, "phase": "error", "error": traceback.format_exc()})


# --------------------------------------------------------------------------- host process


def main() -> int:
    """A long-running edge worker configured by HAREL_EDGE_* variables: runs until SIGTERM/SIGINT.

    What `compose/run-workers.sh` starts next to the composed sqld until `harel_edge.worker`
    exists. It logs every message it processes to the primary (see the module docstring).
    """
    stopping: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    settings = EdgeSettings.load()
    if not os.environ.get("HAREL_EDGE_WORKER_ID"):
        # The default (hostname-pid) is the same in every container of a scaled service on the
        # host network: same hostname, pid 1. A suffix keeps the log's workers apart.
        settings = settings.model_copy(update={"worker_id": f"{settings.worker_id}-{secrets.token_hex(3)}"})
    transport = LibsqlTransport.from_settings(settings)
    log = PrimaryLog(settings, settings.worker_id, settings.visibility)
    print(f"worker {settings.worker_id}: {transport!r} ready", flush=True)
    summary = drain(
        transport,
        log,
        worker=settings.worker_id,
        visibility=settings.visibility,
        routing_keys=settings.routing_keys,
        until_drained=False,
        stop=lambda: bool(stopping),
        idle_poll=HOST_IDLE_POLL,
    )
    log.close()
    transport.close()
    print(f"worker {settings.worker_id}: stopped {json.dumps(summary)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
