"""LibsqlDurable: the checkpoint store and the scheduler in one database, so writes to both are one commit.

Why an arrival and its wakeup must land together: docs/durable-design.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge.durable import control
from harel_edge.durable.checkpoint_statements import ARRIVE, DISCARD
from harel_edge.durable.checkpointer import LibsqlCheckpointer, new_inbox_key
from harel_edge.durable.database import Database
from harel_edge.durable.scheduler import LibsqlScheduler
from harel_edge.durable.types import Entry
from harel_edge.errors import HarelEdgeError
from harel_edge.ids import refuse_nul


class SeparateDatabasesError(HarelEdgeError, ValueError):
    """LibsqlDurable was given stores on two different Database objects."""


@dataclass(eq=False)
class LibsqlDurable:
    """A checkpoint store and a scheduler on the same `Database`, checked by identity when built:
    two `Database`s are two connections, which cannot share a commit even on one file.
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

        The first value for a key wins and is returned, so a retried arrival only asks for one more pass.
        """
        refuse_nul(workflow, "workflow id")
        refuse_nul(key, "key")
        text = self.checkpointer.codec.encode(value)
        rows = await self.database.execute("durable.arrive", ARRIVE, (workflow, key, text, self.scheduler.namespace, self.scheduler.clock_param()))
        await self.scheduler.announce()
        return self.checkpointer.codec.decode(rows[0][0])

    async def deliver(self, workflow: str, value: object, key: str | None = None) -> Entry:
        """Append a message to the workflow's inbox and make it ready, together or not at all.

        Pass `key` (a `new_inbox_key()` made before the first attempt) to make retries idempotent.
        """
        key = key or new_inbox_key()
        stored = await self.arrive(workflow, key, value)
        return Entry(key, stored)

    async def delete(self, workflow: str) -> int:
        """Cancel the workflow's wakeups, forget its records and raise its fence, in one commit.

        Returns how many records there were; why one commit: docs/durable-design.md.
        """
        refuse_nul(workflow, "workflow id")
        rows = await self.database.execute("durable.delete", DISCARD, (workflow, self.scheduler.namespace, self.checkpointer.clock_param()))
        return int(rows[0][0])

    # ---- the operator's commands (docs/durable.md, "A workflow's states") ----------------------

    async def cancel(self, workflow: str) -> control.WorkflowChange:
        """Stop the workflow: a pass that is running is fenced off before its next write, and no
        pass runs again until `resume`. Of two cancels at once, one is told it changed it."""
        stmt = control.cancel_statement(self._prefix, workflow, self.checkpointer.clock_param())
        return control.switched("cancel", workflow, await self.database.execute("durable.cancel", stmt.sql, stmt.args))

    async def resume(self, workflow: str) -> control.WorkflowChange:
        """Run a cancelled or dead workflow again from its last recorded step, its failed passes forgotten."""
        stmt = control.resume_statement(self._prefix, workflow, self.checkpointer.clock_param())
        rows = await self.database.execute("durable.resume", stmt.sql, stmt.args)
        await self.scheduler.announce()
        return control.switched("resume", workflow, rows)

    async def fork(
        self, workflow: str, from_step: str, new_id: str | None = None, *, namespace: str | None = None
    ) -> control.WorkflowChange:
        """A new workflow with `workflow`'s records from before `from_step`, ready now, to run
        `from_step` and what follows again; the original is left as it is."""
        target = new_id if new_id is not None else control.new_fork_id(workflow)
        stmt = control.fork_statement(self._prefix, workflow, from_step, target, namespace, self.checkpointer.clock_param())
        rows = await self.database.execute("durable.fork", stmt.sql, stmt.args)
        await self.scheduler.announce()
        return control.forked(workflow, from_step, target, rows)

    @property
    def _prefix(self) -> str:
        return self.database.settings.prefix
