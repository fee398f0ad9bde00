"""Dead letters on the queue's side: the failures a handler reports, each delivery's count, and
the move of a message over `max_deliveries` to the dead-letter table (docs/operations.md)."""

from __future__ import annotations

from typing import Any

import structlog
from harel.engine.transport import Lease

from harel_edge import observability
from harel_edge.queue import statements as sql
from harel_edge.queue.leases import EventPath

log = structlog.get_logger("harel_edge.transport")

MAX_ERROR_CHARS = 4000  # of a handling failure kept on its message and in its dead letter


class DeadLetters:
    """What `EventTransport` does with failures: it keeps them on its `EventPath` until the nack
    or the bury that records them."""

    path: EventPath
    max_deliveries: int
    _report: Any

    def deliveries(self, lease: Lease) -> int | None:
        """Which delivery of its message `lease` is (1: the first), while it is held."""
        return self.path.deliveries.get((lease.seq, lease.token))

    def failed(self, lease: Lease, error: BaseException | str) -> None:
        """Say that handling `lease` raised `error`: the nack that gives it back records the
        error on the message (a dead letter keeps the last one), and the delivery stays counted
        toward `max_deliveries`. A nack without it is a clean give-back and is not counted."""
        key = (lease.seq, lease.token)
        if key in self.path.held:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            self.path.failures[key] = text[:MAX_ERROR_CHARS]

    async def bury(self, lease: Lease, deliveries: int | None = None) -> bool:
        """Move the leased message to the dead-letter table, fenced by the lease's token, with the
        handling failure `failed` reported as its last error: one unit of work. False if the
        lease was lost."""
        q = self.path.queue
        error = self.path.failures.get((lease.seq, lease.token))
        stmts = [sql.bury_statement(q, lease, self.path.now())]
        if error is not None:
            stmts.insert(0, sql.error_statement(q, lease, error))

        async def attempt() -> bool:
            if len(stmts) == 1:
                rows = (await self.path.executor.execute(stmts[0])).rows
            else:
                rows = (await self.path.executor.transaction(stmts))[-1].rows
            return bool(rows and rows[0][0])

        async def resolve() -> bool | None:
            locked_by, dead = (await self.path.execute(sql.buried_sql(q), lease.seq, lease.seq)).rows[0]
            if dead:
                return True
            return None if locked_by == lease.token else False

        done = await self.path.run("bury", attempt, resolve)
        self.path.release(lease)
        if done:
            observability.DEAD_LETTERED.labels("message").inc()
            if self._report is not None:
                self._report.dead_letters += 1
            log.warning(
                "dead-lettered",
                kind="message",
                group_id=lease.group_id,
                seq=lease.seq,
                event_kind=lease.event.kind,
                deliveries=None if deliveries is None else deliveries - 1,
                limit=self.max_deliveries,
            )
        else:
            observability.record_lost_lease("bury")
        return done

    async def _bury_quietly(self, lease: Lease, deliveries: int) -> None:
        """`bury`, from a claim: a failure leaves the message leased, and it comes back (still
        over the limit) once the lease lapses, so the claim hands out what else it leased."""
        try:
            await self.bury(lease, deliveries)
        except Exception as exc:  # noqa: BLE001 - the message is buried on a later claim
            log.warning("could not dead-letter a message", group_id=lease.group_id, seq=lease.seq, error=str(exc)[:200])

