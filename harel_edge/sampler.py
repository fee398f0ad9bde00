"""What a worker samples every few seconds: the queue, held-back work and dead letters for its
metrics (read on the primary), whether its embedded replica keeps syncing in the background, and
its heartbeat (written on the primary, for `status`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from harel_edge import heartbeats, observability
from harel_edge.executor import Stmt
from harel_edge.inspection import last_sync_of_replica_file
from harel_edge.loop_thread import blocking_execute
from harel_edge.settings import EdgeSettings
from harel_edge.status import dead_letter_status, flow_status, queue_status

log = structlog.get_logger("harel_edge.worker")


def _record_depth(summary: dict) -> None:
    observability.QUEUE_DEPTH.clear()
    for row in summary["by_priority_and_routing_key"]:
        for state in ("queued", "in_flight", "parked"):
            observability.QUEUE_DEPTH.labels(str(row["priority"]), state).inc(row[state])


def _record_flow(flow: dict) -> None:
    observability.HELD_BACK.labels("waiting_head").set(flow["groups_waiting_for_their_head"])
    observability.HELD_BACK.labels("limit").set(flow["groups_held_by_limits"])


def _record_dead(dead: dict) -> None:
    observability.DEAD_LETTERS.labels("message").set(dead["messages"])
    observability.DEAD_LETTERS.labels("workflow").set(dead["workflows"])


# What the sampler reads on the primary (read, execute, prefix) and which metrics it sets from it.
SAMPLES = (
    ("queue", functools.partial(queue_status, top=0), _record_depth),
    ("flow", flow_status, _record_flow),
    ("dead-letter", dead_letter_status, _record_dead),
)


class ReplicaWatch:
    """Whether the embedded replica synced lately, from the file libsql rewrites after each
    successful sync (its background syncs included): the sampler never calls `sync()`, which
    holds the GIL, and so the worker's loop, for as long as it takes."""

    def __init__(self, path: str, interval: float, every: float) -> None:
        self.path = path
        self.stale_after = 2 * interval + every  # two missed syncs and a sample
        self.seen: float | None = None

    def check(self) -> float | None:
        """Record the replica's freshness; return its lag in seconds (None: it never synced)."""
        last = last_sync_of_replica_file(self.path)
        if last is not None and (self.seen is None or last > self.seen):
            self.seen = last
            observability.record_sync(True, at=last)
        elif last is None or time.time() - last > self.stale_after:
            observability.record_sync(False)
            since = "never" if last is None else f"{time.time() - last:.1f} s ago"
            log.warning("sync failed", where="worker", error=f"the replica last synced {since}; is the primary reachable?")
        return observability.refresh_sync_lag()


def identity(settings: EdgeSettings) -> tuple[str, str, str, int]:
    """Who a heartbeat is from: worker id, profile, host and process id."""
    return settings.worker_id, settings.profile, socket.gethostname(), os.getpid()


async def send_heartbeat(
    executor: Any,
    settings: EdgeSettings,
    every: float,
    vitals: heartbeats.Vitals,
    *,
    stopped: bool = False,
    forget: bool = False,
) -> None:
    """One heartbeat on the primary, through the executor (one request); a failure is logged, never raised."""
    statements = heartbeats.beat_statements(
        settings.prefix, identity(settings), every, vitals, stopped=stopped, forget=forget
    )
    try:
        await executor.transaction([Stmt(sql, params) for sql, params in statements])
    except Exception as exc:  # noqa: BLE001 - a missed beat shows as a silent worker, nothing worse
        log.debug("heartbeat failed", error=str(exc)[:200])


async def sample_metrics(
    replica_open: Callable[[], bool] | None,
    executor: Any,
    settings: EdgeSettings,
    every: float,
    stop: asyncio.Event,
    vitals: Callable[[float | None], heartbeats.Vitals],
    *,
    queue: bool = True,
) -> None:
    """Every `every` seconds: the worker's heartbeat (`vitals(replica_lag)`), with `queue` the
    queue's depth and the rest for the metrics (read on the primary through the executor), and
    the embedded replica's freshness while `replica_open()` (a deployment closes an idle one)."""
    execute = blocking_execute(executor, asyncio.get_running_loop())
    watch = None if replica_open is None else ReplicaWatch(settings.db_path, settings.sync_interval or every, every)
    first = True
    while not stop.is_set():
        lag = watch.check() if watch is not None and replica_open() else None
        await send_heartbeat(executor, settings, every, vitals(lag), forget=first)
        first = False
        for name, read, record in SAMPLES if queue else ():
            try:
                record(await asyncio.to_thread(read, execute, settings.prefix))
            except Exception as exc:  # noqa: BLE001 - sampling is best effort
                log.debug(f"{name} sample failed", error=str(exc)[:200])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
