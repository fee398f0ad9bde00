"""EventPath: a transport's executor and the leases it holds, owned by its `EventTransport`.

The claim brings each message's execution; a store's commit carries the message's ack
through the transport (queue/carrying.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harel.engine.schema import Names
from harel.engine.transport import Lease

from harel_edge import retry
from harel_edge.executor import Executor, Result, Stmt
from harel_edge.queue.runs import Run
from harel_edge.schema import EdgeNames
from harel_edge.settings import EdgeSettings

Clock = Callable[[], float]
LeaseKey = tuple[int, str | None]


class EventPath:
    """The executor, the leases held (with their delivery counts and handling failures), each
    group's run (with the execution the claim brought), and the acks a commit already made."""

    def __init__(self, executor: Executor, settings: EdgeSettings, *, clock: Clock | None = None) -> None:
        self.executor = executor
        self.settings = settings
        self.queue = EdgeNames(settings.prefix)
        self.store = Names(settings.prefix)
        self.clock = clock
        self.held: dict[LeaseKey, Lease] = {}
        self.by_event: dict[tuple[str, str], Lease] = {}  # (group_id, event id) -> its lease
        self.runs: dict[str, Run] = {}  # group id -> the run held of it
        self.acked_by_commit: dict[LeaseKey, bool] = {}
        self.deliveries: dict[LeaseKey, int] = {}  # which delivery of its message a lease is
        self.failures: dict[LeaseKey, str] = {}  # a handling failure, for the nack to record

    def now(self) -> float | None:
        return self.clock() if self.clock is not None else None

    async def run(self, operation: str, attempt: Callable[[], Any], resolve: Callable[[], Any] | None = None) -> Any:
        """`attempt` under the retry policy; after an unknown outcome `resolve` looks it up first."""
        return await retry.acall_with_retry(self.settings, operation, attempt, resolve=resolve)

    async def execute(self, sql: str, *args: Any, volatile: bool = False) -> Result:
        return await self.executor.execute(Stmt(sql, tuple(args)), volatile=volatile)

    def hold(self, lease: Lease, deliveries: int | None = None) -> None:
        self.held[(lease.seq, lease.token)] = lease
        if deliveries is not None:
            self.deliveries[(lease.seq, lease.token)] = deliveries
        self.by_event[(lease.group_id, lease.event.id)] = lease

    def release(self, lease: Lease) -> None:
        if self.held.pop((lease.seq, lease.token), None) is None:
            return
        self.deliveries.pop((lease.seq, lease.token), None)
        self.failures.pop((lease.seq, lease.token), None)
        self.by_event.pop((lease.group_id, lease.event.id), None)
        run = self.run_of(lease)
        if run is not None:
            run.released += 1
            if run.released == len(run.members):
                del self.runs[lease.group_id]

    def run_of(self, lease: Lease | None) -> Run | None:
        """The run `lease` is a member of, while it is held."""
        run = None if lease is None else self.runs.get(lease.group_id)
        return run if run is not None and run.has(lease) else None
