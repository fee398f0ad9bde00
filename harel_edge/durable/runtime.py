"""Run a workflow durably: an async function whose steps are recorded, and replayed on every pass.

How a pass runs, ends and is taken over, with a worked example: docs/durable.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from harel_edge import observability
from harel_edge.durable.checkpointer import LibsqlEffect
from harel_edge.durable.durable import LibsqlDurable
from harel_edge.durable.types import (  # the outcomes, importable from here as before
    INBOX,
    Busy,
    Cancelled,
    Delivery,
    FencedError,
    Finished,
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
from harel_edge.retry import TAKE_FAILED
from harel_edge.schema_control import RESULT  # the key of a finished workflow's return value
from harel_edge.settings import DEFAULT_MAX_DELIVERIES

log = logging.getLogger(__name__)

BUDGET = timedelta(minutes=15)  # the longest one pass may hold its workflow
ALIVE = timedelta(seconds=30)  # how long a pass keeps it without a renewal
MAX_ERROR_CHARS = 4000  # of a failed pass's error, kept on its queue row and in its dead letter
_RESERVED = ("$", INBOX)


StepHook = Callable[[str], None]  # what was recorded: "step", "transact", "sleep" or "result"
PassHook = Callable[[Delivery, Outcome], None]


class _Stop(BaseException):
    """Ends a pass from inside the function. A BaseException, so `except Exception` in
    workflow code cannot swallow it (the way asyncio.CancelledError works)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


# ---- the function's view of its pass -------------------------------------------------------


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
            raise _Stop(Lost()) from None
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
            raise _Stop(Sleeping(deadline))

    async def receive(self, key: str | None = None) -> Any:
        """The message filed under `key` (by `arrive`/`supply`), or with no key the next inbox
        entry (by `deliver`/`append`, in the order they were sent); if it is not there yet,
        the pass ends and the arrival starts the next one."""
        refuse_nul(key, "message key")
        if key is not None:
            if key not in self._records:
                await self._reload()
                if key not in self._records:
                    raise _Stop(Waiting(key))
            return self._records[key]
        inbox = [value for name, value in self._records.items() if name.startswith(INBOX)]
        if self._received >= len(inbox):
            await self._reload()
            inbox = [value for name, value in self._records.items() if name.startswith(INBOX)]
            if self._received >= len(inbox):
                raise _Stop(Waiting(None))
        self._received += 1
        return inbox[self._received - 1]

    # -- internals --

    def _check_alive(self) -> None:
        if self.lost:
            raise _Stop(Lost())

    async def _record(self, key: str, value: object) -> object:
        try:
            recorded = await self._durable.checkpointer.record(self._holder, key, value)
        except FencedError:
            raise _Stop(Lost()) from None
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


# ---- one pass --------------------------------------------------------------------------------


async def _run_pass(
    durable: LibsqlDurable,
    holder: Pass,
    fn: WorkflowFn,
    alive: timedelta,
    delivery: list[Delivery | None],
    on_step: StepHook | None = None,
) -> Outcome:
    """Replay `fn` under `holder`, keeping the claim (and the delivery in `delivery[0]`) alive."""
    records = await durable.checkpointer.load(holder.workflow)
    if RESULT in records:
        return Finished(records[RESULT])
    taken = delivery[0]
    floor = None if taken is None else taken.receipt - durable.scheduler.lease_seconds
    ctx = Context(durable, holder, records, floor, on_step)
    keeper = asyncio.create_task(_keep(durable, holder, alive, delivery, ctx))
    try:
        value = await fn(ctx)
        ctx._check_alive()
        return Finished(await ctx._record(RESULT, value))
    except _Stop as stop:
        return stop.outcome
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper


async def _keep(
    durable: LibsqlDurable, holder: Pass, alive: timedelta, delivery: list[Delivery | None], ctx: Context
) -> None:
    """Renew the claim and extend the delivery until cancelled; mark the pass lost if refused."""
    lease = durable.scheduler.lease
    every = min(alive, lease).total_seconds() / 3
    while True:
        await asyncio.sleep(every)
        try:
            if not await durable.checkpointer.renew(holder, alive):
                ctx.lost = True
                return
            if delivery[0] is not None:
                extending = asyncio.ensure_future(durable.scheduler.extend(delivery[0], lease))
                try:
                    delivery[0] = await asyncio.shield(extending)
                except asyncio.CancelledError:
                    # The pass ended mid-extend. The write lands anyway, and the pass's wake_at
                    # or done must carry the receipt it wrote: wait for it, then stop.
                    try:
                        delivery[0] = await extending
                    except Exception:  # noqa: BLE001 - then the receipt held is the last known
                        log.warning("extending workflow %r failed", holder.workflow, exc_info=True)
                    raise
        except Exception:  # noqa: BLE001 - a failed renewal is retried; fencing keeps writes safe
            log.warning("renewing workflow %r failed; retrying", holder.workflow, exc_info=True)


