"""LibsqlScheduler: which workflows want a pass, and when, as one row per workflow.

`visible_at` and a generation are each delivery's receipt, so a stale write changes nothing (docs/durable.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from harel_edge import retry
from harel_edge.durable.database import Database
from harel_edge.durable.types import LEASE, POLL, Delivery, to_seconds
from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.schema import QUEUE_BUMP, now_or, now_table
from harel_edge.schema_control import CANCELLED

# A wakeup bumps the generation even when it leaves the visibility as it was (already due, or
# asked for later than a worker's lease ends), so the pass out with a worker never drops it.
# A cancelled workflow is never queued.
_MAKE_READY = f"""
INSERT INTO workflow_queue (namespace, workflow, visible_at)
SELECT ?1, ?2, {now_or('?3')} WHERE NOT {CANCELLED.format(w="?2")}
ON CONFLICT (namespace, workflow) DO UPDATE SET
    visible_at = MIN(visible_at, excluded.visible_at), generation = {QUEUE_BUMP}
"""

_SCHEDULE = f"""
INSERT INTO workflow_queue (namespace, workflow, visible_at) SELECT ?1, ?2, ?3 WHERE NOT {CANCELLED.format(w="?2")}
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = excluded.visible_at, generation = {QUEUE_BUMP}
"""

_TAKE = f"""
UPDATE workflow_queue SET visible_at = t.now + ?2, generation = {QUEUE_BUMP}
FROM {now_table('?3')}
WHERE namespace = ?1 AND workflow IN (
    SELECT workflow FROM workflow_queue WHERE namespace = ?1 AND visible_at <= t.now
    ORDER BY visible_at LIMIT ?4)
