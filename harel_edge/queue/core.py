"""The queue, written once: harel's async transport on the profile's executor, every operation
one unit of work under the one retry driver. The sync `LibsqlTransport` is a face of this.

A caller cancelled while its operation travels cannot know whether it committed; nothing is
applied twice (a lease not acked lapses, a publish is idempotent on its event id)."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from harel.engine.transport import Lease

from harel_edge import observability
from harel_edge.executor import Executor, StatementError, Stmt
from harel_edge.queue import statements as sql
from harel_edge.queue.carrying import Carrying
from harel_edge.queue.dead_letters import DeadLetters
from harel_edge.queue.leases import Clock, EventPath, LeaseKey
from harel_edge.queue.messages import Publishing
from harel_edge.queue.runs import Run
from harel_edge.queue.settling import Settling
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.transport")

LIMITED_CLAIMS = 100  # after a claim found a limit set: claims that read them before trying without
TAKE_SLICE = 256  # rows of a claim's answer made into leases between two turns of the loop
LEASED_PER_SLOT = 4  # messages a worker may hold leased, a slot of its window (runs' followers included)


@dataclass
class _TailClaim:
    """A claim that a commit or exchange carries: what it asked for, once it was made."""

    free: int = 0
    visibility: float = 0.0
    token: str | None = None
    wanted: tuple | None = None
    limited: bool = False


class EventTransport(Publishing, Settling, DeadLetters, Carrying):
    """harel's async transport on an executor, with `claim_many` behind `claim`; it keeps the
    leases it holds (its `EventPath`), and a store's commits carry their acks through it.

    `prefetch` and `max_deliveries`: docs/executor.md ("The event path") and docs/operations.md.
    """

    def __init__(
        self,
        executor: Executor,
        settings: EdgeSettings,
        *,
        clock: Clock | None = None,
        concurrency: int = 32,
        prefetch: bool = False,
        report: Any = None,
        count_groups: bool = False,
        routing_keys: Sequence[str] | None = None,
        max_deliveries: int = 0,
        max_run: int = 1,
    ) -> None:
        if max_deliveries < 0:
            raise ValueError(f"max_deliveries must be >= 0 (0: never dead-letter), got {max_deliveries!r}")
        self.path = EventPath(executor, settings, clock=clock)
        self.settings = settings
        self.concurrency = concurrency
        # A deployment's worker: the most this database may hold of the process's shared window.
        self.allowance: Callable[[], int] | None = None
        self.max_deliveries = max_deliveries
        self.prefetch = prefetch
        # A claim with the execution may lease each group's next messages too, up to `max_run` in
        # all: its handler takes them one after another and they commit together (runs.py).
        if max_run < 1:
            raise ValueError(f"max_run must be at least 1, got {max_run!r}")
        self.max_run = max_run
        self._report = report
        self._groups: Counter[str] | None = Counter() if count_groups else None
        self._routing_keys = tuple(settings.routing_keys if routing_keys is None else routing_keys)
        self._buffer: deque[Lease] = deque()
        self._buffer_for: tuple | None = None
        self._wanted: tuple | None = None  # the last claim's arguments, for a claim a commit carries
        self._sql: dict[tuple[bool, bool, bool, bool], str] = {}
        self._limited = 0  # claims left to make with the statement that reads the limits
        # Free slots: `concurrency - len(held) - _claiming`, and for a claim that goes after
        # commits, the slots their acks free as well (`_freeing`).
        self._claiming = 0  # leases that claims carried by commits will add
        self._freeing = 0  # commits that carry a claim, not yet over
        self._asking = 0  # leases a claim of its own, on the wire, may add
        self._tail: asyncio.Task | None = None  # the claim the next commit or exchange carries
        self._tails: set[asyncio.Task] = set()

    @property
    def concurrency(self) -> int:
        """The most runs held at once: the worker's window, within the share of a process's window."""
        return self._concurrency if self.allowance is None else min(self._concurrency, self.allowance())

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self._concurrency = value

    def holding(self) -> int:
        """The runs this transport holds or is claiming, less those commits on their way free."""
        return len(self.path.runs) + self._claiming + self._asking - self._freeing

    @property
    def held(self) -> dict[LeaseKey, Lease]:
        return self.path.held

    @property
    def buffered(self) -> int:
        """Leases claimed ahead and not yet handed out."""
        return len(self._buffer)

    @property
    def clock(self) -> Clock | None:
        """The injected clock, or None for the database's."""
        return self.path.clock

    # ---- claim -----------------------------------------------------------------------------------

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys: Sequence[str] | None = None
    ) -> Lease | None:
        """Lease the head of the group that waited longest, among groups with nothing in flight,
        priority >= `min_priority` and (if any are given) one of `routing_keys`; None if none."""
        keys = tuple(self._routing_keys if routing_keys is None else routing_keys)
        wanted = (worker_id, visibility, min_priority, keys)
        self._wanted = wanted
        if self.prefetch:
            await self._wait_for_carried_claims(wanted)
        if self._buffer and self._buffer_for == wanted:
            return self._buffer.popleft()
        # The free slots: leases held (buffered ones included) count against `concurrency`.
        n = max(1, self.concurrency - len(self.path.runs) - self._claiming) if self.prefetch and not self._buffer else 1
        self._asking += n  # on the wire: a deployment's other databases count it as held
        try:
            leases = await self.claim_many(worker_id, visibility, n, min_priority, keys, with_execution=self.prefetch)
        finally:
            self._asking -= n
        if not leases:
            return None
        await self._stash(leases[1:], wanted)
        return leases[0]

    async def _wait_for_carried_claims(self, wanted: tuple) -> None:
        """With nothing buffered, wait for the claims commits carry before claiming alone: a
        claim of its own would hold up the worker's next launch for a round trip while those
        claims' leases arrive and wait in the buffer (docs/tuning.md)."""
        while self._tails and not (self._buffer and self._buffer_for == wanted):
            await asyncio.wait(list(self._tails), return_when=asyncio.FIRST_COMPLETED)

    async def _stash(self, leases: list[Lease], wanted: tuple) -> None:
        """Keep leases claimed ahead for the next `claim`s with the same arguments. A commit's
        claim may have filled the buffer meanwhile: leases claimed for other arguments go back."""
        if not leases:
            return
        if self._buffer and self._buffer_for != wanted:
            for lease in leases:
                await self.nack(lease)
            return
        self._buffer.extend(leases)
        self._buffer_for = wanted

    async def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0,
        routing_keys: Sequence[str] | None = None, *, with_execution: bool = False,
    ) -> list[Lease]:
        """Lease the heads of up to `n` groups in one statement, in round-robin order. With
        `with_execution` the statement also reads each message's execution, which the
        `EventStore` then serves to the worker instead of reading it again."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n!r}")
        keys = tuple(self._routing_keys if routing_keys is None else routing_keys)
        while True:
            leases, buried = await self._claim_once(worker_id, visibility, n, min_priority, keys, with_execution)
            if leases or not buried:
                break  # when every message claimed was buried, the next heads may be deliverable
        self._count_claims(leases)
        return leases

    def _count_claims(self, leases: list[Lease]) -> None:
        """Count every message leased: a run's followers with its head."""
        claimed = sum(len(run.members) if (run := self.path.run_of(lease)) else 1 for lease in leases)
        if claimed:
            observability.CLAIMS.inc(claimed)
            if self._report is not None:
                self._report.claims += claimed

    async def _claim_once(
        self, worker_id: str, visibility: float, n: int, min_priority: int, keys: tuple, with_execution: bool
    ) -> tuple[list[Lease], int]:
        """One claim statement: the leases to hand out, and how many messages it buried."""
        token, params = sql.claim_params(worker_id, visibility, min_priority, keys, self.path.now())
        # Without reading the limits while none is set: that claim fails, changing nothing, once
        # one is, and the claim that reads them runs for the next LIMITED_CLAIMS claims.
        limited, self._limited = self._limited > 0, max(self._limited - 1, 0)

        async def claim(reading_limits: bool) -> list[tuple]:
            statement = self._claim_statement(bool(keys), with_execution, reading_limits)
            return (await self.path.execute(statement, *params, n, *self._run_args(with_execution, n), volatile=True)).rows

        async def attempt() -> list[tuple]:
            nonlocal limited
            try:
                return await claim(limited)
            except Exception as exc:
                if limited or not sql.limits_were_set(exc):
                    raise
            limited, self._limited = True, LIMITED_CLAIMS  # a limit was set since: the claim that reads them
            return await claim(True)

        async def resolve() -> list[tuple] | None:
            # What the token holds is what the claim leased (read after the delivery trigger ran:
            # its count is already this one's); nothing means it did not land: claim again.
            extra = self._returning(with_execution, after_trigger=True)
            return (await self.path.execute(sql.leased_sql(self.path.queue, extra), token)).rows or None

        rows = await self.path.run("claim", attempt, resolve)
        return await self._take(rows, token, with_execution, visibility)

    async def _take(
        self, rows: list[tuple], token: str, with_execution: bool, visibility: float
    ) -> tuple[list[Lease], int]:
        """The runs a claim's rows hand out, held by this path, and their heads; a head over
        `max_deliveries` is buried instead (the count of those is the second value), and a
        follower over it goes back with the rest of its run, to come again as a head."""
        groups: dict[str, list[tuple]] = {}
        for row in sorted(rows, key=lambda row: row[0]):
            groups.setdefault(row[1], []).append(row)
        heads, buried, made = [], 0, 0
        for group_rows in groups.values():
            if made >= TAKE_SLICE:  # thousands of rows are tens of ms of parsing: the loop's turn, between runs
                made = 0
                await asyncio.sleep(0)
            made += len(group_rows)
            members: list[Lease] = []
            for row in group_rows:
                lease = sql.lease_from_row(row[:3], token)
                deliveries = int(row[-1] or 0)
                if self.max_deliveries and deliveries > self.max_deliveries:
                    if not members:
                        buried += 1
                        await self._bury_quietly(lease, deliveries)
                    else:
                        await self._give_back_quietly([sql.lease_from_row(r[:3], token) for r in group_rows[len(members) :]])
                    break
                self.path.hold(lease, deliveries=deliveries)
                members.append(lease)
            if not members:
                continue
            head = group_rows[0]
            run = Run(members, {}, visibility)
            if with_execution:
                run.state, run.known = head[3], True
                run.processed = {str(lease.event.id): bool(row[4]) for lease, row in zip(members, group_rows, strict=False)}
            self.path.runs[run.head.group_id] = run
            heads.append(run.head)
        return heads, buried

    async def _give_back_quietly(self, leases: list[Lease]) -> None:
        """Give back messages leased and never handled; a failure leaves them to lapse."""
        try:
            await self.path.run("nack", lambda: self.path.executor.execute(sql.give_back_statement(self.path.queue, leases)))
        except Exception as exc:  # noqa: BLE001 - their lease lapses by itself
            log.warning("could not give messages back; they come back when their lease lapses", error=str(exc)[:200])

    def _runs(self, with_execution: bool) -> bool:
        return with_execution and self.max_run > 1

    def _run_args(self, with_execution: bool, heads: int) -> tuple[int, ...]:
        """A claim of runs: the longest run, and the most messages for `heads` groups: runs in
        flight count against the window (one handler each), and the messages leased stay under
        LEASED_PER_SLOT a slot of it (their memory), each head with its slot."""
        if not self._runs(with_execution):
            return ()
        room = LEASED_PER_SLOT * self.concurrency - len(self.path.held)
        return self.max_run, min(heads * self.max_run, max(heads, room))

    def claim_with_commit(self) -> asyncio.Task | None:
        """A commit that acks one of this transport's leases is about to be queued: the commit or
        exchange that carries it also carries one claim, after it, for every slot the commits in
        it free (one claim statement for them all: its cost is its own, not its rows'). Returns
        the claim's task, for the commit to wait on, or None before the first claim. Leases still
        buffered do not hold it back (they count against the window as held): on a far primary,
        a claim that waited for the buffer to empty would leave the link idle for a round trip.
        The commit calls `commit_ended` once it is over, whatever became of it."""
        if self._wanted is None:
            return None
        self._freeing += 1  # the slot the commit frees: its run's
        if self._tail is None:
            tail = _TailClaim()
            future = self.path.executor.deferred(functools.partial(self._tail_statements, tail))
            self._tail = self._spawn(self._tail_settled(tail, future))
        return self._tail

    def commit_ended(self) -> None:
        """The commit that `claim_with_commit` counted is over: its run is settled, or still held."""
        self._freeing -= 1

    def _tail_statements(self, tail: _TailClaim) -> list[Stmt]:
        """The claim, made as its commit or exchange is put together: the free slots then."""
        self._tail = None
        free = self.concurrency - len(self.path.runs) - self._claiming + self._freeing
        if free < 1 or self._wanted is None:
            return []
        self._claiming += free
        tail.free, tail.wanted = free, self._wanted
        worker_id, visibility, min_priority, keys = self._wanted
        tail.token, params = sql.claim_params(worker_id, visibility, min_priority, keys, self.path.now())
        tail.limited, self._limited = self._limited > 0, max(self._limited - 1, 0)  # as `_claim_once`
        tail.visibility = visibility
        return [Stmt(self._claim_statement(bool(keys), True, tail.limited), (*params, free, *self._run_args(True, free)))]

    async def _tail_settled(self, tail: _TailClaim, future: asyncio.Future) -> None:
        """Hold what the claim leased, or, when its answer was lost, what its token holds; a
        lease not found lapses by itself. A claim refused because a limit is now set makes the
        claims read the limits from now on."""
        try:
            rows = []
            try:
                results = await future
                rows = results[0].rows if results else []
            except StatementError as exc:
                if not tail.limited and sql.limits_were_set(exc):
                    self._limited = LIMITED_CLAIMS
            except Exception as exc:  # noqa: BLE001 - the outcome is unknown: look it up
                if tail.token is None or self.path.executor.closed:
                    return
                log.info("looking up a claim whose answer was lost", error=str(exc)[:200])
                lookup = sql.leased_sql(self.path.queue, self._returning(True, after_trigger=True))
                rows = (await self.path.run("claim", lambda: self.path.execute(lookup, tail.token))).rows
            leases, _ = await self._take(rows, tail.token, True, tail.visibility)
            self._count_claims(leases)
            await self._stash(leases, tail.wanted)
        except Exception as exc:  # noqa: BLE001 - the commits that carried it went through; its leases lapse
            log.warning("a claim carried by a commit was lost; its leases lapse", error=str(exc)[:200])
        finally:
            self._claiming -= tail.free

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tails.add(task)
        task.add_done_callback(self._tails.discard)
        return task

    async def claims_settled(self) -> None:
        """Wait for the claims commits carry to be answered, their leases held or buffered."""
        while self._tails:
            await asyncio.gather(*list(self._tails), return_exceptions=True)

    def _claim_statement(self, keyed: bool, with_execution: bool, limited: bool) -> str:
        runs = self._runs(with_execution)
        statement = self._sql.get((keyed, with_execution, limited, runs))
        if statement is None:
            statement = self._sql[(keyed, with_execution, limited, runs)] = sql.claim_sql(
                self.path.queue, keyed, many=True, returning=self._returning(with_execution), limited=limited, runs=runs
            )
        return statement

    def _returning(self, with_execution: bool, *, after_trigger: bool = False) -> str:
        s = self.path.store
        heads_of = self.path.queue.messages if self._runs(with_execution) else None
        return sql.claim_returning(
            s.executions, s.processed_events, with_execution, after_trigger=after_trigger, heads_of=heads_of
        )

    # ---- inspection and shutdown -----------------------------------------------------------------

    async def depth(self) -> int:
        """Messages in the queue, in flight and parked included."""
        return int((await self.path.execute(sql.depth_sql(self.path.queue))).rows[0][0])

    async def release_held(self, *, buffered_only: bool = False) -> int:
        """Give back every lease not yet settled (at shutdown, after cancelling its handler), or
        only those claimed ahead and not yet handed out (`buffered_only`, at close); the claims
        that commits carry are answered first."""
        await self.claims_settled()
        leases = list(self._buffer) if buffered_only else list(self.path.held.values())
        self._buffer.clear()
        released, seen = 0, set()
        for lease in leases:
            run = self.path.run_of(lease)
            if (lease.seq, lease.token) not in self.path.held or (run is not None and id(run) in seen):
                continue
            whole = run is not None and len(run.members) > 1  # a run goes back whole, its deliveries uncounted
            members = [m for m in run.members if (m.seq, m.token) in self.path.held] if whole else [lease]
            try:
                if whole:
                    seen.add(id(run))
                    statement = sql.give_back_statement(self.path.queue, members)
                    rows = (await self.path.run("nack", lambda s=statement: self.path.executor.execute(s))).rows
                    back = {row[0] for row in rows}
                    self.finish(members, [m.seq in back for m in members], "nack")
                    released += len(back)
                elif await self.nack(lease):
                    released += 1
            except Exception as exc:  # noqa: BLE001 - its lease lapses by itself; say so
                log.warning("could not give a message back", group_id=lease.group_id, seq=lease.seq, error=str(exc)[:200])
                for member in members:
                    self.path.release(member)
        return released

    def group_counts(self) -> dict[str, int]:
        return dict(self._groups or {})

    async def close(self) -> None:
        """The executor is shared with the store; its owner closes it."""

