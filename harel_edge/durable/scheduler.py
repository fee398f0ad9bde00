"""LibsqlScheduler: which workflows want a pass, and when, as one row per workflow.

The row's `visible_at` carries all three states a workflow can be in: queued (a time in the
past), sleeping (a time in the future), and out with a worker (a lease ahead of the moment a
worker took it). So waking sleepers and taking back abandoned work need no sweeper: a row
whose time has come is simply visible again.

The visibility a worker's take wrote, together with the row's generation (a count bumped by
every take, `make_ready` and `schedule`), is its receipt (`Delivery.receipt`,
`Delivery.generation`): every later write made with that delivery (`wake_at`, `extend`,
`done`) applies only if the row still carries both. Anything that touched the workflow
meanwhile (a message making it ready, another worker taking over an overrun lease, a cancel)
wrote a different visibility or generation or removed the row, and the stale delivery then
changes nothing, which is always the right answer: the newer write says more about the
workflow than the older pass did. Two takes within one tick of the clock write the same
visibility, never the same generation.

Every operation is one statement; times come from the database's clock unless `now=` is given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from harel_edge.durable.database import Database, migrate
from harel_edge.durable.types import LEASE, POLL, Delivery, to_seconds
from harel_edge.executor import Stmt
from harel_edge.ids import refuse_nul
from harel_edge.schema import DB_NOW, QUEUE_BUMP

_NOW = "(SELECT COALESCE(?{n}, " + DB_NOW + ") AS now) AS t"

# The next generation of a row: see schema.QUEUE_BUMP.
_BUMP = QUEUE_BUMP

# A wakeup bumps the generation even when it leaves the visibility as it was (already due, or
# asked for later than a worker's lease ends), so the pass out with a worker never drops it.
_MAKE_READY = f"""
INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES (?1, ?2, COALESCE(?3, {DB_NOW}))
ON CONFLICT (namespace, workflow) DO UPDATE SET
    visible_at = MIN(visible_at, excluded.visible_at), generation = {_BUMP}
"""

_SCHEDULE = f"""
INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES (?1, ?2, ?3)
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = excluded.visible_at, generation = {_BUMP}
"""

_TAKE = f"""
UPDATE workflow_queue SET visible_at = t.now + ?2, generation = {_BUMP}
FROM {_NOW.format(n=3)}
WHERE namespace = ?1 AND workflow = (
    SELECT workflow FROM workflow_queue WHERE namespace = ?1 AND visible_at <= t.now
    ORDER BY visible_at LIMIT 1)
