"""What `harel-edge status` reports: the queue, the workers, the workflows, the dead letters and the replica,
read through one `execute(sql, params)` and never written."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from harel_edge import schema
from harel_edge.access import open_for_reading
from harel_edge.errors import SchemaError
from harel_edge.heartbeats import WorkerSeen, workers_seen
from harel_edge.inspection import (
    Execute,
    check_usable,
    database_facts,
    inspect_file,
    last_sync_of_replica_file,
    open_read_only,
    runner,
)
from harel_edge.limits import list_limits
from harel_edge.schema import EdgeNames, lease_state, now_table, table_exists
from harel_edge.schema_flow import FlowNames
from harel_edge.settings import EdgeSettings

# ---- the queue ---------------------------------------------------------------------------------


def _created_epoch(column: str) -> str:
    """A message's `created_time` (stamped by `harel-edge publish` and the demo; harel's own
    publishes leave it null) as epoch seconds, in SQL every SQLite version understands."""
    return f"((julianday(json_extract({column}, '$.created_time')) - 2440587.5) * 86400.0)"


def queue_status(execute: Execute, prefix: str, top: int = 10) -> dict[str, Any]:
    """Depth by priority and routing key, the deepest groups, in flight, parked, the oldest message."""
    n = EdgeNames(prefix)
    state = lease_state("m", "t.now")
    clock = now_table()
    rows = execute(
        f"SELECT g.priority, g.routing_key, count(DISTINCT g.group_id), count(*),"
        f" sum(s = 'queued'), sum(s = 'in_flight'), sum(s = 'parked')"
        f" FROM (SELECT m.group_id, {state} AS s FROM {n.messages} m, {clock}) AS x"
        f" JOIN {n.groups} g ON g.group_id = x.group_id"
        f" GROUP BY g.priority, g.routing_key ORDER BY g.priority DESC, g.routing_key"
    )
    by_key = [
        {
            "priority": int(p),
            "routing_key": rk,
            "groups": int(groups),
            "messages": int(msgs),
            "queued": int(q or 0),
            "in_flight": int(f or 0),
            "parked": int(pk or 0),
        }
        for p, rk, groups, msgs, q, f, pk in rows
    ]
    groups = execute(
        f"SELECT g.group_id, g.priority, g.routing_key, count(*),"
        f" (SELECT {state} FROM {n.messages} m, {clock} WHERE m.group_id = g.group_id ORDER BY m.seq LIMIT 1)"
        f" FROM {n.groups} g JOIN {n.messages} mm ON mm.group_id = g.group_id"
        f" GROUP BY g.group_id ORDER BY count(*) DESC, g.group_id LIMIT ?",
        (top,),
    )
    deepest = [
        {"group_id": g, "priority": int(p), "routing_key": rk, "messages": int(c), "head": head}
        for g, p, rk, c, head in groups
    ]
    ((now, oldest_seq, oldest_group, stamped),) = execute(
        f"SELECT t.now, m.seq, m.group_id, (SELECT min({_created_epoch('event')}) FROM {n.messages})"
        f" FROM {clock} LEFT JOIN {n.messages} m ON m.seq = (SELECT min(seq) FROM {n.messages})"
    )
    totals = {
        k: sum(row[k] for row in by_key) for k in ("messages", "queued", "in_flight", "parked", "groups")
    }
    return {
        "database_now": now,
        "totals": totals,
        "by_priority_and_routing_key": by_key,
        "deepest_groups": deepest,
        "oldest": {
            "seq": oldest_seq,
            "group_id": oldest_group,
            # from created_time, where the publisher stamped it; None when none did
            "age_seconds": None if stamped is None else max(0.0, now - stamped),
        },
    }


def flow_status(execute: Execute, prefix: str) -> dict[str, Any]:
    """What holds work back: groups whose head waits for its time (a delayed, debounced or parked
    message holds its group), and each limited key against its limits (docs/flow-control.md)."""
    n = EdgeNames(prefix)
    ((waiting, next_due),) = execute(
        f"SELECT count(*), min(m.lock_expiry) - t.now FROM {n.messages} m, {now_table()}"
        f" WHERE m.seq IN (SELECT min(seq) FROM {n.messages} GROUP BY group_id)"
        f" AND {lease_state('m', 't.now')} = 'parked'"
    )
    limits = list_limits(execute, prefix) if table_exists(execute, FlowNames(prefix).limits) else []
    return {
        "groups_waiting_for_their_head": int(waiting),
        "next_due_in_seconds": None if next_due is None else max(0.0, float(next_due)),
        "limits": [limit.as_dict() for limit in limits],
        "groups_held_by_limits": sum(limit.waiting for limit in limits),
    }


def workflow_status(execute: Execute) -> dict[str, Any]:
    """Durable workflows: ready, sleeping and claimed per namespace, finished overall."""
    clock = now_table()
    live = "c.held_until > t.now AND c.alive_until > t.now"
    rows = execute(
        f"SELECT q.namespace,"
        f" sum(q.visible_at <= t.now),"
        f" sum(q.visible_at > t.now AND NOT EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = q.workflow AND {live})),"
        f" sum(EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = q.workflow AND {live})),"
        f" min(CASE WHEN q.visible_at > t.now THEN q.visible_at - t.now END)"
        f" FROM workflow_queue q, {clock} GROUP BY q.namespace ORDER BY q.namespace"
    )
    namespaces = [
        {
            "namespace": ns,
            "ready": int(ready or 0),
            "sleeping": int(sleeping or 0),
            "claimed": int(claimed or 0),
            "next_wake_in_seconds": wake,
        }
        for ns, ready, sleeping, claimed, wake in rows
    ]
    failing = "(SELECT count(*) FROM workflow_queue WHERE failures > 0)" if _has_failures(execute) else "0"
    ((claimed_total, finished, failed),) = execute(
        f"SELECT (SELECT count(*) FROM workflow_claim c, {clock} WHERE {live}),"
        f" (SELECT count(*) FROM workflow_checkpoint WHERE step = '$result'), {failing}"
    )
    return {"namespaces": namespaces, "claimed": int(claimed_total), "finished": int(finished), "failing": int(failed)}


def _has_failures(execute: Execute) -> bool:
    """Whether the scheduler's queue counts failed passes (schema version 6 on)."""
    return any(row[1] == "failures" for row in execute("PRAGMA table_info(workflow_queue)"))


