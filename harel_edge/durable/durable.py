"""LibsqlDurable: the checkpoint store and the scheduler in one database, so that writes to
both are one commit.

A value arriving for a workflow and the wakeup that makes a pass read it must land together:
recorded without the wakeup, the workflow sleeps on a message it has; woken without the
record, the pass finds nothing and sleeps again, and the message is then lost if the process
dies before writing it. Each operation here is one statement (through the views of
`harel_edge.schema.durable_writes`), so it is one commit on every profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge.durable.checkpointer import ARRIVE, DISCARD, LibsqlCheckpointer, new_inbox_key
from harel_edge.durable.database import Database
from harel_edge.durable.scheduler import LibsqlScheduler
from harel_edge.durable.types import Entry
from harel_edge.errors import HarelEdgeError
from harel_edge.ids import refuse_nul


class SeparateDatabasesError(HarelEdgeError, ValueError):
    """LibsqlDurable was given stores on two different Database objects."""


@dataclass(eq=False)
class LibsqlDurable:
    """A checkpoint store and a scheduler on the same `Database`, checked when built.

    The check is by identity, not by file name: two `Database`s are two connections, and a
    commit on one of them cannot include a write on the other, even to the same file.
    """

    checkpointer: LibsqlCheckpointer
    scheduler: LibsqlScheduler

    def __post_init__(self) -> None:
        if self.checkpointer.database is not self.scheduler.database:
            raise SeparateDatabasesError(
                "LibsqlDurable needs the checkpointer and the scheduler on the same Database object "
                "(arrive, deliver and delete are single commits on one connection): build both from "
                "one harel_edge.durable.connect(...) result"
            )

    @property
    def database(self) -> Database:
        return self.checkpointer.database

    async def arrive(self, workflow: str, key: str, value: object) -> object:
        """Record `value` under `key` and make the workflow ready, together or not at all.

        The first value for a key wins; the stored one is returned, so a retried arrival is
        harmless (it only asks for one more pass).
        """
        refuse_nul(workflow, "workflow id")
        refuse_nul(key, "key")
        text = self.checkpointer.codec.encode(value)
        rows = await self.database.execute("durable.arrive", ARRIVE, (workflow, key, text, self.scheduler.namespace, self.scheduler.clock_param()))
        self.scheduler.notify()
        return self.checkpointer.codec.decode(rows[0][0])

    async def deliver(self, workflow: str, value: object, key: str | None = None) -> Entry:
        """Append a message to the workflow's inbox and make it ready, together or not at all.

        Pass `key` (one `new_inbox_key()` made before the first attempt) to make retries of an
        uncertain send idempotent: the same key is filed once.
        """
        key = key or new_inbox_key()
        stored = await self.arrive(workflow, key, value)
        return Entry(key, stored)

    async def delete(self, workflow: str) -> int:
        """Cancel the workflow's wakeups, forget its records and raise its fence, in one commit.

        There is no moment in which the records are gone but a wakeup is not (a pass would
        start from nothing), nor one in which the fence is raised for a deletion that did not
        happen. Returns how many records there were.
        """
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.delete", DISCARD, (workflow, self.scheduler.namespace, self.checkpointer.clock_param()))
        return int(rows[0][0])
