"""Which errors are worth another attempt, and the tenacity policies that make them.

This is the only module that uses tenacity, so there is one place to read to know how
harel_edge behaves on a flaky link to the primary: exponential backoff with full jitter, a cap
on each delay, a cap on attempts AND on total time (always a stop), and a log line for every
attempt that failed.

The libsql driver raises `ValueError` with the server's or the transport's message for almost
everything, so the classification is by message. A transient error is one where the same
statement may succeed later unchanged: the link (refused, reset, timed out), sqld's own
expiries (an idle Hrana stream after 10 s, a transaction aborted after 5 s holding the write
lock), a busy or locked file, a failed sync. Constraint violations, syntax errors, missing
tables and refused credentials are never transient: retrying them only delays the error.

What is *not* decided here is whether a failed write happened anyway (an ambiguous commit):
only the caller knows how to look (a claim token, a step row). `call_with_retry` gives it the
two moments it needs: `recover` repairs the connection (reopen a dead remote stream, sync a
replica so its local reads show the primary as it is now), and `resolve` looks the write up,
only once recovery succeeded, so a look-up never answers from a stale replica.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.retry")
T = TypeVar("T")

# The texts below are the ones libsql 0.1.8 and sqld 0.24 were seen to produce (see
# docs/operations.md, "Errors"); match on the text, not on a status: a replica reports a write
# to a missing table as PermissionDenied, and a bad token on sync as a handshake timeout.

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
)

# After these the driver's connection is dead for good (a remote stream is gone after sqld
# restarted or after ~10 s idle): only a new connection works. "connection has reached an
# invalid state" is deliberately absent: the driver's next statement works (docs/operations.md),
# and reopening a replica while its primary is down fails, where the old one still reads.
REOPEN_MARKERS = (
    "stream_expired",
    "stream expired",
    "stream has expired",
    "invalid baton",
    "connection closed",
    "broken pipe",
    "unexpected eof",
)


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
    return None if exc is None else f"{type(exc).__name__}: {str(exc)[:300]}"


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
    """The retry policy for one operation, from the settings.

    Delays are drawn uniformly from [0, min(retry_max_delay, retry_initial_delay * 2**n)]
    ("full jitter"), so workers that failed together do not retry together. It stops at
    `retry_attempts` attempts or once `retry_deadline` seconds have passed, whichever is first.
    """
    return kind(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=settings.retry_initial_delay, max=settings.retry_max_delay),
        stop=stop_after_attempt(settings.retry_attempts) | stop_after_delay(settings.retry_deadline),
        before_sleep=_log_attempt(operation),
        reraise=True,
    )


def call_with_retry(
    settings: EdgeSettings,
    operation: str,
    attempt: Callable[[], T],
    *,
    recover: Callable[[BaseException], None] | None = None,
    resolve: Callable[[], T | None] | None = None,
) -> T:
    """Run `attempt` under the policy; return its result or raise its last error.

    After a transient failure, and before anything else is sent, `recover(exc)` repairs the
    connection (given the latest error: reopen, sync). If it fails, that failure counts as the
    attempt's and recovery is tried again after the next delay. Once it succeeds, and if an
    attempt may have reached the primary, `resolve()` looks up whether it took effect: a value
    other than None is the result and nothing is sent again; None means "not applied", and
    `attempt` runs again.

    The first attempt runs before any policy object exists: nearly every call succeeds at once,
    and building tenacity's machinery for it cost ~75 us, a tenth of a local claim.
    """
    try:
        return attempt()
    except BaseException as exc:
        if not is_transient(exc):
            log.info("not retried", operation=operation, attempt=1, error=_error_text(exc))
            raise
        first = exc
    latest: BaseException | None = None  # the transient failure recovery must repair
    unsettled = False  # an attempt was sent and its outcome is unknown
    tries = 0
    try:
        for tried in policy(settings, operation):
            with tried:
                tries += 1
                try:
                    if tries == 1:
                        unsettled = True
                        raise first  # the attempt that already failed, counted by the policy
                    if latest is not None:
                        if recover is not None:
                            recover(latest)
                        if unsettled and resolve is not None:
                            found = resolve()
                            if found is not None:
                                log.info(
                                    "ambiguous write resolved",
                                    operation=operation,
                                    outcome="applied",
                                    attempts=tries,
                                )
                                return found
                        unsettled = False
                        latest = None
                    unsettled = True
                    result = attempt()
                    unsettled = False
                except BaseException as exc:
                    latest = exc
                    if not is_transient(exc):
                        log.info("not retried", operation=operation, attempt=tries, error=_error_text(exc))
                    raise
                if tries > 1:
                    log.info("succeeded after retrying", operation=operation, attempts=tries)
                return result
    except BaseException as exc:
        if is_transient(exc):
            log.error("gave up", operation=operation, attempts=tries, error=_error_text(exc))
        raise
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def acall_with_retry(
    settings: EdgeSettings,
    operation: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    resolve: Callable[[], Awaitable[T | None]] | None = None,
) -> T:
    """`call_with_retry` for coroutines over a stateless link (nothing to repair between tries):
    after a transient failure `resolve()` looks the write up, and a value other than None is
    the result; otherwise `attempt` runs again. The event loop keeps running during back-off."""
    try:
        return await attempt()
    except Exception as exc:
        if not is_transient(exc):
            raise
        failed: Exception = exc
    tries = 1
    try:
        async for tried in policy(settings, operation, AsyncRetrying):
            with tried:
                if tries == 1:
                    tries += 1
                    raise failed  # the first attempt, counted by the policy
                tries += 1
                if resolve is not None:
                    found = await resolve()
                    if found is not None:
                        log.info("ambiguous write resolved", operation=operation, outcome="applied", attempts=tries)
                        return found
                result = await attempt()
                log.info("succeeded after retrying", operation=operation, attempts=tries)
                return result
    except Exception as exc:
        if is_transient(exc):
            log.error("gave up", operation=operation, attempts=tries, error=_error_text(exc))
        raise
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover
