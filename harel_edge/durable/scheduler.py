"""LibsqlScheduler: which workflows want a pass, and when, as one row per workflow.

The row's `visible_at` carries all three states a workflow can be in: queued (a time in the
past), sleeping (a time in the future), and out with a worker (a lease ahead of the moment a
worker took it). So waking sleepers and taking back abandoned work need no sweeper: a row
whose time has come is simply visible again.

The visibility a worker's take wrote is also its receipt (`Delivery.receipt`): every later
write made with that delivery (`wake_at`, `extend`, `done`) applies only if the row still
carries it. Anything that touched the workflow meanwhile (a message making it ready, another
worker taking over an overrun lease, a cancel) wrote a different visibility or removed the row,
and the stale delivery then changes nothing, which is always the right answer: the newer write
says more about the workflow than the older pass did.

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
from harel_edge.procpool import execute
from harel_edge.schema import DB_NOW

_NOW = "(SELECT COALESCE(?{n}, " + DB_NOW + ") AS now) AS t"

# A take's visibility gets a random fraction of a millisecond (in steps of 2**-22 s, the
# resolution of a double near today's unix time) because the database clock ticks in whole
# milliseconds: two takes of one workflow within one tick would otherwise write the same
# receipt, and the older delivery would pass for the newer.
_JITTER = "(abs(random()) % 4096) * 2.384185791015625e-07"

_MAKE_READY = f"""
INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES (?1, ?2, COALESCE(?3, {DB_NOW}))
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at)
"""

_SCHEDULE = """
INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES (?1, ?2, ?3)
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = excluded.visible_at
"""

_TAKE = f"""
UPDATE workflow_queue SET visible_at = t.now + ?2 + {_JITTER}
FROM {_NOW.format(n=3)}
WHERE namespace = ?1 AND workflow = (
    SELECT workflow FROM workflow_queue WHERE namespace = ?1 AND visible_at <= t.now
    ORDER BY visible_at LIMIT 1)
RETURNING workflow, visible_at
"""

# How long until the earliest row becomes visible, by the same clock the take uses.
_UNTIL_NEXT = f"SELECT MIN(visible_at) - t.now FROM workflow_queue, {_NOW.format(n=2)} WHERE namespace = ?1"

_WAKE_AT = (
    "UPDATE workflow_queue SET visible_at = ?4 WHERE namespace = ?1 AND workflow = ?2 AND visible_at = ?3"
)

_EXTEND = f"""
UPDATE workflow_queue SET visible_at = t.now + ?4 + {_JITTER}
FROM {_NOW.format(n=5)}
WHERE namespace = ?1 AND workflow = ?2 AND visible_at = ?3
RETURNING visible_at
"""

_DONE = "DELETE FROM workflow_queue WHERE namespace = ?1 AND workflow = ?2 AND visible_at = ?3"
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
        self.lease_seconds = self.lease.total_seconds()
        self.poll_seconds = self.poll.total_seconds()
        if self.lease_seconds <= 0 or self.poll_seconds <= 0:
            raise ValueError(f"lease={self.lease} and poll={self.poll} must be positive durations")

    def _at(self) -> float | None:
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
        at = self._at() if when is None else to_seconds(when)
        await self.database.call(
            "durable.make_ready", execute, _MAKE_READY, (self.namespace, workflow, at), any_connection=True
        )
        self.notify()

    async def schedule(self, workflow: str, visible_at: datetime) -> None:
        """Make the workflow visible at `visible_at`, whatever its row said before."""
        at = to_seconds(visible_at)
        await self.database.call(
            "durable.schedule", execute, _SCHEDULE, (self.namespace, workflow, at), any_connection=True
        )
        self.notify()

    async def wake_at(self, delivery: Delivery, when: datetime) -> None:
        """Put the workflow to sleep until `when`, unless something asked for a pass meanwhile.

        If the row no longer carries this delivery's receipt, somebody rescheduled the
        workflow since it was taken, and that pass will reach the same sleep and write it
        again (the deadline lives in the workflow's records), so nothing is lost by skipping.
        """
        at = to_seconds(when)
        await self.database.call(
            "durable.wake_at",
            execute,
            _WAKE_AT,
            (self.namespace, delivery.workflow, delivery.receipt, at),
            any_connection=True,
        )

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
            delivery, until_next = await self.database.call(
                "durable.next_ready",
                _take,
                self.namespace,
                self.lease_seconds,
                self._at(),
                any_connection=True,
            )
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
        delivery. If the row no longer carries this receipt (cancelled, or rescheduled by a
        wakeup during the pass) nothing changes and the delivery passed in is returned.
        """
        seconds = within.total_seconds()
        rows = await self.database.call(
            "durable.extend_delivery",
            execute,
            _EXTEND,
            (self.namespace, delivery.workflow, delivery.receipt, seconds, self._at()),
            any_connection=True,
        )
        return Delivery(delivery.workflow, rows[0][0]) if rows else delivery

    async def cancel(self, workflow: str) -> None:
        """Drop the workflow's row, whether queued, sleeping or out with a worker.

        A pass still running then finds nothing to update: its `wake_at` and `done` carry a
        receipt no row has, so a cancelled workflow is not put back to sleep.
        """
        await self.database.call(
            "durable.cancel", execute, _CANCEL, (self.namespace, workflow), any_connection=True
        )

    async def done(self, delivery: Delivery) -> None:
        """Drop the workflow, unless something asked for another pass while this one ran."""
        await self.database.call(
            "durable.done",
            execute,
            _DONE,
            (self.namespace, delivery.workflow, delivery.receipt),
            any_connection=True,
        )


def _take(  # noqa: ANN001 - connection: an EdgeConnection
    connection, namespace: str, lease_seconds: float, at: float | None
) -> tuple[Delivery | None, float | None]:
    """The next visible workflow, or how long until the earliest becomes visible. A module-level
    function, so that on sqld and replica it runs whole next to the connection, in one request."""
    rows = connection.execute(_TAKE, (namespace, lease_seconds, at))
    if rows:
        return Delivery(rows[0][0], rows[0][1]), None
    rows = connection.execute(_UNTIL_NEXT, (namespace, at))
    return None, (rows[0][0] if rows else None)