async def run_durably(
    durable: LibsqlDurable,
    workflow: str,
    fn: WorkflowFn,
    *,
    budget: timedelta = BUDGET,
    alive: timedelta = ALIVE,
) -> Outcome:
    """Run one pass of `workflow` now, in this process, and say how it ended.

    The scheduler carries on from there; an exception from `fn` propagates with the claim released.
    """
    holder = await durable.checkpointer.claim(workflow, budget, alive)
    if holder is None:
        return Cancelled() if await durable.checkpointer.cancelled(workflow) else Busy()
    outcome: Outcome | None = None
    try:
        outcome = await _run_pass(durable, holder, fn, alive, [None])
    finally:
        if not isinstance(outcome, Lost):
            await durable.checkpointer.release(holder)
    if isinstance(outcome, Lost) and await durable.checkpointer.cancelled(workflow):
        return Cancelled()
    if isinstance(outcome, Sleeping):
        await durable.scheduler.make_ready(workflow, outcome.until)
    elif isinstance(outcome, Finished):
        await durable.scheduler.drop(workflow)
    return outcome


@dataclass(eq=False)
class DurableWorker:
    """Runs passes of the workflows the scheduler hands out with `fn` (one per namespace).

    After `max_failed_passes` failed passes in a row (0: never) the workflow is dead-lettered.
    """

    durable: LibsqlDurable
    fn: WorkflowFn
    budget: timedelta = BUDGET
    alive: timedelta = ALIVE
    busy_retry: timedelta = timedelta(seconds=1)
    max_failed_passes: int = DEFAULT_MAX_DELIVERIES
    on_step: StepHook | None = None  # called with "step", "transact", "sleep" or "result" per new record
    on_pass: PassHook | None = None  # called with each pass's delivery and outcome

    async def run(
        self, stop: asyncio.Event | None = None, *, passes: int = 1, poll: timedelta = timedelta(seconds=1)
    ) -> None:
        """Run passes until `stop` is set (or the task is cancelled), up to `passes` at once (a pass
        mostly waits for its commits, which passes side by side share), taking as many ready
        workflows in one statement as there is room for. Errors are logged, not fatal; a stop is
        noticed within `poll`, and the passes in progress finish."""
        running: set[asyncio.Task] = set()
        failures = 0
        while stop is None or not stop.is_set():
            if len(running) >= passes:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                taken = await self.durable.scheduler.take_ready(passes - len(running), poll)
                failures = 0
            except Exception:  # noqa: BLE001 - a worker outlives a lost link
                failures += 1
                log.exception("durable worker: looking for ready workflows failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for((stop or asyncio.Event()).wait(), TAKE_FAILED.pause(failures))
                continue
            for delivery in taken:
                task = asyncio.create_task(self._run_pass(delivery))
                running.add(task)
                task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def _run_pass(self, delivery: Delivery) -> None:
        try:
            await self.handle(delivery)
        except Exception:  # noqa: BLE001 - counted on its row by `handle`; the workflow comes back
            log.warning("durable worker: a pass of workflow %r failed", delivery.workflow, exc_info=True)

    async def run_once(self, within: timedelta) -> Outcome | None:
        """Take the next ready workflow (waiting up to `within`) and run a pass of it."""
        delivery = await self.durable.scheduler.next_ready(within)
        if delivery is None:
            return None
        return await self.handle(delivery)

    async def handle(self, delivery: Delivery) -> Outcome:
        """Claim, run one pass, and tell the scheduler what comes next."""
        scheduler = self.durable.scheduler
        holder = await self.durable.checkpointer.claim(delivery.workflow, self.budget, self.alive)
        if holder is None:
            if await self.durable.checkpointer.cancelled(delivery.workflow):
                await scheduler.done(delivery)  # its row is gone with the cancel; never offer it again
                self._passed(delivery, Cancelled())
                return Cancelled()
            await scheduler.extend(delivery, self.busy_retry)
            self._passed(delivery, Busy())
            return Busy()
        box: list[Delivery | None] = [delivery]
        outcome: Outcome | None = None
        failure: Exception | None = None
        try:
            outcome = await _run_pass(self.durable, holder, self.fn, self.alive, box, self.on_step)
        except Exception as exc:  # noqa: BLE001 - counted below, then raised as it was
            failure = exc
        finally:
            if not isinstance(outcome, Lost):
                await self.durable.checkpointer.release(holder)
        current = box[0]
        assert current is not None
        if failure is not None:
            await self._failed(current, failure)
            raise failure
        if isinstance(outcome, Sleeping):
            await scheduler.wake_at(current, outcome.until)
        elif isinstance(outcome, Finished | Waiting):
            await scheduler.done(current)
        elif isinstance(outcome, Lost) and await self.durable.checkpointer.cancelled(delivery.workflow):
            outcome = Cancelled()  # fenced off by a cancel: the cancel already dropped its row
        self._passed(delivery, outcome)
        return outcome

    def _passed(self, delivery: Delivery, outcome: Outcome) -> None:
        if self.on_pass is not None:
            self.on_pass(delivery, outcome)

    async def _failed(self, delivery: Delivery, error: Exception) -> None:
        """Count the failed pass on the scheduler's row (dead-lettering it at the limit). Best
        effort: if this write fails too, the pass is simply not counted."""
        text = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
        scheduler = self.durable.scheduler
        try:
            recorded = await scheduler.failed(delivery, text, self.max_failed_passes)
        except Exception:  # noqa: BLE001 - the pass's own error is what the caller sees
            log.warning("could not count the failed pass of workflow %r", delivery.workflow, exc_info=True)
            return
        if recorded is not None and recorded[1]:
            observability.DEAD_LETTERED.labels("workflow").inc()
            log.warning(
                "dead-lettered workflow %r of namespace %r after %d failed passes: %s",
                delivery.workflow,
                scheduler.namespace,
                recorded[0],
                text[:300],
            )
