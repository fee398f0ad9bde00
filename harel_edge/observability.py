"""Logs and metrics: what an operator watching a fleet of edge workers reads and scrapes.

Imports nothing of harel_edge but the scrubber and the logs, so every layer may count;
design: docs/observability.md.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, start_http_server

# Re-exported: the logs live in harel_edge.logs, which a command configures without prometheus.

# ---- metrics -----------------------------------------------------------------------------

CLAIMS = Counter("harel_edge_claims", "Messages leased by this process's transport.")
ACKS = Counter("harel_edge_acks", "Messages acknowledged (removed) after being handled.")
NACKS = Counter("harel_edge_nacks", "Messages given back (at once, or parked for a delay).")
LOST_LEASES = Counter(
    "harel_edge_lost_leases",
    "Acks or nacks refused because the lease had lapsed and another worker held the message.",
    ["operation"],
)
RETRIES = Counter(
    "harel_edge_retries", "Attempts that failed with a transient error and were retried.", ["operation"]
)
SYNC_FAILURES = Counter("harel_edge_sync_failures", "Replica syncs with the primary that failed.")
LAST_SYNC = Gauge(
    "harel_edge_replica_last_sync_timestamp_seconds",
    "Unix time of this replica's last successful sync with the primary (0: never).",
)
SYNC_LAG = Gauge(
    "harel_edge_replica_sync_lag_seconds",
    "Seconds since this replica last caught up with the primary: how stale its reads may be.",
)
QUEUE_DEPTH = Gauge(
    "harel_edge_queue_depth",
    "Messages in the queue, by priority and state (ready, in_flight, parked), as last sampled.",
    ["priority", "state"],
)
HELD_BACK = Gauge(
    "harel_edge_held_back_groups",
    "Groups with a message waiting that no worker may claim yet, by why: behind a head that waits "
    "for its time (reason=waiting_head: delayed, debounced or parked) or a key at its limit "
    "(reason=limit), as last sampled.",
    ["reason"],
)
WORKFLOW_STEPS = Counter(
    "harel_edge_workflow_steps",
    "Durable-workflow steps recorded by this process (step, transact or sleep deadline).",
    ["namespace", "kind"],
)
WORKFLOW_PASSES = Counter(
    "harel_edge_workflow_passes",
    "Durable-workflow passes run by this process, by how they ended.",
    ["namespace", "outcome"],
)
EVENTS_HANDLED = Counter(
    "harel_edge_events_handled",
    "Statechart events this process's worker handled (acked after processing, or dropped as "
    "duplicates or for unknown executions).",
)

DEAD_LETTERED = Counter(
    "harel_edge_dead_lettered",
    "Messages (kind=message) and durable workflows (kind=workflow) this process moved to the "
    "dead-letter table after too many failed deliveries or passes.",
    ["kind"],
)
DEAD_LETTERS = Gauge(
    "harel_edge_dead_letters",
    "Entries in the dead-letter table, by kind, as last sampled.",
    ["kind"],
)
WINDOW = Gauge(
    "harel_edge_window_events",
    "Statechart events this worker aims to keep in flight (it follows the link to the primary).",
)
EVENT_LATENCY = Gauge(
    "harel_edge_event_latency_seconds",
    "Seconds from an event's hand-out to its ack: the running value (kind=recent) and the fastest "
    "of the last seconds (kind=base), whose gap says how much events queue.",
    ["kind"],
)


def watch_window(window) -> None:  # noqa: ANN001 - harel_edge.window.InFlightWindow (a later layer)
    """Publish a worker's window as gauges read when they are scraped: setting them at every
    event cost the worker's loop 13 us an event."""
    WINDOW.set_function(lambda: window.size)
    EVENT_LATENCY.labels("recent").set_function(lambda: window.latency or 0.0)
    EVENT_LATENCY.labels("base").set_function(lambda: window.base or 0.0)


def record_retry(operation: str) -> None:
    RETRIES.labels(operation).inc()


def record_lost_lease(operation: str) -> None:
    LOST_LEASES.labels(operation).inc()


_last_sync: float | None = None


def record_sync(ok: bool, at: float | None = None) -> None:
    """Count a sync; on success, the replica is fresh as of `at` (default: now)."""
    global _last_sync
    if ok:
        _last_sync = at if at is not None else time.time()
        LAST_SYNC.set(_last_sync)
        SYNC_LAG.set(0.0)
    else:
        SYNC_FAILURES.inc()


def refresh_sync_lag(now: float | None = None) -> float | None:
    """Recompute the lag gauge from the last successful sync; None if there was none."""
    if _last_sync is None:
        return None
    lag = max(0.0, (now if now is not None else time.time()) - _last_sync)
    SYNC_LAG.set(lag)
    return lag


def serve_metrics(port: int, addr: str = "127.0.0.1") -> None:
    """Serve /metrics on `addr:port` from a daemon thread (prometheus-client's own server).

    Loopback by default: a worker opens a port to the network only when told to.
    """
    start_http_server(port, addr=addr)
