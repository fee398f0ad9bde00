"""What a durable workflow function gets: its `Context`, the durable operations of one pass,
each recorded the first time and read back on every pass after (docs/durable.md)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from harel_edge.durable.checkpointer import LibsqlEffect
from harel_edge.durable.durable import LibsqlDurable
from harel_edge.durable.types import (
    INBOX,
    FencedError,
    Lost,
    Outcome,
    Pass,
    Sleeping,
    Waiting,
    from_seconds,
    now_utc,
    to_seconds,
)
from harel_edge.ids import refuse_nul
from harel_edge.schema_control import RESULT

_RESERVED = ("$", INBOX)
StepHook = Callable[[str], None]  # what was recorded: "step", "transact", "sleep" or "result"


class StopPass(BaseException):
    """Ends a pass from inside the function. A BaseException, so `except Exception` in
    workflow code cannot swallow it (the way asyncio.CancelledError works)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class Context:
    """What a workflow function gets: its id and the durable operations of this pass."""

    def __init__(
        self,
        durable: LibsqlDurable,
        holder: Pass,
        records: dict[str, object],
        floor: float | None,
        on_step: StepHook | None = None,
    ):
        self.workflow = holder.workflow
        self._on_step = on_step
        self._durable = durable
        self._holder = holder
        self._records = records
        self._floor = floor  # when the scheduler handed the pass out, by the database's clock
        self._sleeps = 0
        self._received = 0
        self.lost = False

    def now(self) -> datetime:
        """The time sleeps are measured by: this machine's clock (or the store's injected one),
        but never earlier than the moment the scheduler woke this pass, so a machine whose
        clock lags the primary's does not sleep again on a deadline the primary saw pass."""
        clock = self._durable.checkpointer.now or now_utc
        current = clock()
        if self._floor is not None and current.timestamp() < self._floor:
            return from_seconds(self._floor)
        return current

    async def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run `fn` once and record its result; on later passes, return the recorded result.

        At least once: a death before the record runs `fn` again, so make it idempotent or use `transact`.
        """
        _check_name(name)
        if name in self._records:
            return self._records[name]
        self._check_alive()
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        return await self._record(name, value)

    async def transact(self, name: str, effect: LibsqlEffect) -> Any:
        """Run `effect(tx)` inside the transaction that records its result: exactly once.

        It runs on a thread holding the database: keep it short, and await nothing inside.
        """
        _check_name(name)
        if name in self._records:
            return self._records[name]
        self._check_alive()
        try:
            value = await self._durable.checkpointer.transact(self._holder, name, effect)
        except FencedError:
            raise StopPass(Lost()) from None
        self._records[name] = value
        self._counted("transact")
        return value

    def _counted(self, kind: str) -> None:
        if self._on_step is not None:
            self._on_step(kind)

    async def sleep_until(self, when: datetime) -> None:
        """Return once `when` has passed; until then end the pass, to be woken at `when`.

        The deadline is recorded when first reached, so `ctx.now() + delta` keeps its first value on replay.
        """
        key = f"$sleep/{self._sleeps}"
        self._sleeps += 1
        if key in self._records:
            deadline = from_seconds(float(self._records[key]))
        else:
            self._check_alive()
            deadline = from_seconds(float(await self._record(key, to_seconds(when))))
        if self.now() < deadline:
            raise StopPass(Sleeping(deadline))

    async def receive(self, key: str | None = None) -> Any:
        """The message filed under `key` (by `arrive`/`supply`), or with no key the next inbox
        entry (by `deliver`/`append`, in the order they were sent); if it is not there yet,
        the pass ends and the arrival starts the next one."""
        refuse_nul(key, "message key")
        if key is not None:
            if key not in self._records:
                await self._reload()
                if key not in self._records:
                    raise StopPass(Waiting(key))
            return self._records[key]
        inbox = [value for name, value in self._records.items() if name.startswith(INBOX)]
        if self._received >= len(inbox):
            await self._reload()
            inbox = [value for name, value in self._records.items() if name.startswith(INBOX)]
            if self._received >= len(inbox):
                raise StopPass(Waiting(None))
        self._received += 1
        return inbox[self._received - 1]

    # -- internals --

    def _check_alive(self) -> None:
        if self.lost:
            raise StopPass(Lost())

    async def _record(self, key: str, value: object) -> object:
        try:
            recorded = await self._durable.checkpointer.record(self._holder, key, value)
        except FencedError:
            raise StopPass(Lost()) from None
        if recorded.fresh:
            self._counted("sleep" if key.startswith("$sleep/") else "result" if key == RESULT else "step")
        self._records[key] = recorded.value
        return recorded.value

    async def _reload(self) -> None:
        fresh = await self._durable.checkpointer.load(self.workflow)
        self._records.clear()
        self._records.update(fresh)


def _check_name(name: str) -> None:
    refuse_nul(name, "step name")
    if not name or name.startswith(_RESERVED):
        raise ValueError(
            f"step name {name!r} is empty or reserved: names starting with {_RESERVED} are the runtime's"
        )


WorkflowFn = Callable[[Context], Awaitable[Any]]
