"""Publishing: `Message`, each one checked and bound as the publish statement takes it, that
statement (many rows in one), how a publish tells what it queued, and the transport's publish."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harel.spec.states import Event

from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.schema import EdgeNames
from harel_edge.schema_flow import FlowNames

MAX_PRIORITY = 4
# Rows per multi-row INSERT of a batch publish: 14 parameters a row stays below SQLite's
# 32,766 bound variables, and one statement (a few hundred KB) stays one modest HTTP request.
BATCH_ROWS = 2000


@dataclass(frozen=True)
class Message:
    """One message of a batch publish."""

    group_id: str
    event: Event
    priority: int = 0
    routing_key: str | None = None
    limit_key: str | None = None  # the key its group's limits count under (default: routing_key)
    delay: float | None = None  # seconds from now, on the primary's clock, before it is claimable
    at: float | None = None  # or the unix time it becomes claimable
    debounce: float | None = None  # wait this long for a later publish of debounce_key to replace it
    debounce_key: str | None = None  # what a later publish replaces it by (default: the event's kind)
    max_wait: float | None = None  # and never past this long after the burst's first publish


def publish_statement(n: EdgeNames, chunk: list[tuple], now: float | None, keep_for: float, batch: str) -> Stmt:
    """One multi-row INSERT into the publish view for `chunk` (rows from `message_row`); its
    trigger skips an event id the group had within `keep_for` seconds. Plain `?`s: numbered
    ones cost the driver 114 ms instead of 20 for 2,000 rows."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
    sql = (
        f"INSERT INTO {FlowNames(n.prefix).publish_view} (group_id, event, priority, routing_key, event_id,"
        " limit_key, delay, at, debounce_key, debounce, max_wait, now, keep_for, batch)"
        f" VALUES {values}"
    )
    return Stmt(sql, tuple(value for row in chunk for value in (*row, now, keep_for, batch)))


def published_sql(n: EdgeNames) -> str:
    """The batch token recorded for (group_id, event_id): after an ambiguous publish, its own
    token means it landed (the batch is atomic); anything else, try again, which the view makes
    harmless for the rows that did land before."""
    return f"SELECT batch FROM {n.published} WHERE group_id = ? AND event_id = ?"


def queued_count_statement(n: EdgeNames, rows: list[tuple], batch: str) -> Stmt:
    """How many of `rows` (from `message_row`) the publish of `batch` queued: an id its group had
    keeps its older record. Each distinct (group, event id) is found by the table's primary key."""
    pairs = json.dumps(sorted({(row[0], row[4]) for row in rows}))
    return Stmt(
        f"SELECT count(*) FROM json_each(?) j JOIN {n.published} p ON p.group_id = json_extract(j.value, '$[0]')"
        " AND p.event_id = json_extract(j.value, '$[1]') WHERE p.batch = ?",
        (pairs, batch),
    )


def message_row(item: Message | tuple) -> tuple:
    """A message checked and as the publish statement binds it; refuses what cannot be queued."""
    message = item if isinstance(item, Message) else Message(*item)
    priority = message.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be a whole number from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not isinstance(message.group_id, str) or not message.group_id:
        raise ValueError(f"group_id must be a non-empty string, got {message.group_id!r}")
    refuse_nul(message.group_id, "group_id")
    refuse_nul(message.routing_key, "routing_key")
    for name, option, key in (("limit_key", "--limit-key", message.limit_key), ("debounce_key", "--debounce-key", message.debounce_key)):
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"{name} ({option}) must be a non-empty string, or not given, got {key!r}")
        refuse_nul(key, name)
    if not isinstance(message.event, Event):
        raise TypeError(f"event must be a harel Event, got {type(message.event).__name__}")
    refuse_non_finite(message.event.data)
    delay, at = _when(message.delay, message.at)
    debounce, max_wait = _debounce(message.debounce, message.max_wait, delay, at)
    if message.debounce_key is not None and debounce is None:
        raise ValueError("debounce_key (--debounce-key) names the burst a debounce replaces: give debounce (--debounce SECONDS) too")
    debounce_key = (message.debounce_key or message.event.kind) if debounce else None
    return (
        message.group_id,
        message.event.model_dump_json(),
        priority,
        message.routing_key,
        str(message.event.id),
        message.limit_key,
        delay,
        at,
        debounce_key,
        debounce,
        max_wait,
    )


def refuse_non_finite(value: object, where: str = "data") -> None:
    """JSON has no NaN or infinity: stored, they would become null. The data given is the data
    stored, or an error."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} holds {value!r}, which JSON cannot hold (it would be stored as null): give a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_non_finite(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            refuse_non_finite(item, f"{where}[{i}]")


def _debounce(
    debounce: float | None, max_wait: float | None, delay: float | None, at: float | None
) -> tuple[float | None, float | None]:
    """A publish's debounce period and longest wait, checked."""
    for name, value in (("debounce", debounce), ("max_wait", max_wait)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0
        ):
            raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
    if debounce is None and max_wait is not None:
        raise ValueError("max_wait bounds a debounce: give debounce=seconds too")
    if debounce is not None and (delay is not None or at is not None):
        raise ValueError("give debounce (a burst waits for its last publish) or delay/at, not both")
    return (None if debounce is None else float(debounce)), (None if max_wait is None else float(max_wait))


def _when(delay: float | None, at: float | None) -> tuple[float | None, float | None]:
    """A publish's delay and absolute time, checked: one or neither; a zero delay is none."""
    for name, value in (("delay", delay), ("at", at)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if delay is not None and at is not None:
        raise ValueError("give delay (seconds from now) or at (a unix time), not both")
    if delay is not None and delay < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
    return (float(delay) if delay else None), (None if at is None else float(at))


class Publishing:
    """The transport's publishes, on its `EventPath` (`path`)."""

    path: Any

    async def publish(
        self,
        group_id: str,
        event: Event,
        priority: int = 0,
        routing_key: str | None = None,
        **flow: Any,
    ) -> None:
        """Append `event` to `group_id`'s FIFO. The group's first publish fixes its priority,
        routing key and `limit_key` (the key its limits count under; default: the routing key);
        later ones keep what the group has. `delay` (seconds, on the primary's clock) or `at` (a
        unix time) keeps the message unclaimable until then, and `debounce`, `debounce_key` and
        `max_wait` debounce it: `Message`'s fields (docs/flow-control.md)."""
        await self.publish_many([Message(group_id, event, priority, routing_key, **flow)])

    async def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        """All or none, in order, each checked before anything is sent; one unit of work (one
        statement up to BATCH_ROWS messages). An event id its group had within `publish_window`
        is not queued again. Returns how many were queued (the rest were there already)."""
        rows = [message_row(item) for item in messages]
        if not rows:
            return 0
        q = self.path.queue
        now, window, batch = self.path.now(), self.path.settings.publish_window, secrets.token_hex(8)
        n = BATCH_ROWS  # read now: tests lower it
        stmts = [publish_statement(q, rows[i : i + n], now, window, batch) for i in range(0, len(rows), n)]
        counted = queued_count_statement(q, rows, batch)

        async def attempt() -> int:
            results = await self.path.executor.transaction([*stmts, counted])
            return int(results[-1].rows[0][0])

        async def resolve() -> int | None:
            found = await self.path.execute(published_sql(q), rows[0][0], rows[0][4])
            if not (found.rows and found.rows[0][0] == batch):
                return None
            return int((await self.path.executor.execute(counted)).rows[0][0])

        return await self.path.run("publish", attempt, resolve)
