"""A group's run: its head and the messages after it that one claim leased under one token, handled
one after another in memory and committed as one unit (docs/transport.md, "Runs").

The queue's side only keeps the run's bookkeeping here; the store writes what the run did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harel.engine.transport import Lease

from harel_edge.executor import Stmt


@dataclass
class Run:
    """What one claim leased of a group, and what handling it has done that is not yet sent."""

    members: list[Lease]  # in order; the first is the group's head
    processed: dict[str, bool]  # event id -> already processed when claimed (or since, in this run)
    visibility: float
    state: str | None = None  # the execution's JSON as the run has it: the claim's, then each commit's
    known: bool = False  # whether `state` was read (by the claim): else the store reads it
    write: Write | None = None  # the execution's write for the commits kept here
    pending: list[Stmt] = field(default_factory=list)  # the kept commits' other statements
    settled: list[Lease] = field(default_factory=list)  # members handled, their deletes not yet sent
    stopped: tuple[Lease, float] | None = None  # the member given back (nack), and its park
    failed: bool = False  # a send failed: what is kept here was not applied
    halted: bool = False  # the worker is stopping: no member is handed after the one in hand
    handed: int = 0  # members handed to the handler
    released: int = 0  # members no longer held
    leased_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._keys = {(member.seq, member.token) for member in self.members}

    def has(self, lease: Lease) -> bool:
        return (lease.seq, lease.token) in self._keys

    @property
    def head(self) -> Lease:
        return self.members[0]

    def next(self) -> Lease | None:
        """The next member to handle, or None once the run is over or stopped."""
        if self.stopped is not None or self.failed or self.halted or self.handed >= len(self.members):
            return None
        self.handed += 1
        return self.members[self.handed - 1]

    def is_last(self, lease: Lease) -> bool:
        return lease is self.members[-1]

    def keeps(self, lease: Lease) -> bool:
        """Whether what handling `lease` leaves may wait for the run's end: a later member comes
        after it, and the leases are far from lapsing (a third of their visibility)."""
        return (
            len(self.members) > 1
            and not self.is_last(lease)
            and not self.failed
            and time.monotonic() - self.leased_at < self.visibility / 3
        )

    def after(self, lease: Lease) -> list[Lease]:
        """The members after `lease`, not yet handled."""
        return self.members[self.members.index(lease) + 1 :]

    def unhandled(self) -> list[Lease]:
        return self.members[self.handed :]

    def keep(self, lease: Lease, write: Write, stmts: list[Stmt]) -> None:
        """A member's commit kept for the run's: the execution's write replaces the last one kept."""
        self.write, self.state = write, write.data
        self.pending.extend(stmts)
        self.settle(lease)

    def settle(self, lease: Lease) -> None:
        """A member's handling ended in an ack: its delete goes with the run's next commit."""
        self.processed[str(lease.event.id)] = True
        if not self.settled or self.settled[-1] is not lease:  # members settle in order, each once
            self.settled.append(lease)

    def sent(self, write: Write | None) -> None:
        """What was kept is committed, with `write`: the run goes on from the database's state."""
        if write is not None:
            self.state = write.data
        self.write, self.pending, self.settled = None, [], []
        self.leased_at = time.monotonic()


@dataclass(frozen=True)
class Write:
    """An execution's write: compare-and-set from `base` (the version the database holds) to
    `version`, whose JSON is `data`."""

    execution_id: str
    stmts: list[Stmt]
    base: int
    version: int
    data: str
