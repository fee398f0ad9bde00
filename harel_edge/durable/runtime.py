"""Run a workflow durably: an async function whose steps are recorded, and replayed on every pass.

How a pass runs, ends and is taken over, with a worked example: docs/durable.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from harel_edge import observability, retry
from harel_edge.durable.context import Context, StepHook, StopPass, WorkflowFn
from harel_edge.durable.durable import LibsqlDurable
from harel_edge.durable.types import (  # the outcomes, importable from here as before
    Busy,
    Cancelled,
    Delivery,
    Finished,
    Lost,
    Outcome,
    Pass,
    Sleeping,
    Waiting,
)
from harel_edge.schema_control import RESULT  # the key of a finished workflow's return value
from harel_edge.settings import DEFAULT_MAX_DELIVERIES

log = logging.getLogger(__name__)

BUDGET = timedelta(minutes=15)  # the longest one pass may hold its workflow
ALIVE = timedelta(seconds=30)  # how long a pass keeps it without a renewal
MAX_ERROR_CHARS = 4000  # of a failed pass's error, kept on its queue row and in its dead letter


PassHook = Callable[[Delivery, Outcome], None]


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
    except StopPass as stop:
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
                taken = await self.durable.scheduler.take_ready(passes - len(running), poll, stop)
                failures = 0
            except Exception:  # noqa: BLE001 - a worker outlives a lost link
                failures += 1
                log.exception("durable worker: looking for ready workflows failed")
                await retry.pause_or_stop(retry.TAKE_FAILED, failures, stop)
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