def dead_letter_status(execute: Execute, prefix: str) -> dict[str, Any]:
    """How many dead letters there are, of each kind: one read of a table that stays small."""
    rows = execute(
        f"SELECT sum(kind = 'message'), sum(kind = 'workflow'), min(dead_at) FROM {schema.dead_letters_table(prefix)}"
    )
    messages, workflows, oldest = rows[0] if rows else (0, 0, None)
    return {"messages": int(messages or 0), "workflows": int(workflows or 0), "oldest_at": oldest}


@dataclass
class ReplicaStatus:
    """A replica's file: when it last synced here, and what it sees locally against the primary."""

    file: str
    last_sync_at: str | None
    lag_seconds: float | None
    messages_on_primary: int = 0
    messages_seen_locally: int | None = None  # None: no file with our tables here yet

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "file": self.file,
            "last_sync_at": self.last_sync_at,
            "lag_seconds": self.lag_seconds,
        }
        if self.messages_seen_locally is not None:
            values["messages_seen_locally"] = self.messages_seen_locally
        values["messages_on_primary"] = self.messages_on_primary
        return values


@dataclass
class StatusReport:
    """Everything `harel-edge status` shows; the sections are the dicts of the functions above."""

    profile: str
    where: str
    schema_version: int
    queue: dict[str, Any]
    workflows: dict[str, Any] | None = None  # None: no durable workflow tables
    dead_letters: dict[str, Any] | None = None  # None: no dead-letter table
    replica: ReplicaStatus | None = None
    executions: dict[str, int] | None = None  # executions by status (lower case); None: no table
    flow: dict[str, Any] | None = None  # what holds work back (`flow_status`)
    workers: list[WorkerSeen] = field(default_factory=list)  # each worker's last heartbeat

    def as_dict(self) -> dict[str, Any]:
        """The --json output: absent sections are left out, not null."""
        values: dict[str, Any] = {
            "profile": self.profile,
            "where": self.where,
            "schema_version": self.schema_version,
            "queue": self.queue,
        }
        if self.flow is not None:
            values["flow"] = self.flow
        values["workers"] = [worker.as_dict() for worker in self.workers]
        if self.workflows is not None:
            values["workflows"] = self.workflows
        if self.dead_letters is not None:
            values["dead_letters"] = self.dead_letters
        if self.executions is not None:
            values["executions"] = self.executions
        if self.replica is not None:
            values["replica"] = self.replica.as_dict()
        return values


def collect_status(settings: EdgeSettings, top: int = 10) -> StatusReport:
    """The queue, workflows, dead letters and a replica's lag, with reads only (a read-only
    token is enough); raises SchemaError when there are no harel_edge tables to report on."""

    replica: ReplicaStatus | None = None
    if settings.syncs:
        last = last_sync_of_replica_file(settings.db_path)
        replica = ReplicaStatus(
            settings.db_path,
            None if last is None else datetime.fromtimestamp(last, UTC).isoformat(),
            None if last is None else max(0.0, time.time() - last),
        )
        local = inspect_file(settings.db_path)
        if local.exists and local.has_schema(settings.prefix):
            connection = open_read_only(settings.db_path)
            try:
                local_queue = queue_status(runner(connection), settings.prefix, top=0)
                replica.messages_seen_locally = local_queue["totals"]["messages"]
            finally:
                connection.close()
    reader = open_for_reading(settings)
    try:
        facts = database_facts(reader.execute)
        check_usable(facts, settings.prefix, reader.where)
        if not facts.has_schema(settings.prefix):
            raise SchemaError(
                f"{reader.where} has no harel_edge tables with prefix {settings.prefix!r}: run `harel-edge migrate` "
                "or start a worker (or set HAREL_EDGE_PREFIX to the prefix the workers use)"
            )
        report = StatusReport(
            settings.profile,
            settings.server or settings.db_path,
            facts.user_version,
            queue_status(reader.execute, settings.prefix, top=top),
            flow=flow_status(reader.execute, settings.prefix),
            workers=workers_seen(reader.execute, settings.prefix),
        )
        if "workflow_queue" in facts.tables:
            report.workflows = workflow_status(reader.execute)
        if schema.dead_letters_table(settings.prefix) in facts.tables:
            report.dead_letters = dead_letter_status(reader.execute, settings.prefix)
        if f"{settings.prefix}_executions" in facts.tables:
            rows = reader.execute(
                f"SELECT json_extract(data, '$.status'), count(*) FROM {settings.prefix}_executions GROUP BY 1"
            )
            report.executions = {str(status).lower(): int(count) for status, count in rows}
    finally:
        reader.close()
    if replica is not None:
        replica.messages_on_primary = report.queue["totals"]["messages"]
        report.replica = replica
    return report


def settings_summary(settings: EdgeSettings) -> str:
    where = settings.server or settings.db_path
    return f"profile {settings.profile} at {where}"
