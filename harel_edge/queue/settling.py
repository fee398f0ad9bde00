"""Settling leases: ack, ack_many and nack, each one unit of work under the retry driver, and
after an ambiguous answer the lookup that says whether it landed (docs/transport.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog
from harel.engine.transport import Lease

from harel_edge import observability
from harel_edge.queue import statements as sql
from harel_edge.queue.leases import EventPath

log = structlog.get_logger("harel_edge.transport")


class Settling:
    """What `EventTransport` does with a lease it handed out: remove its message, or give it back."""

    path: EventPath
    _groups: Counter[str] | None
    _report: Any

    async def ack(self, lease: Lease) -> bool:
        """Remove the delivered message, freeing its group. False (and a log line) when the lease
        was lost: it lapsed and another worker holds the message now, which keeps it."""
        key = (lease.seq, lease.token)
        run = self.path.run_of(lease)
        if key in self.path.acked_by_commit:
            done = self.path.acked_by_commit.pop(key)
        elif run is not None and len(run.members) > 1:
            run.settle(lease)  # its delete goes with the run's commit (its worker settles the run)
            return True
        else:
            statement = sql.ack_statement(self.path.queue, lease)

            async def attempt() -> bool:
                return bool((await self.path.executor.execute(statement)).rows)

            done = await self.path.run("ack", attempt, lambda: self._settled(lease, done_if_gone=True))
        self.finish([lease], [done], "ack")
        return done

    async def ack_many(self, leases: Sequence[Lease]) -> list[bool]:
        """Ack several leases as one unit of work; each answer as `ack` gives it."""
        q = self.path.queue
        if not leases:
            return []
        if all(lease.token for lease in leases):
            # One statement for the lot: libsql prepares each statement anew, so one DELETE of
            # n fenced rows costs far less than n DELETEs.
            rows = sql.ACK_ROWS
            chunks = [sql.ack_many_statement(q, leases[i : i + rows]) for i in range(0, len(leases), rows)]

            async def attempt() -> list[bool]:
                if len(chunks) == 1:
                    results = [await self.path.executor.execute(chunks[0])]
                else:
                    results = await self.path.executor.transaction(chunks)
                return sql.acked(leases, {(row[0], row[1]) for result in results for row in result.rows})

        else:
            stmts = [sql.ack_statement(q, lease) for lease in leases]

            async def attempt() -> list[bool]:
                return [bool(r.rows) for r in await self.path.executor.transaction(stmts)]

        async def resolve() -> list[bool]:
            return [bool(await self._settled(lease, done_if_gone=True)) for lease in leases]

        done = await self.path.run("ack", attempt, resolve)
        self.finish(leases, done, "ack")
        return done

    async def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        """Give the message back: claimable at once (`delay=0`), or parked for `delay` seconds,
        during which its group stays blocked. A give-back after `failed` counts as a failed
        delivery; any other does not. False when the lease was already lost."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        self.path.acked_by_commit.pop((lease.seq, lease.token), None)
        run = self.path.run_of(lease)
        if run is not None and len(run.members) > 1 and run.stopped is None:
            run.stopped = (lease, delay)  # the run stops here; its worker settles it
            return True
        error = self.path.failures.pop((lease.seq, lease.token), None)
        statement = sql.nack_statement(self.path.queue, lease, delay, self.path.now(), error)

        async def attempt() -> bool:
            return bool((await self.path.executor.execute(statement)).rows)

        done = await self.path.run("nack", attempt, lambda: self._settled(lease, done_if_gone=False))
        self.finish([lease], [done], "nack")
        return done

    async def _settled(self, lease: Lease, *, done_if_gone: bool) -> bool | None:
        """After an ambiguous ack or nack: None if the row still carries this lease's token (try
        again), else whether the write landed (docs/transport.md, "Ambiguous writes")."""
        rows = (await self.path.execute(sql.lock_of_sql(self.path.queue), lease.seq)).rows
        if not rows:
            return done_if_gone
        if lease.token and rows[0][0] == lease.token:
            return None
        return not done_if_gone

    def finish(self, leases: Sequence[Lease], done: Sequence[bool], operation: str) -> None:
        """Forget the leases settled and count them, once for the lot (a lost one is logged)."""
        settled = 0
        for lease, one in zip(leases, done, strict=True):
            self.path.release(lease)
            if one:
                settled += 1
                if self._groups is not None and operation == "ack":
                    self._groups[lease.group_id] += 1
                continue
            observability.record_lost_lease(operation)
            log.warning("lost lease", operation=operation, group_id=lease.group_id, seq=lease.seq)
            if self._report is not None:
                self._report.lost += 1
        if not settled:
            return
        if operation == "ack":
            observability.ACKS.inc(settled)
            observability.EVENTS_HANDLED.inc(settled)
            if self._report is not None:
                self._report.acks += settled
        else:
            observability.NACKS.inc(settled)
            if self._report is not None:
                self._report.nacks += settled