RETURNING workflow, visible_at, generation
"""

# How long until the earliest row becomes visible, by the same clock the take uses.
_UNTIL_NEXT = f"SELECT MIN(visible_at) - t.now FROM workflow_queue, {now_table('?2')} WHERE namespace = ?1"

# The receipt: the visibility and the generation the delivery was given, both still the row's.
_HELD = "namespace = ?1 AND workflow = ?2 AND visible_at = ?3 AND generation = ?4"

# A pass that ends well (asleep) also clears the count of failed passes before it.
_WAKE_AT = f"UPDATE workflow_queue SET visible_at = ?5, failures = 0, last_error = NULL WHERE {_HELD}"

_EXTEND = f"""
UPDATE workflow_queue SET visible_at = t.now + ?5
FROM {now_table('?6')}
WHERE {_HELD}
RETURNING visible_at
"""

# An extend that landed: the row keeps the generation and has left the receipt's visibility.
_EXTENDED = (
    "SELECT visible_at FROM workflow_queue"
    " WHERE namespace = ?1 AND workflow = ?2 AND visible_at != ?3 AND generation = ?4"
)

_DONE = f"DELETE FROM workflow_queue WHERE {_HELD}"

# A failed pass via the `<prefix>_workflow_failure` view, fenced by the receipt; bumping the
# generation makes a retry of a write that landed count nothing twice.
_FAILED = """
INSERT INTO {view} (namespace, workflow, visible_at, generation, error, at, failures, dead)
SELECT ?1, ?2, ?3, ?4, ?5, t.now, q.failures + 1, (?6 > 0 AND q.failures + 1 >= ?6)
FROM workflow_queue q, {now}
WHERE q.namespace = ?1 AND q.workflow = ?2 AND q.visible_at = ?3 AND q.generation = ?4
RETURNING failures, dead
"""
_DROP = "DELETE FROM workflow_queue WHERE namespace = ?1 AND workflow = ?2"

@dataclass(eq=False)
class LibsqlScheduler:
    """The queue of workflows wanting a pass, scored by when each becomes visible.

    `namespace` separates queues; `lease` hides a taken workflow; `poll` paces `next_ready`; `now` is for tests.
    """

    database: Database
    namespace: str = "workflow"
    lease: timedelta = LEASE
    poll: timedelta = POLL
    now: Callable[[], datetime] | None = field(default=None, repr=False)
    # Ring the deployment's doorbell (HAREL_EDGE_DOORBELL) when a pass is asked for, so a worker
    # in its long idle pause takes it; a worker's own scheduler wakes its loop in-process instead.
    rings: bool = True
    lease_seconds: float = field(init=False, repr=False)
    poll_seconds: float = field(init=False, repr=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        refuse_nul(self.namespace, "namespace")
        self.lease_seconds = self.lease.total_seconds()
        self.poll_seconds = self.poll.total_seconds()
        if self.lease_seconds <= 0 or self.poll_seconds <= 0:
            raise ValueError(f"lease={self.lease} and poll={self.poll} must be positive durations")

    def clock_param(self) -> float | None:
        """The injected clock's time as a statement parameter, or None for the database's own."""
        return None if self.now is None else to_seconds(self.now())

    def notify(self) -> None:
        """Tell this process's waiting `next_ready` that something may have become ready."""
        self._ready.set()

    async def announce(self) -> None:
        """`notify`, and ring the deployment's doorbell for this database (when it has one)."""
        self.notify()
        if self.rings and self.database.settings.doorbell is not None:
            from harel_edge.doorbell import ring_once  # noqa: PLC0415 - only a deployment with a doorbell

            await ring_once(self.database.settings)

    async def make_ready(self, workflow: str, when: datetime | None = None) -> None:
        """Ask for a pass of the workflow now (or no later than `when`).

        Never delays one already due; what it does to a sleeping or taken row: docs/durable-design.md.
        """
        refuse_nul(workflow, "workflow id")
        at = self.clock_param() if when is None else to_seconds(when)
        await self.database.execute("durable.make_ready", _MAKE_READY, (self.namespace, workflow, at))
        await self.announce()

    async def schedule(self, workflow: str, visible_at: datetime) -> None:
        """Make the workflow visible at `visible_at`, whatever its row said before."""
        refuse_nul(workflow, "workflow id")
        at = to_seconds(visible_at)
        await self.database.execute("durable.schedule", _SCHEDULE, (self.namespace, workflow, at))
        await self.announce()

    async def wake_at(self, delivery: Delivery, when: datetime) -> None:
        """Put the workflow to sleep until `when`, unless something asked for a pass meanwhile
        (then this delivery's receipt is stale, and the next pass writes the same sleep again).
        """
        at = to_seconds(when)
        await self.database.execute("durable.wake_at", _WAKE_AT, (*self._receipt(delivery), at))

    async def next_ready(self, within: timedelta) -> Delivery | None:
        """Take the next visible workflow, waiting up to `within` for one; None if none came."""
        taken = await self.take_ready(1, within)
        return taken[0] if taken else None

    async def take_ready(self, limit: int, within: timedelta, stop: asyncio.Event | None = None) -> list[Delivery]:
        """Take up to `limit` visible workflows in one statement, waiting up to `within` for one;
        [] if none came, or at once when `stop` is set. It looks again at the poll, at the
        earliest sleeper's deadline, or at a wakeup made in this process; not at `within`'s end."""
        deadline = time.monotonic() + within.total_seconds()
        while True:
            self._ready.clear()  # before looking, so a signal during the look is not lost
            taken, until_next = await self._take(limit)
            if taken:
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            pause = min(self.poll_seconds, remaining)
            if until_next is not None:
                pause = min(pause, max(until_next, 0.001))
            await retry.wait_any([self._ready] if stop is None else [self._ready, stop], pause)
            if stop is not None and stop.is_set():
                return []
            if not self._ready.is_set() and time.monotonic() >= deadline:
                return []  # nothing woke it: the caller's next call looks first (one look a poll, not two)

    async def extend(self, delivery: Delivery, within: timedelta) -> Delivery:
        """Keep the workflow invisible `within` more; continue with the delivery this returns.

        A stale receipt changes nothing and returns the delivery passed in.
        """
        seconds = within.total_seconds()

        async def landed() -> list[tuple] | None:
            """After an unknown outcome: the same generation with a new visibility is our extend."""
            rows = await self.database.execute(
                "durable.extend_delivery.lookup",
                _EXTENDED,
                (self.namespace, delivery.workflow, delivery.receipt, delivery.generation),
            )
            return rows or None

        rows = await self.database.execute(
            "durable.extend_delivery",
            _EXTEND,
            (*self._receipt(delivery), seconds, self.clock_param()),
            resolve=landed,
        )
        return Delivery(delivery.workflow, rows[0][0], delivery.generation) if rows else delivery

    async def drop(self, workflow: str) -> None:
        """Drop the workflow's row, whether queued, sleeping or out with a worker.

        A pass still running then matches no row, so it does not put the workflow back to sleep
        (to stop a workflow for good, `LibsqlDurable.cancel` it).
        """
        refuse_nul(workflow, "workflow id")
        await self.database.execute("durable.drop", _DROP, (self.namespace, workflow))

    async def failed(self, delivery: Delivery, error: str, limit: int) -> tuple[int, bool] | None:
        """Count a failed pass; at `limit` in a row (0: never) move the workflow to the dead-letter table.

        Returns (failed passes, dead-lettered), or None when the receipt is stale (the newer write decides).
        """
        prefix = self.database.settings.prefix
        sql = _FAILED.format(view=f"{prefix}_workflow_failure", now=now_table("?7"))
        rows = await self.database.execute("durable.failed", sql, (*self._receipt(delivery), error, limit, self.clock_param())
        )
        return (int(rows[0][0]), bool(rows[0][1])) if rows else None

    async def done(self, delivery: Delivery) -> None:
        """Drop the workflow, unless something asked for another pass while this one ran."""
        await self.database.execute("durable.done", _DONE, self._receipt(delivery))

    async def _take(self, limit: int) -> tuple[list[Delivery], float | None]:
        """Up to `limit` visible workflows (oldest first), or how long until the earliest becomes
        visible: both statements in one unit, so one round trip to a remote primary."""
        at = self.clock_param()
        took, until = await self.database.transaction(
            "durable.next_ready",
            [Stmt(_TAKE, (self.namespace, self.lease_seconds, at, limit)), Stmt(_UNTIL_NEXT, (self.namespace, at))],
        )
        if took.rows:
            ordered = sorted(took.rows, key=lambda row: (row[1], row[0]))
            return [Delivery(workflow, visible_at, generation) for workflow, visible_at, generation in ordered], None
        return [], (until.rows[0][0] if until.rows else None)

    def _receipt(self, delivery: Delivery) -> tuple:
        return (self.namespace, delivery.workflow, delivery.receipt, delivery.generation)