RETURNING workflow, visible_at, generation
"""

# How long until the earliest row becomes visible, by the same clock the take uses.
_UNTIL_NEXT = f"SELECT MIN(visible_at) - t.now FROM workflow_queue, {_NOW.format(n=2)} WHERE namespace = ?1"

# The receipt: the visibility and the generation the delivery was given, both still the row's.
_HELD = "namespace = ?1 AND workflow = ?2 AND visible_at = ?3 AND generation = ?4"

# A pass that ends well (asleep) also clears the count of failed passes before it.
_WAKE_AT = f"UPDATE workflow_queue SET visible_at = ?5, failures = 0, last_error = NULL WHERE {_HELD}"

_EXTEND = f"""
UPDATE workflow_queue SET visible_at = t.now + ?5
FROM {_NOW.format(n=6)}
WHERE {_HELD}
RETURNING visible_at
"""

_DONE = f"DELETE FROM workflow_queue WHERE {_HELD}"

# A failed pass, through the `<prefix>_workflow_failure` view (schema.dead_letter_tables): the
# count and the error are written while the receipt holds, and at the limit (?6 > 0) the row
# moves to the dead-letter table. The generation is bumped, so a retry of a write that landed
# finds no receipt and counts nothing twice.
_FAILED = """
INSERT INTO {view} (namespace, workflow, visible_at, generation, error, at, failures, dead)
SELECT ?1, ?2, ?3, ?4, ?5, t.now, q.failures + 1, (?6 > 0 AND q.failures + 1 >= ?6)
FROM workflow_queue q, {now}
WHERE q.namespace = ?1 AND q.workflow = ?2 AND q.visible_at = ?3 AND q.generation = ?4
RETURNING failures, dead
"""
_CANCEL = "DELETE FROM workflow_queue WHERE namespace = ?1 AND workflow = ?2"

@dataclass(eq=False)
class LibsqlScheduler:
    """The queue of workflows wanting a pass, scored by when each becomes visible.

    `namespace` separates queues sharing the table (one per kind of workflow, say). `lease` is
    how long a taken workflow stays invisible to other workers; `poll` how often `next_ready`
    looks when nothing in this process said something became ready. `now` replaces the
    database's clock (None) with another, for tests.
    """

    database: Database
    namespace: str = "workflow"
    lease: timedelta = LEASE
    poll: timedelta = POLL
    now: Callable[[], datetime] | None = field(default=None, repr=False)
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

    async def prepare(self) -> None:
        """Create the tables (every worker does this at start; all but the first find them)."""
        await migrate(self.database)

    async def make_ready(self, workflow: str, when: datetime | None = None) -> None:
        """Ask for a pass of the workflow now (or no later than `when`).

        It never delays a workflow already due earlier, wakes a sleeping one early (its pass
        sleeps again if its deadline has not come), and changes the receipt of one out with a
        worker, so that worker's `done` leaves the row and another pass follows.
        """
        refuse_nul(workflow, "workflow id")
        at = self.clock_param() if when is None else to_seconds(when)
        await self.database.execute("durable.make_ready", _MAKE_READY, (self.namespace, workflow, at))
        self.notify()

    async def schedule(self, workflow: str, visible_at: datetime) -> None:
        """Make the workflow visible at `visible_at`, whatever its row said before."""
        refuse_nul(workflow, "workflow id")
        at = to_seconds(visible_at)
        await self.database.execute("durable.schedule", _SCHEDULE, (self.namespace, workflow, at))
        self.notify()

    async def wake_at(self, delivery: Delivery, when: datetime) -> None:
        """Put the workflow to sleep until `when`, unless something asked for a pass meanwhile.

        If the row no longer carries this delivery's receipt, somebody rescheduled the
        workflow since it was taken, and that pass will reach the same sleep and write it
        again (the deadline lives in the workflow's records), so nothing is lost by skipping.
        """
        at = to_seconds(when)
        await self.database.execute("durable.wake_at", _WAKE_AT, (*self._receipt(delivery), at))

    async def wake_due(self, now: datetime) -> tuple[str, ...]:
        """Nothing to do: a sleeping workflow becomes visible by itself when its time comes."""
        return ()

    async def reclaim(self, idle: timedelta) -> Delivery | None:
        """Nothing to do: a workflow whose worker vanished becomes visible when its lease ends."""
        return None

    async def next_ready(self, within: timedelta) -> Delivery | None:
        """Take the next visible workflow, waiting up to `within` for one; None if none came.

        Between looks it waits for the earliest of: the poll interval, the moment the earliest
        sleeping workflow is due, or a `make_ready`/`schedule` made through this scheduler
        object (within one process that starts the pass at once instead of a poll later).
        """
        deadline = time.monotonic() + within.total_seconds()
        while True:
            self._ready.clear()  # before looking, so a signal during the look is not lost
            delivery, until_next = await self._take()
            if delivery is not None:
                return delivery
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            pause = min(self.poll_seconds, remaining)
            if until_next is not None:
                pause = min(pause, max(until_next, 0.001))
            try:
                await asyncio.wait_for(self._ready.wait(), pause)
            except TimeoutError:
                pass

    async def extend(self, delivery: Delivery, within: timedelta) -> Delivery:
        """Keep the workflow invisible for `within` more; returns the delivery to use from now on.

        The new visibility is the new receipt, so the caller must continue with the returned
        delivery (and keep it even if it stops waiting: the write lands anyway). If the row no
        longer carries this receipt (cancelled, or rescheduled by a wakeup during the pass)
        nothing changes and the delivery passed in is returned.
        """
        seconds = within.total_seconds()
        rows = await self.database.execute("durable.extend_delivery", _EXTEND, (*self._receipt(delivery), seconds, self.clock_param())
        )
        return Delivery(delivery.workflow, rows[0][0], delivery.generation) if rows else delivery

    async def cancel(self, workflow: str) -> None:
        """Drop the workflow's row, whether queued, sleeping or out with a worker.

        A pass still running then finds nothing to update: its `wake_at` and `done` carry a
        receipt no row has, so a cancelled workflow is not put back to sleep.
        """
        refuse_nul(workflow, "workflow id")
        await self.database.execute("durable.cancel", _CANCEL, (self.namespace, workflow))

    async def failed(self, delivery: Delivery, error: str, limit: int) -> tuple[int, bool] | None:
        """Count a pass of the delivered workflow that raised `error`; at `limit` failed passes
        in a row (0: never) move it to the dead-letter table, so nothing schedules it again.

        Returns (failed passes, dead-lettered), or None when the row no longer carries this
        delivery's receipt (rescheduled or cancelled meanwhile: that newer write decides).
        """
        prefix = self.database.settings.prefix
        sql = _FAILED.format(view=f"{prefix}_workflow_failure", now=_NOW.format(n=7))
        rows = await self.database.execute("durable.failed", sql, (*self._receipt(delivery), error, limit, self.clock_param())
        )
        return (int(rows[0][0]), bool(rows[0][1])) if rows else None

    async def done(self, delivery: Delivery) -> None:
        """Drop the workflow, unless something asked for another pass while this one ran."""
        await self.database.execute("durable.done", _DONE, self._receipt(delivery))

    async def _take(self) -> tuple[Delivery | None, float | None]:
        """The next visible workflow, or how long until the earliest becomes visible: both
        statements in one unit, so one round trip to a remote primary."""
        at = self.clock_param()
        took, until = await self.database.transaction(
            "durable.next_ready",
            [Stmt(_TAKE, (self.namespace, self.lease_seconds, at)), Stmt(_UNTIL_NEXT, (self.namespace, at))],
        )
        if took.rows:
            workflow, visible_at, generation = took.rows[0]
            return Delivery(workflow, visible_at, generation), None
        return None, (until.rows[0][0] if until.rows else None)

    def _receipt(self, delivery: Delivery) -> tuple:
        return (self.namespace, delivery.workflow, delivery.receipt, delivery.generation)
