"""Which errors are worth another attempt, and the tenacity policies that make them.

The one module that uses tenacity; what it decides and why: docs/operations.md ("How harel_edge reacts").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from harel_edge import observability
from harel_edge.errors import HarelEdgeError, PrimaryUnavailableError
from harel_edge.loop_thread import LoopThread
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.retry")
T = TypeVar("T")

# Texts libsql 0.1.8 and sqld 0.24 were seen to produce (docs/operations.md): the text decides,
# because statuses mislead (a missing table on a replica is PermissionDenied).

# Never transient, checked first: the same statement would fail the same way again.
PERMANENT_MARKERS = (
    "constraint failed",
    "sqlite_constraint",
    "syntax error",
    "sql_input_error",
    "no such table",
    "no such column",
    "has no column",
    "duplicate column",
    "datatype mismatch",
    "unsupported statement",
    "status=401",
    "status=403",
    "unauthenticated",
    "unauthorized",
    "authorization forbidden",
    "forbidden",
    "readonly",
    "read-only",
    "not a database",
    "malformed",
    # libsql >= 0.1.9 against sqld 0.24: a newer sync protocol than the server speaks
    "failed to pull db export",
    "invalid local state",
)

# Transient: the link, sqld's own expiries, or the write lock being held by someone else.
TRANSIENT_MARKERS = (
    "database is locked",
    "database is busy",
    "transaction timed out",
    "transaction timed-out",
    "transaction_timeout",
    "stream_expired",
    "stream expired",
    "stream has expired",
    "invalid baton",
    "connection has reached an invalid state",
    "connection refused",
    "connection reset",
    "connection closed",
    "broken pipe",
    "error trying to connect",
    "tcp connect error",
    "status: unavailable",
    "timeout performing handshake",
    "sync error",
    "replication error",
    "snapshot not found",  # a new replica asked while sqld was compacting its log into a snapshot
    "timed out",
    "status=502",
    "status=503",
    "status=504",
    "unexpected eof",
    "channel closed",
    "sqlite_interrupt",  # sqld interrupted the statement (a stream dropped, the server stopping): rolled back
)

# After these only a new connection works; "invalid state" is left out on purpose
# (docs/operations.md, "How retry.py decides").
REOPEN_MARKERS = (
    "stream_expired",
    "stream expired",
    "stream has expired",
    "invalid baton",
    "connection closed",
    "broken pipe",
    "unexpected eof",
)


# ---- the pauses of the loops that go on after a failure, each named for its reason ----------------


@dataclass(frozen=True)
class Backoff:
    """The pause before try `n` (from 1): doubling from `first`, never over `most`; `tries`: how
    many before the caller gives up this way (0: never)."""

    first: float
    most: float
    tries: int = 0

    def pause(self, n: int) -> float:
        return min(self.first * 2 ** (n - 1), self.most)


# A grouped transaction whose BEGIN did not get the primary's write lock (sqld refuses writers at
# once while it checkpoints: docs/operations.md) goes again whole after this; after `tries` its
# units go one a request. Sent apart at once, they all met the same checkpoint, one transaction
# (and one fsync) each; the pauses add up to more than a busy primary's checkpoint takes (docs/executor.md).
WRITE_LOCK_HELD = Backoff(0.01, 0.1, tries=20)
# A worker's loop that ended on an error (harel's loop ends at its first) starts again after this.
LOOP_FAILED = Backoff(0.5, 10.0)
# The durable worker's look for ready workflows failed (the primary unreachable): looks again after this.
TAKE_FAILED = Backoff(0.1, 5.0)
LOOP_FORGETS_AFTER = 60.0  # a loop that ran this long before failing starts its pauses again from the first
# A sqld namespace just made may answer "doesn't exist" for a moment (measured on sqld 0.24 with
# hundreds of namespaces, under load: docs/deploy.md); asked again after these pauses (about 12 s in all).
NAMESPACE_BEING_MADE = Backoff(0.05, 2.0, tries=12)


def until_served(probe: Callable[[], T], is_not_yet: Callable[[Exception], bool], reason: Backoff) -> T:
    """`probe()`, asked again after `reason`'s pauses while it raises what `is_not_yet` says will
    pass; its last error once `reason.tries` are spent."""
    tries = 1
    while True:
        try:
            return probe()
        except Exception as exc:
            if tries >= reason.tries or not is_not_yet(exc):
                raise
            log.debug("not served yet; asking again", error=_error_text(exc), again_in=reason.pause(tries))
            time.sleep(reason.pause(tries))
            tries += 1


async def pause_or_stop(reason: Backoff, failures: int, stop: asyncio.Event | None) -> None:
    """Wait `reason`'s pause after `failures` failures in a row, or until `stop` is set."""
    await wait_any([stop] if stop is not None else [], reason.pause(failures))


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Wait `seconds`, or until one of `events` is set: the one wait of every pause a stop or a
    wake-up must cut short (a worker's rest, a durable loop's poll, a retry's back-off)."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        if waits:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(seconds)
    finally:
        for waiting_on in waits:
            waiting_on.cancel()


async def restarting(name: str, run: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    """Run `run()` until it returns or `stop` is set; when it fails, log it and start it again
    after LOOP_FAILED's pause: harel's loop ends at its first error, a worker outlives the primary."""
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            await run()
            return
        except Exception as exc:  # noqa: BLE001 - logged, and the loop starts again
            failures = 1 if time.monotonic() - started > LOOP_FORGETS_AFTER else failures + 1
            log.error("loop failed; restarting", loop=name, error=_error_text(exc), restart_in=LOOP_FAILED.pause(failures))
            await pause_or_stop(LOOP_FAILED, failures, stop)


def is_transient(exc: BaseException) -> bool:
    """True when the operation may succeed if tried again unchanged."""
    if isinstance(exc, HarelEdgeError):
        # harel_edge's own errors are decided, not guessed: only "unreachable" passes with time.
        return isinstance(exc, PrimaryUnavailableError)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if not isinstance(exc, (ValueError, RuntimeError, OSError)):
        return False
    text = str(exc).lower()
    if any(marker in text for marker in PERMANENT_MARKERS):
        return False
    return any(marker in text for marker in TRANSIENT_MARKERS)


def needs_reopen(exc: BaseException) -> bool:
    """True when the driver's connection itself is unusable after this error."""
    text = str(exc).lower()
    return any(marker in text for marker in REOPEN_MARKERS)


def _error_text(exc: BaseException | None) -> str | None:
    """An error as a log field: scrubbed before it is cut short, so no piece of a token is left."""
    return None if exc is None else scrub(f"{type(exc).__name__}: {exc}")[:300]


def _log_attempt(operation: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        observability.record_retry(operation)
        log.warning(
            "retrying",
            operation=operation,
            attempt=state.attempt_number,
            elapsed=round(state.seconds_since_start, 3),
            sleep=round(state.next_action.sleep, 3) if state.next_action else None,
            error=_error_text(exc),
        )

    return before_sleep


def policy(settings: EdgeSettings, operation: str, kind: type[Retrying] | type[AsyncRetrying] = Retrying):
    """The retry policy for one operation, from the settings: full-jitter exponential delays, stopped
    at `retry_attempts` attempts or `retry_deadline` seconds, whichever comes first.
    """
    return kind(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=settings.retry_initial_delay, max=settings.retry_max_delay),
        stop=stop_after_attempt(settings.retry_attempts) | stop_after_delay(settings.retry_deadline),
        before_sleep=_log_attempt(operation),
        reraise=True,
    )


async def acall_with_retry(
    settings: EdgeSettings,
    operation: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    recover: Callable[[BaseException], Awaitable[None]] | None = None,
    resolve: Callable[[], Awaitable[T | None]] | None = None,
) -> T:
    """The one retry driver: run `attempt` under the policy; return its result or raise its last error.

    Before every resend `recover(error)` repairs what the failure broke, then `resolve()` looks
    up whether the failed attempt applied after all: a value other than None is the result."""
    try:
        return await attempt()
    except Exception as exc:
        if not is_transient(exc):
            log.info("not retried", operation=operation, attempt=1, error=_error_text(exc))
            raise
        failed: Exception = exc
    return await _retry(settings, operation, failed, attempt, recover, resolve)


async def _retry(
    settings: EdgeSettings,
    operation: str,
    failed: Exception,
    attempt: Callable[[], Awaitable[T]],
    recover: Callable[[BaseException], Awaitable[None]] | None,
    resolve: Callable[[], Awaitable[T | None]] | None,
) -> T:
    """The tries after a transient `failed` first one (the event loop runs during back-off)."""
    tries, first = 1, True  # attempts sent so far
    try:
        async for tried in policy(settings, operation, AsyncRetrying):
            with tried:
                if first:
                    first = False
                    raise failed  # the first attempt, counted by the policy
                try:
                    if recover is not None:
                        await recover(failed)
                    if resolve is not None:
                        found = await resolve()
                        if found is not None:
                            log.info("ambiguous write resolved", operation=operation, outcome="applied", attempts=tries)
                            return found
                    tries += 1
                    result = await attempt()
                except Exception as exc:
                    failed = exc
                    if not is_transient(exc):
                        log.info("not retried", operation=operation, attempt=tries, error=_error_text(exc))
                    raise
                log.info("succeeded after retrying", operation=operation, attempts=tries)
                return result
    except Exception as exc:
        if is_transient(exc):
            log.error("gave up", operation=operation, attempts=tries, error=_error_text(exc))
        raise
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def call_with_retry(
    settings: EdgeSettings,
    operation: str,
    attempt: Callable[[], T],
    *,
    recover: Callable[[BaseException], None] | None = None,
    resolve: Callable[[], T | None] | None = None,
) -> T:
    """`acall_with_retry` for sync callers (on a thread, or with no loop): the first attempt
    here; the tries after a transient failure through the one driver, on a loop of their own."""
    try:
        return attempt()
    except Exception as exc:
        if not is_transient(exc):
            log.info("not retried", operation=operation, attempt=1, error=_error_text(exc))
            raise
        failed: Exception = exc

    async def again() -> T:
        return attempt()

    async def repair(error: BaseException) -> None:
        if recover is not None:
            recover(error)

    async def look_up() -> T | None:
        return resolve() if resolve is not None else None

    # The tries (and their sleeps) on a loop thread of their own: this caller may be on a
    # running loop's thread, which a sync call blocks anyway.
    bridge = LoopThread("harel-edge-retry")
    try:
        return bridge.call(_retry(settings, operation, failed, again, repair, look_up))
    finally:
        bridge.stop()
