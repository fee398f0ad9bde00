"""The loops one worker process runs (harel's worker; the durable workflows run
`DurableWorker.run`) and how each outlives a failure or a stop, kept apart from the wiring in
`harel_edge.worker`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from harel.engine.aio.distributed import AsyncWorker

from harel_edge import observability, retry
from harel_edge.queue.statements import next_work_sql
from harel_edge.window import InFlightWindow

log = structlog.get_logger("harel_edge.worker")

IDLE_MAX = 0.5  # the longest pause between claims of an idle worker: a new event waits at most this
SWEEP_EVERY = 0.25  # seconds between sweeps of due timers while events are in flight
# With a doorbell, an idle database whose limits may hold work back polls at least this often
# (a rate limit's window or another worker's slot frees work that nobody rings for).
LIMITED_WAIT = 1.0


class EdgeAsyncWorker(AsyncWorker):
    """harel's async worker with a window of events in flight that follows the link
    (`InFlightWindow`, at most `concurrency`), telling the transport when handling a message
    raised (the nack then records the error and counts the delivery for dead-lettering);
    `handling` holds the tasks handling a message, which a stop waits for."""

    def __init__(self, *args: Any, launch_slice: int | None = None, **kwargs: Any) -> None:
        """`launch_slice`: events a claim brought to start before the loop gets a turn (None: all)."""
        super().__init__(*args, **kwargs)
        self.launch_slice = launch_slice
        self.handling: set[asyncio.Task] = set()
        self._sweep: asyncio.Task | None = None  # the sweep of due timers made while events are in flight
        self._swept_at = float("-inf")
        self._stop: asyncio.Event | None = None  # set: runs end after the member in hand
        self.window = InFlightWindow(self.concurrency, visibility=self.visibility)
        observability.watch_window(self.window)

    async def run(
        self, stop: asyncio.Event, idle_sleep: float = 0.005, idle_max: float = IDLE_MAX, *, rung: asyncio.Event | None = None
    ) -> None:
        """harel's loop (claim while the window has room, sweep due timers when nothing is
        claimable, nack a message whose handling raised) with the window in place of its
        fixed semaphore; an idle one polls less and less often, up to `idle_max` seconds. With a
        doorbell (`rung`, set when a publisher rang), an idle pause ends at the ring, or when a
        lease, delay or timer of the database ends (`_next_work_in`)."""
        pending: set[asyncio.Task] = set()
        self._stop = stop

        async def run_one(head) -> None:  # noqa: ANN001 - harel's Lease
            began = time.monotonic()
            await self.handle_run(head)
            self.window.settled(time.monotonic() - began, len(pending))
            self.transport.concurrency = self.window.size
            self.transport.path.executor.make_room(self.window.size)

        self.transport.concurrency = self.window.size
        idle, launched = idle_sleep, 0
        while not stop.is_set():
            # The window, within a deployment's share of it; holding nothing, a claim asks for one.
            if pending and len(pending) >= self.transport.concurrency:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                continue
            fired, due = None, None
            if idle > idle_sleep and not pending:
                # Polling an idle queue: the claim and the sweep of due timers share one exchange.
                if rung is None:
                    lease, fired = await asyncio.gather(self._claim(), self.fire_due_timers())
                else:
                    lease, fired, due = await asyncio.gather(self._claim(), self.fire_due_timers(), self._next_work_in())
            else:
                lease = await self._claim()
            if lease is None:
                if self.transport.buffered:
                    continue  # a commit's claim brought leases meanwhile: no pause before them
                if pending:
                    # Busy: due timers are swept beside the events in flight, never in their way.
                    self._sweep_beside()
                    await asyncio.wait(pending, timeout=idle_sleep, return_when=asyncio.FIRST_COMPLETED)
                elif (fired if fired is not None else await self.fire_due_timers()) == 0:
                    # An idle worker polls less and less often: a queue with nothing to do costs
                    # the primary a request or two a second, not hundreds.
                    pause = idle if due is None else min(idle, max(due, idle_sleep))
                    if await rest(stop, rung, pause):
                        idle = idle_sleep  # rung: claim at once, then back off again from the start
                        continue
                    idle = min(max(idle, idle_sleep) * 2, max(idle_max, idle_sleep))
                continue
            idle = idle_sleep
            task = asyncio.create_task(run_one(lease))
            pending.add(task)
            task.add_done_callback(pending.discard)
            self.window.launched(len(pending))
            launched += 1
            if self.launch_slice and launched % self.launch_slice == 0:
                await asyncio.sleep(0)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._sweep is not None:
            await asyncio.gather(self._sweep, return_exceptions=True)

    async def _next_work_in(self) -> float | None:
        """Seconds until work that no ring announces: a lease, delay or park ending, a timer due
        (on this machine's clock against the primary's); at most LIMITED_WAIT while
        limits may hold free work back. None: nothing is waiting."""
        path = self.transport.path
        ends, timer, limited = (await path.execute(next_work_sql(path.queue, path.store.timers))).rows[0]
        times = [float(t) for t in (ends, timer) if t is not None]
        due = None if not times else max(0.0, min(times) - time.time())
        if limited:
            return LIMITED_WAIT if due is None else min(due, LIMITED_WAIT)
        return due

    def _sweep_beside(self) -> None:
        """Sweep due timers in a task of its own, one at a time and at most every SWEEP_EVERY."""
        now = time.monotonic()
        if (self._sweep is None or self._sweep.done()) and now - self._swept_at >= SWEEP_EVERY:
            self._swept_at = now
            self._sweep = asyncio.create_task(self._sweep_logged())

    async def _sweep_logged(self) -> None:
        try:
            await self.fire_due_timers()
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("sweeping due timers failed; the next sweep tries again", error=f"{type(exc).__name__}: {str(exc)[:200]}")

    async def step(self) -> bool:
        """Handle at most one claim's run (one group's head and the events after it)."""
        lease = await self._claim()
        if lease is None:
            return False
        await self.handle_run(lease)
        return True

    async def handle_run(self, head) -> None:  # noqa: ANN001 - harel's Lease
        """Handle a claim's run of one group, its head and the events after it, one after another,
        then send what the run kept: one commit for the lot (queue/runs.py). A failing event is
        given back to come again later; the ones after it wait behind it, untouched. A stop ends
        the run after the event in hand."""
        run = self.transport.run_of(head)
        lease = head
        try:
            if run is None:
                await self._handle(head)
            else:
                while (lease := run.next()) is not None:
                    await self._handle(lease)
                    await asyncio.sleep(0)  # a member handled in memory never suspends: the loop's turn
                    if self._stop is not None and self._stop.is_set():
                        run.halted = True  # a stop finishes the event in hand; the rest go back
        except Exception:
            log.exception("handling an event failed; it comes back later", group_id=lease.group_id,
                          kind=lease.event.kind, retry_in=self.suspend_recheck)
            try:
                await self.transport.nack(lease, delay=self.suspend_recheck)
            except Exception as exc:  # noqa: BLE001 - its lease lapses and it is delivered again
                log.warning("could not give an event back; it comes back when its lease lapses",
                            group_id=lease.group_id, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        if run is not None:
            try:
                await self.store.settle(run)
            except Exception as exc:  # noqa: BLE001 - what it kept comes back, to be handled again
                log.warning("a run's commit failed; its events come back", group_id=head.group_id,
                            error=f"{type(exc).__name__}: {str(exc)[:200]}")

    async def _handle(self, lease) -> bool:  # noqa: ANN001 - harel's Lease
        task = asyncio.current_task()
        if task is not None and task not in self.handling:
            self.handling.add(task)
            task.add_done_callback(self.handling.discard)
        try:
            return await super()._handle(lease)
        except Exception as exc:
            if await self._unknown_machine(lease, exc):
                return True
            self.transport.failed(lease, exc)
            raise

    async def _unknown_machine(self, lease, exc: Exception) -> bool:  # noqa: ANN001 - harel's Lease
        """An event for an execution of a machine this worker does not run fails the same way at
        every delivery: dead-lettered at once, with that reason as one line."""
        if not isinstance(exc, KeyError):
            return False
        exe = await self.store.load(lease.group_id)
        if exe is None or exe.definition_id in self.definitions or exe.definition_fqn is not None:
            return False
        runs = ", ".join(sorted(self.definitions)) or "none"
        self.transport.failed(
            lease,
            f"unknown machine {exe.definition_id!r}: this worker runs {runs}; start workers with its "
            "definitions, then `harel-edge dead-letter requeue`",
        )
        await self.transport.bury(lease)
        return True


async def rest(stop: asyncio.Event, rung: asyncio.Event | None, seconds: float) -> bool:
    """Pause `seconds`, or until `stop` or a ring; True (and the ring taken) when it rang."""
    await retry.wait_any([stop] if rung is None else [stop, rung], seconds)
    if rung is not None and rung.is_set():
        rung.clear()
        return True
    return False


async def wait_ended(tasks: set[asyncio.Task], within: float) -> None:
    """Wait until every task in `tasks` has ended; those still running after `within` seconds
    are cancelled (and waited for)."""
    if tasks:
        await asyncio.wait(list(tasks), timeout=within)
    for task in list(tasks):
        task.cancel()
    while tasks:
        await asyncio.wait(list(tasks))
