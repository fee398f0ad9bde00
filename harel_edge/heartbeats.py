"""Workers' heartbeats on the primary (their table: schema version 9): each worker writes one row every few
seconds, so `status` shows who is running, what each settled so far and how its link behaves,
and `status --watch` derives the rate of settled work from the counts, at no cost per event."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from harel_edge.schema import DB_NOW, EdgeNames, Execute, table_exists

FORGET_AFTER = 86_400.0  # a worker not seen for a day leaves the table
SILENT_AFTER = 10.0  # the least silence that marks a worker silent, whatever its period


@dataclass(frozen=True)
class Vitals:
    """What a worker reports in a heartbeat: events and workflow passes settled since it started,
    the window it aims for, an event's recent latency, and its replica's lag (None: no replica)."""

    settled: int = 0
    in_flight_target: int | None = None
    latency: float | None = None
    replica_lag: float | None = None


def beat_statements(
    prefix: str,
    worker: tuple[str, str, str, int],
    every: float,
    vitals: Vitals,
    *,
    stopped: bool = False,
    forget: bool = False,
) -> list[tuple[str, tuple]]:
    """The statements that record that `worker` (worker_id, profile, host, pid) is alive now, by
    the primary's clock, run as one unit; `stopped` marks a clean stop; `forget` (a worker's first
    beat) also deletes the workers not seen for a day, in the same request."""
    table = EdgeNames(prefix).workers
    worker_id, profile, host, pid = worker
    statements = [(
        f"INSERT INTO {table} (worker_id, profile, host, pid, started_at, seen_at, every, stopped_at, settled,"
        f" in_flight_target, latency, replica_lag) VALUES (?1, ?2, ?3, ?4, {DB_NOW}, {DB_NOW}, ?5,"
        f" CASE WHEN ?6 THEN {DB_NOW} END, ?7, ?8, ?9, ?10)"
        " ON CONFLICT (worker_id) DO UPDATE SET"
        # The same id from a new process (a restart) starts its record again.
        " started_at = CASE WHEN pid = excluded.pid AND host = excluded.host AND stopped_at IS NULL"
        " THEN started_at ELSE excluded.started_at END,"
        " profile = excluded.profile, host = excluded.host, pid = excluded.pid, seen_at = excluded.seen_at,"
        " every = excluded.every, stopped_at = excluded.stopped_at, settled = excluded.settled,"
        " in_flight_target = excluded.in_flight_target, latency = excluded.latency,"
        " replica_lag = excluded.replica_lag",
        (worker_id, profile, host, pid, every, int(stopped), vitals.settled, vitals.in_flight_target,
         vitals.latency, vitals.replica_lag),
    )]
    if forget:
        statements.append((f"DELETE FROM {table} WHERE seen_at < {DB_NOW} - {FORGET_AFTER}", ()))
    return statements


@dataclass(frozen=True)
class WorkerSeen:
    """A worker as its last heartbeat left it; `state` is running, stopped or silent (no beat
    for three of its periods, and at least `SILENT_AFTER` seconds: killed, hung or cut off)."""

    worker_id: str
    profile: str
    host: str
    pid: int
    state: str
    seen_seconds_ago: float
    up_seconds: float
    settled: int
    in_flight_target: int | None
    latency: float | None
    replica_lag: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def workers_seen(execute: Execute, prefix: str) -> list[WorkerSeen]:
    """Every worker heard from in the last day, by worker id; none before schema version 9."""
    table = EdgeNames(prefix).workers
    if not table_exists(execute, table):
        return []
    rows = execute(
        f"SELECT worker_id, profile, host, pid, CASE WHEN stopped_at IS NOT NULL THEN 'stopped'"
        f" WHEN t.now - seen_at > max(3 * every, {SILENT_AFTER}) THEN 'silent' ELSE 'running' END,"
        f" max(t.now - seen_at, 0), COALESCE(stopped_at, seen_at) - started_at, settled, in_flight_target,"
        f" latency, replica_lag FROM {table}, (SELECT {DB_NOW} AS now) AS t ORDER BY worker_id",
        (),
    )
    return [
        WorkerSeen(str(w), str(p), str(h), int(pid), str(s), float(ago), float(up), int(n), target, latency, lag)
        for w, p, h, pid, s, ago, up, n, target, latency, lag in rows
    ]
