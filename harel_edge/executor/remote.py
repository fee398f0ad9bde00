"""A primary (sqld or Turso) over Hrana over HTTP, from one event loop that it never blocks.

Each exchange is one Hrana request on a stream closed in the same exchange (docs/executor.md).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import structlog

from harel_edge import observability
from harel_edge.errors import PrimaryUnavailableError
from harel_edge.executor.base import (
    Coalescing,
    ExecutorClosedError,
    Result,
    StatementError,
    Stmt,
    Unit,
    built,
    waiting,
    with_one_tail,
)
from harel_edge.executor.hrana import (
    NOT_RUN,
    grouped_batch,
    grouped_outcomes,
    lock_refused,
    result_of,
    statement_error,
    stmt_json,
    transaction_request,
    unit_result,
)
from harel_edge.executor.http import PrimaryHttp
from harel_edge.executor.stream import HranaSession
from harel_edge.retry import WRITE_LOCK_HELD
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.executor.remote")

# Callers one turn of the loop wakes when a shared transaction's answer comes: each goes on with
# its event (a transition, the next commit), and 128 at once held the loop for milliseconds.
SETTLE_SLICE = 16

def exchanges_for(events: int, units: int) -> int:
    """Exchanges in flight that carry a window of `events` twice over, `units` a request; at least 2."""
    return max(2, math.ceil(2 * events / units))


def _request(unit: Unit) -> dict[str, Any]:
    """A unit as a request of its own, encoded only when it goes alone: most units share a
    transaction (`grouped_batch`), which encodes their statements itself."""
    if unit.single:
        return {"type": "execute", "stmt": stmt_json(unit.stmts[0])}
    return transaction_request(unit.stmts)


class HranaExecutor(Coalescing):
    """Units of work for a remote primary; safe to use from many coroutines of one event loop.

    Up to `max_requests` exchanges in flight (2 by default, raised by `make_room` up to what
    `max_in_flight` needs), `max_units` units each; `linger` applies only under load.
    Few, large exchanges: each unit is a write transaction of its own, and exchanges that overlap
    on the primary wait for its write lock by polling (docs/executor.md).
    """

    commits_share_fsync = False

    def __init__(
        self,
        settings: EdgeSettings,
        *,
        max_requests: int | None = None,
        max_units: int = 128,
        linger: float | None = None,
    ) -> None:
        # Exchanges in flight: 2 until a worker's window asks for more (`make_room`), up to enough
        # to carry the widest window twice over (a far primary needs all of it on the wire at
        # once, and exchanges leave part full).
        self._max_requests = max_requests or 2
        self._most_requests = max(self._max_requests, exchanges_for(settings.max_in_flight, max_units))
        self.http = PrimaryHttp(settings, pool=self._most_requests)
        self.where = self.http.where
        self._max_units = max_units
        self._linger = settings.commit_linger if linger is None else linger
        self._slots = asyncio.Semaphore(self._max_requests)
        self._start_queue()
        self._in_flight = 0

    def __repr__(self) -> str:  # never the token
        return f"<HranaExecutor {self.where}>"

    @property
    def exchanges(self) -> int:
        """HTTP exchanges sent, for benchmarks and tests."""
        return self.http.exchanges

    async def execute(self, stmt: Stmt, *, volatile: bool = False) -> Result:  # noqa: ARG002 - the primary decides durability
        return await self._submit([stmt], single=True)

    async def transaction(self, stmts: list[Stmt]) -> list[Result]:
        if not stmts:
            return []
        return await self._submit(stmts)

    def deferred(self, build: Callable[[], list[Stmt]]) -> asyncio.Future:
        return self._submit([], build=build)

    def make_room(self, events: int) -> None:
        wanted = min(exchanges_for(events, self._max_units), self._most_requests)
        while self._max_requests < wanted:
            self._max_requests += 1
            self._slots.release()

    async def _close(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.http.close()

    # ---- coalescing --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Start exchanges while units wait, at most `max_requests` at once. Cancelled, it still
        sends what is queued (its callers wait for it), then ends cancelled."""
        cancelled = False
        while self._queue:
            try:
                await self._slots.acquire()
            except asyncio.CancelledError:
                cancelled = True
                continue
            try:
                # Linger only under load (other units waiting or in flight): a lone caller
                # is sent at once, and concurrent events get time to join one exchange.
                if self._linger > 0 and (waiting(self._queue) > 1 or self._in_flight > 0):
                    await asyncio.sleep(self._linger)
            except asyncio.CancelledError:
                cancelled = True
            units = self._queue[: self._max_units]
            del self._queue[: len(units)]
            units = built(units)
            if not units:
                self._slots.release()
                continue
            self._spawn(self._exchange(units))
        if cancelled:
            raise asyncio.CancelledError

    async def _exchange(self, units: list[Unit]) -> None:
        """Several units with a write among them share one transaction (one commit on the
        primary); otherwise each unit is a request of its own in the exchange."""
        paired = with_one_tail(units) and units[0].statements > 0 and not any(u.alone for u in units)
        grouped = not paired and len(units) > 1 and any(u.statements for u in units) and not any(u.alone for u in units)
        self._in_flight += 1
        try:
            if paired:
                results = await self.post([transaction_request(units[0].stmts, units[1].stmts[0])])
            elif grouped:
                requests, layout = grouped_batch([u.stmts for u in units])
                body = self.http.encode(requests, None)
                del requests  # the body alone stays while the exchange is on the wire
                await asyncio.sleep(0)  # a turn of the loop between putting the batch together and sending it
                results = await self.http.send(body)
                if any(stored.get("type") != "ok" for stored in results[:-1]):
                    # Steps naming a text the primary did not store could not run; which ran is
                    # for the caller's lookup to find, as after a lost answer.
                    raise PrimaryUnavailableError(
                        f"the primary at {self.where} refused to store a statement's text; the "
                        "outcome of the transaction is unknown and is looked up before any retry"
                    )
                results = results[-1:]
            else:
                results = await self.post([_request(u) for u in units])
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else PrimaryUnavailableError(
                f"the request to the primary at {self.where} was cancelled in flight; its outcome "
                "is unknown and is looked up before any retry"
            )
            for unit in units:
                if not unit.future.done():
                    unit.future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._in_flight -= 1
            self._slots.release()
        if paired:
            self._settle_with_tail(units[0], units[1], results[0])
            return
        if grouped:
            await self._settle_together(units, results[0], layout)
            return
        for unit, result in zip(units, results, strict=False):
            if unit.future.done():
                continue
            try:
                unit.future.set_result(unit_result(result, unit.statements))
            except Exception as exc:  # noqa: BLE001 - handed to the unit's caller
                unit.future.set_exception(exc)

    async def _settle_together(self, units: list[Unit], answer: dict[str, Any], layout: list[tuple[int, int]]) -> None:
        """Each unit's answer from the shared transaction; those it never ran go again alone.
        The claim carried at the tail is answered first (its leases start sooner), then the others
        `SETTLE_SLICE` at a time, a turn of the loop between slices: no turn wakes every caller."""
        try:
            if answer.get("type") != "ok":
                raise statement_error(answer.get("error") or {}, 0)
            batch = answer["response"]["result"]
            if lock_refused(batch):
                tries = max(u.refused for u in units) + 1  # sends of this group refused so far
                if tries < WRITE_LOCK_HELD.tries:
                    await self._again_together(units, tries)
                    return
            outcomes = grouped_outcomes(batch, layout, [len(u.stmts) for u in units])
        except Exception as exc:  # noqa: BLE001 - handed to every unit's caller
            outcomes = [exc] * len(units)
        again = [unit for unit, outcome in zip(units, outcomes, strict=True) if outcome is NOT_RUN and not unit.future.done()]
        if again:
            for unit in again:
                unit.alone = True
            self._queue[:0] = again
            if not self._draining:
                self._start_drain()
        pairs = sorted(zip(units, outcomes, strict=True), key=lambda pair: not pair[0].tail)
        for start in range(0, len(pairs), SETTLE_SLICE):
            if start:
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:  # the outcomes are known: every caller still gets its own
                    for unit, outcome in pairs[start:]:
                        _settle(unit, outcome)
                    raise
            for unit, outcome in pairs[start : start + SETTLE_SLICE]:
                _settle(unit, outcome)

    async def _again_together(self, units: list[Unit], tries: int) -> None:
        """Queue `units` again, as one group, after a pause: their transaction did not begin (the
        primary's write lock was held, `tries` times now), so none of them ran."""
        for unit in units:
            unit.refused = tries
        observability.RETRIES.labels(operation="executor.write_lock").inc()
        try:
            await asyncio.sleep(WRITE_LOCK_HELD.pause(tries))
        except asyncio.CancelledError:
            error = PrimaryUnavailableError(
                f"the primary at {self.where} held its write lock and the executor was closed before "
                "the transaction could go again; nothing of it ran"
            )
            for unit in units:
                if not unit.future.done():
                    unit.future.set_exception(error)
            raise
        self._queue[:0] = [unit for unit in units if not unit.future.done()]
        if not self._draining:
            self._start_drain()

    def _settle_with_tail(self, unit: Unit, tail: Unit, answer: dict[str, Any]) -> None:
        """The answer of `transaction_request` with a tail: the unit's results or error, and the tail's (none
        when the unit failed, since it did not run)."""
        n = len(unit.stmts)
        try:
            if answer.get("type") != "ok":
                raise statement_error(answer.get("error") or {}, 0)
            batch = answer["response"]["result"]
            errors, steps = batch.get("step_errors") or [], batch["step_results"]
            for step, error in enumerate(errors[: n + 1]):
                if error is not None:
                    raise statement_error(error, step - 1)
            if steps[n + 2] is None:  # the COMMIT did not run: nothing was applied
                raise StatementError("the transaction was not committed", step=n)
            results = [result_of(raw) for raw in steps[1 : n + 1]]
        except Exception as exc:  # noqa: BLE001 - handed to the unit's caller
            _answer(unit.future, exception=exc)
            _answer(tail.future, result=[])
            return
        _answer(unit.future, result=results)
        error = errors[n + 1] if len(errors) > n + 1 else None
        if error is not None:
            _answer(tail.future, exception=statement_error(error, 0))
        else:
            _answer(tail.future, result=[result_of(steps[n + 1])] if steps[n + 1] is not None else [])

    def session(self) -> HranaSession:
        """A stream of its own on the primary, for work that holds a transaction across round
        trips (a Python effect); its statements are not coalesced with other units."""
        if self.closed:
            raise ExecutorClosedError(f"{self!r} was closed: open a new store to go on")
        return HranaSession(self)

    async def post(self, requests: list[dict[str, Any]], *, stream: HranaSession | None = None) -> list[dict[str, Any]]:
        """One HTTP exchange (`PrimaryHttp.post`), for a stream of this executor."""
        return await self.http.post(requests, stream=stream)

def _settle(unit: Unit, outcome: Any) -> None:
    """Hand a unit's caller its outcome from a shared transaction (none if it went again alone)."""
    if unit.future.done() or outcome is NOT_RUN:
        return
    if isinstance(outcome, Exception):
        unit.future.set_exception(outcome)
    else:
        results = [result_of(raw) for raw in outcome]
        unit.future.set_result(results[0] if unit.statements == 0 else results)


def _answer(future: asyncio.Future, *, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
