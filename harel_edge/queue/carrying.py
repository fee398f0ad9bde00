"""What a store's commit carries for the queue (docs/transport.md, "Runs"): the ack of the event it
records, the acks of the run's members kept before it, at the run's end the member it stopped at
and the rest given back, and the next claim. The store writes the execution; the leases stay here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harel.engine.transport import Lease

from harel_edge.executor import Result, Stmt
from harel_edge.queue import statements as sql
from harel_edge.queue.leases import EventPath
from harel_edge.queue.runs import Run, Write


@dataclass(frozen=True)
class Acks:
    """The acks a store's unit carries: their leases, the statement of the unit that makes them,
    and the look-up of which landed after a lost answer."""

    leases: list[Lease]
    at: int
    gone: Callable[[], Awaitable[list[tuple[int, str]]]]


class Send(Protocol):
    """The store's one unit: `write` and `stmts` in one transaction, `stmts`' results returned."""

    def __call__(
        self, write: Write | None, stmts: list[Stmt], *, emits: list = ..., emits_at: int = ..., acks: Acks | None = ...
    ) -> Awaitable[list[Result]]: ...


class Carrying:
    """The part of `EventTransport` a store's commits go through: the runs it holds, and one
    method for a commit that carries their acks and the next claim (`commit_with_ack`)."""

    path: EventPath
    prefetch: bool
    finish: Callable[..., None]
    claim_with_commit: Callable[[], asyncio.Task | None]
    commit_ended: Callable[[], None]

    def claimed(self, group_id: str) -> Run | None:
        """The run held of `group_id` whose execution the claim read, for the store to serve."""
        run = self.path.runs.get(group_id)
        return run if run is not None and run.known else None

    def run_of(self, lease: Lease | None) -> Run | None:
        """The run `lease` is a member of, while this transport holds it."""
        return self.path.run_of(lease)

    async def commit_with_ack(
        self, group_id: str, event_id: str | None, write_from: Callable[[int | None], Write], stmts: list[Stmt],
        send: Send, *, emits: list = (), spawns: Any = (),
    ) -> list[Result] | None:
        """The store's commit of `event_id`, carrying its lease's ack (and at its run's end the next
        claim); kept for the run's one commit while later members follow it ([] then). None when
        this transport holds no lease of the event: the store sends the commit alone. `write_from`
        makes the execution's write from a base (None: the version the store read)."""
        lease = self.path.by_event.get((group_id, event_id)) if event_id else None
        run = self.path.run_of(lease)
        if run is None:
            return None
        write = write_from(None if run.write is None else run.write.base)
        # A member whose emits or spawns harel reads next cannot wait for the run's end.
        if run.keeps(lease) and not emits and not spawns:
            run.keep(lease, write, stmts)
            return []
        return await self._send(run, write, stmts, send, emits=emits, lease=lease)

    async def settle_run(self, run: Run, send: Send) -> None:
        """Send what a run kept once its handler is done with it. After a failed send, every member
        still held goes back (what was kept was not applied)."""
        if not self._held(run):
            return
        if run.failed:
            await self._give_back(run)
            return
        try:
            await self._send(run, run.write, [], send)
        except Exception:
            await self._give_back(run)
            raise

    async def _send(
        self, run: Run, write: Write | None, rest: list[Stmt], send: Send, *, emits: list = (), lease: Lease | None = None
    ) -> list[Result]:
        """One unit: the execution's write, what the run kept, `rest` (the commit of `lease`, a
        member), the acks of the members handled; then at the run's end (its last member, or no
        `lease`) the member it stopped at parked or given back with those after it, and the next
        claim; mid-run, the lease of the members to come renewed. Returns `rest`'s results."""
        q, now = self.path.queue, self.path.now()
        acked = [*run.settled, *([lease] if lease is not None and not (run.settled and run.settled[-1] is lease) else [])]
        last = lease is None or run.is_last(lease)
        tail: list[Stmt] = []
        stopped = run.stopped[0] if last and run.stopped is not None else None
        unhandled = run.unhandled() if last and stopped is None else []  # a halted run's rest
        if not last and run.after(lease):
            tail.append(sql.renew_statement(q, run.after(lease), run.visibility, now))
        elif stopped is not None:
            error = self.path.failures.get((stopped.seq, stopped.token))
            tail.append(sql.nack_statement(q, stopped, run.stopped[1], now, error))
            if run.after(stopped):
                tail.append(sql.give_back_statement(q, run.after(stopped)))
        elif unhandled:
            tail.append(sql.give_back_statement(q, unhandled))
        settling = [*run.pending, *rest]
        rest_at, acked_at = len(run.pending), len(settling)
        if acked:
            settling.append(sql.ack_many_statement(q, acked))
        settling.extend(tail)
        acks = Acks(acked, acked_at, lambda: self._gone(acked)) if acked else None
        claim = self.claim_with_commit() if self.prefetch and last else None  # for the run's slot
        try:
            results = await send(write, settling, emits=emits, emits_at=rest_at, acks=acks)
        except BaseException:
            run.failed, run.known = True, False
            raise
        finally:
            if claim is not None:
                self.commit_ended()
        done = sql.acked(acked, {(row[0], row[1]) for row in results[acked_at].rows}) if acked else []
        if lease is not None:  # harel's ack that follows finds it
            self.path.acked_by_commit[(lease.seq, lease.token)] = done[-1]
        kept = [(member, one) for member, one in zip(acked, done, strict=True) if member is not lease]
        self.finish([member for member, _ in kept], [one for _, one in kept], "ack")
        if stopped is not None:
            self.finish([stopped], [bool(results[acked_at + bool(acked)].rows)], "nack")
            for member in run.after(stopped):
                self.path.release(member)
        for member in unhandled:
            self.path.release(member)
        run.sent(write)
        if claim is not None:  # the leases the claim after this commit took are held when it returns
            await asyncio.shield(claim)
        return results[rest_at : rest_at + len(rest)]

    async def _give_back(self, run: Run) -> None:
        """Every member still held goes back, one unit: the one the run stopped at as its nack says,
        the others untouched (their deliveries not counted); a failure leaves them to lapse."""
        held = self._held(run)
        stopped = run.stopped[0] if run.stopped is not None and run.stopped[0] in held else None
        others = [member for member in held if member is not stopped]
        stmts = [sql.give_back_statement(self.path.queue, others)] if others else []
        if stopped is not None:
            error = self.path.failures.get((stopped.seq, stopped.token))
            stmts.append(sql.nack_statement(self.path.queue, stopped, run.stopped[1], self.path.now(), error))
        try:
            await self.path.run("nack", lambda: self.path.executor.transaction(stmts))
        finally:
            for member in held:
                self.path.release(member)

    def _held(self, run: Run) -> list[Lease]:
        return [member for member in run.members if (member.seq, member.token) in self.path.held]

    async def _gone(self, leases: list[Lease]) -> list[tuple[int, str]]:
        """The leases whose message is gone: after a lost answer, the acks that landed."""
        gone = []
        for lease in leases:
            if not (await self.path.execute(sql.lock_of_sql(self.path.queue), lease.seq)).rows:
                gone.append((lease.seq, lease.token))
        return gone
