"""A primary (sqld or Turso) over Hrana over HTTP, from one event loop that it never blocks.

Each exchange is one Hrana request on a stream closed in the same exchange (docs/executor.md).
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
import structlog

from harel_edge import observability
from harel_edge.errors import AuthError, PrimaryUnavailableError
from harel_edge.executor import (
    ClosesOnce,
    ExecutorClosedError,
    Result,
    StatementError,
    Stmt,
    built,
    waiting,
    with_one_tail,
)
from harel_edge.executor.hrana import (
    NOT_RUN,
    STREAM_PIPELINE,
    grouped_batch,
    grouped_outcomes,
    lock_refused,
    result_of,
    statement_error,
    stmt_json,
    transaction_request,
    unit_result,
)
from harel_edge.executor.stream import HranaSession
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.executor.remote")

JSON_BODY = {"Content-Type": "application/json"}  # the body is encoded here (orjson), not by aiohttp
# Callers one turn of the loop wakes when a shared transaction's answer comes: each goes on with
# its event (a transition, the next commit), and 128 at once held the loop for milliseconds.
SETTLE_SLICE = 16
# A grouped batch whose BEGIN did not get the primary's write lock (sqld refuses writers at once
# while it checkpoints: docs/operations.md) goes again whole after a pause, doubling from
# LOCK_PAUSE up to LOCK_PAUSE_MOST, for up to LOCK_TRIES tries; then its units go one a request,
# as after any transaction that ended before they ran. Sent apart at once, they all met the same
# checkpoint, one transaction (and one fsync) each.
LOCK_PAUSE = 0.01
LOCK_PAUSE_MOST = 0.1
LOCK_TRIES = 20  # 1.65 s of pauses in all: a checkpoint of 5 s of a busy primary's writes took 0.4 s

# A pipeline of many commits is still small (a few KB a unit); sqld answers it in milliseconds.
# `sock_read` bounds how long a unit may wait for an answer that never comes; `connect` includes
# the wait for a free connection of the pool, `sock_connect` the TCP (and TLS) handshake alone.
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30.0, sock_connect=5.0, sock_read=30.0)


def http_base_url(url: str) -> str:
    """The HTTP address of a primary: `libsql://` is Turso's HTTPS (the settings refuse `ws://`)."""
    parts = urlsplit(url)
    scheme = {"libsql": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http://, https:// or libsql:// address")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def exchanges_for(events: int, units: int) -> int:
    """Exchanges in flight that carry a window of `events` twice over, `units` a request; at least 2."""
    return max(2, math.ceil(2 * events / units))


def environment_proxy(url: str) -> str | None:
    """The proxy that HTTP_PROXY / HTTPS_PROXY / NO_PROXY name for `url`, if any."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


@dataclass
class _Unit:
    future: asyncio.Future
    single: bool  # one statement executed on its own, not a transaction
    stmts: list[Stmt]
    alone: bool = False  # sent as its own request, never in a shared transaction
    build: Callable[[], list[Stmt]] | None = None  # a deferred unit's statements, made when it is sent
    tail: bool = False  # a deferred unit, made: it runs after the others
    refused: int = 0  # shared transactions that could not begin: the primary's write lock was held

    @property
    def statements(self) -> int:
        """0 for a single execute, else the transaction's statement count."""
        return 0 if self.single else len(self.stmts)

    def request(self) -> dict[str, Any]:
        """The unit as a request of its own, encoded only when it goes alone: most units share
        a transaction (`grouped_batch`), which encodes their statements itself."""
        if self.single:
            return {"type": "execute", "stmt": stmt_json(self.stmts[0])}
        return transaction_request(self.stmts)


class HranaExecutor(ClosesOnce):
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
        server = settings.server
        if not server:
            raise ValueError(f"the {settings.profile} profile has no primary to send statements to")
        self.where = server
        token = settings.auth_token.get_secret_value().strip() if settings.auth_token else ""
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._base_url = http_base_url(server)
        # Exchanges in flight: 2 until a worker's window asks for more (`make_room`), up to enough
        # to carry the widest window twice over (a far primary needs all of it on the wire at
        # once, and exchanges leave part full).
        self._max_requests = max_requests or 2
        self._most_requests = max(self._max_requests, exchanges_for(settings.max_in_flight, max_units))
        self._proxy = environment_proxy(self._base_url)
        self._client: aiohttp.ClientSession | None = None  # opened on the loop, at the first exchange
        self._max_units = max_units
        self._linger = settings.commit_linger if linger is None else linger
        self._slots = asyncio.Semaphore(self._max_requests)
        self._queue: list[_Unit] = []
        self._draining = False
        self._drain_task: asyncio.Task | None = None
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self.exchanges = 0  # HTTP exchanges sent, for benchmarks and tests

    def __repr__(self) -> str:  # never the token
        return f"<HranaExecutor {self.where}>"

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
        if self._client is not None:
            await self._client.close()

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, opened on the loop that uses it. The environment's proxy is looked
        up once, here, not at every request (aiohttp's `trust_env` does it in a thread each time)."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                headers=self._headers,
                timeout=TIMEOUT,
                connector=aiohttp.TCPConnector(limit=self._most_requests),
            )
        return self._client

    # ---- coalescing --------------------------------------------------------------------------

    def _submit(
        self, stmts: list[Stmt], *, single: bool = False, build: Callable[[], list[Stmt]] | None = None
    ) -> asyncio.Future:
        if self.closed:
            raise ExecutorClosedError(f"{self!r} was closed: open a new transport or store to go on")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Unit(future, single, stmts, build=build))
        if not self._draining:
            self._start_drain()
        return future

    def _start_drain(self) -> None:
        self._draining = True
        self._drain_task = self._spawn(self._drain())
        self._drain_task.add_done_callback(self._drained)

    def _drained(self, _task: asyncio.Task) -> None:
        """A drain cancelled before it began leaves its units queued: another one sends them."""
        self._draining = False
        if self._queue:
            self._start_drain()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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

    async def _exchange(self, units: list[_Unit]) -> None:
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
                body = self._encode(requests, None)
                del requests  # the body alone stays while the exchange is on the wire
                await asyncio.sleep(0)  # a turn of the loop between putting the batch together and sending it
                results = await self._send(body)
                if any(stored.get("type") != "ok" for stored in results[:-1]):
                    # Steps naming a text the primary did not store could not run; which ran is
                    # for the caller's lookup to find, as after a lost answer.
                    raise PrimaryUnavailableError(
                        f"the primary at {self.where} refused to store a statement's text; the "
                        "outcome of the transaction is unknown and is looked up before any retry"
                    )
                results = results[-1:]
            else:
                results = await self.post([u.request() for u in units])
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

    async def _settle_together(self, units: list[_Unit], answer: dict[str, Any], layout: list[tuple[int, int]]) -> None:
        """Each unit's answer from the shared transaction; those it never ran go again alone.
        The claim carried at the tail is answered first (its leases start sooner), then the others
        `SETTLE_SLICE` at a time, a turn of the loop between slices: no turn wakes every caller."""
        try:
            if answer.get("type") != "ok":
                raise statement_error(answer.get("error") or {}, 0)
            batch = answer["response"]["result"]
            if lock_refused(batch):
                tries = max(u.refused for u in units) + 1  # sends of this group refused so far
                if tries < LOCK_TRIES:
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

    async def _again_together(self, units: list[_Unit], tries: int) -> None:
        """Queue `units` again, as one group, after a pause: their transaction did not begin (the
        primary's write lock was held, `tries` times now), so none of them ran."""
        for unit in units:
            unit.refused = tries
        observability.RETRIES.labels(operation="executor.write_lock").inc()
        try:
            await asyncio.sleep(min(LOCK_PAUSE * 2 ** (tries - 1), LOCK_PAUSE_MOST))
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

    def _settle_with_tail(self, unit: _Unit, tail: _Unit, answer: dict[str, Any]) -> None:
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

    async def post(
        self, requests: list[dict[str, Any]], *, stream: HranaSession | None = None
    ) -> list[dict[str, Any]]:
        """One HTTP exchange; raises what a caller's retry policy can classify. Without a
        `stream` the exchange opens a stream and closes it (no stream is left to expire after a
        worker dies, nor holds one of the primary's connections); with one, it goes on that stream."""
        return await self._send(self._encode([orjson.dumps(r) for r in requests], stream), stream)

    def _encode(self, requests: list[bytes], stream: HranaSession | None) -> _Body:
        """The exchange's body from its requests' JSON (orjson: a tenth of the json module's time).
        Only bytes stay while the exchange is on the wire: a grouped batch's dicts took about
        four times the memory of its JSON."""
        count = len(requests)
        if stream is None:
            url, baton, requests = STREAM_PIPELINE, b"null", [*requests, b'{"type":"close"}']
        else:
            url, baton = stream.url, orjson.dumps(stream.baton)
        target = url if url.startswith(("http://", "https://")) else self._base_url + url
        data = b'{"baton":' + baton + b',"requests":[' + b",".join(requests) + b"]}"
        return _Body(target, data, count)

    async def _send(self, body: _Body, stream: HranaSession | None = None) -> list[dict[str, Any]]:
        """Send an encoded exchange (`post`) and read its answer's results."""
        self.exchanges += 1
        try:
            async with self._http().post(body.url, data=body.data, headers=JSON_BODY, proxy=self._proxy) as response:
                status, content = response.status, await response.read()
        except TimeoutError as exc:
            raise PrimaryUnavailableError(
                f"the primary at {self.where} did not answer in time ({type(exc).__name__}); its "
                "outcome is unknown and is looked up before any retry"
            ) from None
        except aiohttp.ClientError as exc:
            raise PrimaryUnavailableError(
                f"cannot reach the primary at {self.where} ({type(exc).__name__}: {scrub(str(exc))}): check that it "
                "runs and that HAREL_EDGE_URL / HAREL_EDGE_SYNC_URL is its HTTP address"
            ) from None
        log.debug("hrana exchange", requests=body.requests, status=status)  # a line a request, when debugging
        if status != 200:
            raise _status_error(self.where, status, scrub(content.decode(errors="replace")))
        try:
            answer = orjson.loads(content)
            results = answer["results"]
            if not isinstance(results, list) or len(results) < body.requests:
                raise ValueError("fewer results than requests")
            if stream is not None:
                stream.follow(answer.get("baton"), answer.get("base_url"))
        except (ValueError, KeyError, TypeError) as exc:
            raise PrimaryUnavailableError(
                f"the primary at {self.where} sent an answer that is not Hrana ({exc}); its outcome "
                "is unknown and is looked up before any retry"
            ) from None
        return results[: body.requests]


@dataclass(frozen=True)
class _Body:
    url: str
    data: bytes = field(repr=False)  # the statements' arguments: an application's data
    requests: int  # how many results the answer must hold


def _status_error(where: str, status: int, text: str) -> Exception:
    """What an HTTP answer other than 200 means to the caller's retry policy."""
    if status in (401, 403):
        return AuthError(
            f"the primary at {where} refused the credentials (HTTP {status}: {text[:200]}): set "
            "HAREL_EDGE_AUTH_TOKEN to a valid read-write token"
        )
    if status >= 500 or status == 429:
        return PrimaryUnavailableError(f"the primary at {where} answered HTTP {status} ({text[:200]}); retried under the retry policy")
    return ValueError(f"the primary at {where} rejected the request: HTTP {status} {text[:300]}")


def _settle(unit: _Unit, outcome: Any) -> None:
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
