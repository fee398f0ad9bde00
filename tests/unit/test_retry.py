"""The retry policy: which errors are retried, how, and when it stops; and the replica's sync policy.

The classification is checked against the exact texts libsql 0.1.8 and sqld 0.24.32 produced
(as measured and listed in docs/operations.md, copied verbatim), and against errors a real sqld and a real local
file produce in this run. The policy's behaviour (stop, resolve, recover, logging) is checked
with real failing operations where one can be made on demand (a local file locked by another
connection, a UNIQUE violation), and with plain functions where the point is the policy's logic.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from harel.spec.states import Event
from structlog.testing import capture_logs

from harel_edge import retry
from harel_edge.connection import EdgeConnection
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    PrimaryUnavailableError,
    SchemaTooNewError,
)
from harel_edge.queue import LibsqlTransport
from harel_edge.settings import ExplicitSettings

# ---- the texts, verbatim as measured ---------------------------------------------------

TRANSIENT_TEXTS = {
    # seen in the chaos test on sqld (docker) while the primary was paused and killed
    "remote, interrupted": "Hrana: `cursor error: `error at step 0: (error code: SQLITE_INTERRUPT) `SQLite error: interrupted```",
    "remote, refused": "Hrana: `http error: `error trying to connect: tcp connect error: Connection refused "
    "(os error 111)``",
    "replica connect, refused": "sync error: error trying to connect: tcp connect error: Connection refused "
    "(os error 111)",
    "replica sync, primary gone": "replication error: Timeout performing handshake with primary",
    "replica write, primary gone": 'Write delegation: `status: Unavailable, message: "error trying to connect: '
    'tcp connect error: Connection refused (os error 111)", details: [], metadata: MetadataMap { headers: {} }`',
    "remote, restarted": "Hrana: `api error: `status=400 Bad Request, body=Received an invalid baton``",
    "remote, idle stream": 'Hrana: `api error: `status=400 Bad Request, body={"message":"The stream has expired '
    'due to inactivity","code":"STREAM_EXPIRED"}``',
    "remote, write lock held 5 s": 'Hrana: `stream error: `Error { message: "Transaction timed out", code: '
    '"TRANSACTION_TIMEOUT" }``',
    "replica, write lock held 5 s": "Remote SQlite failure: `2:0:Transaction timed-out`",
    "replica, after a failed transaction": "connection has reached an invalid state, started with Init",
    "local, busy": "database is locked",
    # seen in tests/chaos/test_transport_faults.py when the primary was SIGKILLed mid-request
    "remote, killed mid-request": "Hrana: `http error: `connection closed before message completed``",
    "remote, reset": "Hrana: `http error: `connection error: Connection reset by peer (os error 104)``",
    "replica write, reset": 'Write delegation: `status: Unknown, message: "connection error: Connection reset by '
    'peer (os error 104)", details: [], metadata: MetadataMap { headers: {} }`',
    # seen here opening a new replica while sqld compacted its replication log (benchmarks)
    "replica open during log compaction": "replication error: Replicator client error: status: Unavailable, "
    'message: "snapshot not found", details: [], metadata: MetadataMap { headers: {"content-type": '
    '"application/grpc-web+proto"',
}

PERMANENT_TEXTS = {
    "remote, syntax": 'Hrana: `stream error: `Error { message: "SQL input error: near \\"SELEC\\": syntax error '
    '(at offset 0)", code: "SQL_INPUT_ERROR" }``',
    "replica, syntax": "syntax error around L1:6: `SELEC`",
    "remote, unique": 'Hrana: `stream error: `Error { message: "SQLite error: UNIQUE constraint failed: t.v", '
    'code: "SQLITE_CONSTRAINT" }``',
    "replica, unique": "Remote SQlite failure: `3:2067:UNIQUE constraint failed: t.v`",
    "remote, no such table": 'Hrana: `stream error: `Error { message: "SQLite error: no such table: nosuch", '
    'code: "SQLITE_UNKNOWN" }``',
    "replica, no such table on write": 'Write delegation: `status: PermissionDenied, message: "no such table: '
    'nosuch", details: [], metadata: MetadataMap { headers: {} }`',
    "remote, no token": 'Hrana: `api error: `status=401 Unauthorized, body={"error":"Unauthorized: `Auth string '
    "does not conform to '<scheme> <token>' form`\"}``",
    "remote, bad token": 'Hrana: `api error: `status=401 Unauthorized, body={"error":"Unauthorized: `The JWT is '
    'invalid`"}``',
    "remote, expired token": 'Hrana: `api error: `status=401 Unauthorized, body={"error":"Unauthorized: `The JWT '
    'has expired`"}``',
    "replica write, no token": 'Write delegation: `status: Unauthenticated, message: "AuthError: Auth string does '
    "not conform to '<scheme> <token>' form\"`",
    "replica write, bad token": 'Write delegation: `status: Unauthenticated, message: "AuthError: The JWT is '
    'invalid"`',
    "remote, read-only token writes": 'Hrana: `api error: `status=403 Forbidden, body={"error":"Authorization '
    "forbidden: Current session doesn't not have Write permission to namespace default\"}``",
    "replica, read-only token writes": 'Write delegation: `status: PermissionDenied, message: "Authorization '
    "forbidden: Current session doesn't not have Write permission to namespace default\"`",
    "remote, journal_mode": "unsupported statement",
    # measured: a libsql release newer than 0.1.8 against sqld 0.24
    "replica, driver too new (404)": "failed to pull db export: status=404",
    "replica, driver too new (generation)": "invalid local state: generation is 0",
}


@pytest.mark.parametrize("text", TRANSIENT_TEXTS.values(), ids=TRANSIENT_TEXTS.keys())
def test_the_drivers_link_expiry_and_lock_errors_are_transient(text):
    assert retry.is_transient(ValueError(text))


@pytest.mark.parametrize("text", PERMANENT_TEXTS.values(), ids=PERMANENT_TEXTS.keys())
def test_the_drivers_sql_and_auth_errors_are_permanent(text):
    assert not retry.is_transient(ValueError(text))


@pytest.mark.parametrize(
    "key",
    ["remote, restarted", "remote, idle stream", "remote, killed mid-request"],
    ids=["invalid baton", "STREAM_EXPIRED", "connection closed"],
)
def test_a_dead_remote_stream_asks_for_a_new_connection(key):
    assert retry.needs_reopen(ValueError(TRANSIENT_TEXTS[key]))


@pytest.mark.parametrize(
    "key",
    ["replica, after a failed transaction", "replica write, primary gone", "local, busy", "replica, unique"],
)
def test_errors_after_which_the_connection_still_works_do_not_ask_for_a_new_one(key):
    text = TRANSIENT_TEXTS.get(key) or PERMANENT_TEXTS[key]
    assert not retry.needs_reopen(ValueError(text))


def test_harel_edges_own_errors_are_transient_only_when_the_primary_is_unreachable():
    assert retry.is_transient(PrimaryUnavailableError("cannot reach the primary at http://127.0.0.1:1"))
    for exc in (
        AuthError("the primary refused the credentials (status=401)"),
        ConfigurationError("HAREL_EDGE_SYNC_INTERVAL=0 cannot work (timed out)"),
        SchemaTooNewError("newer"),
    ):
        assert not retry.is_transient(exc), exc


def test_errors_that_are_not_the_drivers_are_never_retried():
    assert not retry.is_transient(KeyError("connection refused"))
    assert not retry.is_transient(AttributeError("'NoneType' object has no attribute 'execute'"))
    assert not retry.is_transient(KeyboardInterrupt())
    assert retry.is_transient(ConnectionResetError())
    assert retry.is_transient(TimeoutError())


# ---- the policy, on a real local file --------------------------------------------------------------


def quick(**overrides):
    """Settings whose backoff is milliseconds, so the policy's logic runs fast."""
    values = dict(profile="local", db_path=":memory:", retry_initial_delay=0.001, retry_max_delay=0.01)
    values.update(overrides)
    return ExplicitSettings.load(**values)


@pytest.fixture
def locked_file(tmp_path: Path):
    """A local file whose write lock is held by another connection, and a writer that waits 20 ms."""
    path = str(tmp_path / "locked.db")
    holder = EdgeConnection(quick(db_path=path))
    holder.execute("CREATE TABLE t (v INTEGER UNIQUE)")
    holder.execute("BEGIN IMMEDIATE")
    writer = EdgeConnection(quick(db_path=path, busy_timeout_ms=20))
    yield holder, writer
    if holder.in_transaction:
        holder.execute("ROLLBACK")
    holder.close()
    writer.close()


def test_a_real_database_is_locked_error_is_transient(locked_file):
    _holder, writer = locked_file
    with pytest.raises(ValueError) as caught:
        writer.execute("INSERT INTO t VALUES (1)")
    assert "database is locked" in str(caught.value)
    assert retry.is_transient(caught.value)


def test_a_lock_that_is_never_released_gives_up_at_the_attempt_limit_and_logs_every_attempt(locked_file):
    _holder, writer = locked_file
    calls = itertools.count(1)

    def attempt():
        next(calls)
        return writer.execute("INSERT INTO t VALUES (1)")

    with capture_logs() as logs, pytest.raises(ValueError, match="database is locked"):
        retry.call_with_retry(quick(retry_attempts=4), "insert", attempt)
    assert next(calls) == 5, "four attempts, then the error"
    retried = [e for e in logs if e["event"] == "retrying"]
    assert [e["attempt"] for e in retried] == [1, 2, 3]
    assert all("database is locked" in e["error"] and e["operation"] == "insert" for e in retried)
    assert [e["event"] for e in logs][-1] == "gave up"
    assert logs[-1]["attempts"] == 4


def test_recover_runs_before_the_next_attempt_and_the_write_then_succeeds(locked_file):
    holder, writer = locked_file
    recovered: list[str] = []

    def recover(exc: BaseException) -> None:
        recovered.append(str(exc))
        holder.execute("ROLLBACK")  # what a sync or a reopen stands for: the obstacle is gone

    with capture_logs() as logs:
        retry.call_with_retry(
            quick(), "insert", lambda: writer.execute("INSERT INTO t VALUES (1)"), recover=recover
        )
    assert recovered == ["database is locked"]
    assert writer.execute("SELECT v FROM t") == [(1,)]
    assert [e["event"] for e in logs] == ["retrying", "succeeded after retrying"]


def test_a_constraint_violation_is_raised_at_once_without_recovery(tmp_path):
    conn = EdgeConnection(quick(db_path=str(tmp_path / "u.db")))
    conn.execute("CREATE TABLE t (v INTEGER UNIQUE)")
    conn.execute("INSERT INTO t VALUES (1)")
    calls, recovered = itertools.count(1), []

    def attempt():
        next(calls)
        return conn.execute("INSERT INTO t VALUES (1)")

    with capture_logs() as logs, pytest.raises(ValueError, match="UNIQUE constraint failed"):
        retry.call_with_retry(quick(), "insert", attempt, recover=recovered.append)
    assert next(calls) == 2 and recovered == []
    assert [e["event"] for e in logs] == ["not retried"]
    conn.close()


def test_resolve_returns_a_write_that_was_applied_though_its_attempt_failed(tmp_path):
    """The ambiguous commit: the row is written, then the reply is lost. Looking finds it, so it
    is not written twice."""
    conn = EdgeConnection(quick(db_path=str(tmp_path / "a.db")))
    conn.execute("CREATE TABLE t (token TEXT)")
    calls = itertools.count(1)

    def attempt():
        next(calls)
        conn.execute("INSERT INTO t VALUES ('tok')")
        raise ValueError(TRANSIENT_TEXTS["remote, idle stream"])  # the reply that never arrived

    def resolve():
        rows = conn.execute("SELECT token FROM t WHERE token = 'tok'")
        return rows[0][0] if rows else None

    with capture_logs() as logs:
        assert retry.call_with_retry(quick(), "write", attempt, resolve=resolve) == "tok"
    assert next(calls) == 2, "attempted once"
    assert conn.execute("SELECT count(*) FROM t") == [(1,)]
    assert any(e["event"] == "ambiguous write resolved" for e in logs)
    conn.close()


def test_resolve_saying_not_applied_lets_the_attempt_run_again():
    outcomes = iter([ValueError("database is locked"), "done"])
    looked: list[int] = []

    def attempt():
        outcome = next(outcomes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert retry.call_with_retry(quick(), "w", attempt, resolve=lambda: looked.append(1)) == "done"
    assert looked == [1]


def test_a_failing_recovery_counts_as_an_attempt_and_the_lookup_waits_until_recovery_succeeds():
    """A replica whose sync fails would answer the look-up from stale data: no look-up until the
    connection is repaired, and the repair itself is retried under the same stop."""
    journal: list[str] = []
    recoveries = iter([ValueError(TRANSIENT_TEXTS["replica sync, primary gone"]), None])

    def attempt():
        journal.append("attempt")
        if journal.count("attempt") == 1:
            raise ValueError(TRANSIENT_TEXTS["replica write, primary gone"])
        return "leased"

    def recover(exc):
        journal.append(f"recover after {'sync' if 'handshake' in str(exc) else 'write'} failure")
        failure = next(recoveries)
        if failure is not None:
            raise failure

    def resolve():
        journal.append("resolve")
        return None

    assert retry.call_with_retry(quick(), "claim", attempt, recover=recover, resolve=resolve) == "leased"
    assert journal == [
        "attempt",
        "recover after write failure",
        "recover after sync failure",
        "resolve",
        "attempt",
    ]


def test_a_failing_lookup_is_retried_with_recovery_before_it():
    journal: list[str] = []
    lookups = iter([ValueError(TRANSIENT_TEXTS["remote, restarted"]), "found"])

    def attempt():
        journal.append("attempt")
        raise ValueError(TRANSIENT_TEXTS["remote, refused"])

    def resolve():
        journal.append("resolve")
        result = next(lookups)
        if isinstance(result, BaseException):
            raise result
        return result

    found = retry.call_with_retry(
        quick(), "ack", attempt, recover=lambda exc: journal.append("recover"), resolve=resolve
    )
    assert found == "found"
    assert journal == ["attempt", "recover", "resolve", "recover", "resolve"]


def test_the_deadline_stops_retrying_before_the_attempt_limit():
    calls = itertools.count(1)

    def attempt():
        next(calls)
        raise ValueError("database is locked")

    settings = quick(
        retry_attempts=100_000, retry_deadline=0.2, retry_initial_delay=0.01, retry_max_delay=0.02
    )
    with pytest.raises(ValueError):
        retry.call_with_retry(settings, "w", attempt)
    assert 1 < next(calls) - 1 < 100_000


def test_each_delay_is_drawn_below_an_exponentially_growing_cap():
    """Full jitter: every delay lies in [0, min(max, initial * 2**(n-1))]."""
    settings = quick(retry_attempts=9, retry_initial_delay=0.0001, retry_max_delay=0.002)

    def attempt():
        raise ValueError("database is locked")

    with capture_logs() as logs, pytest.raises(ValueError):
        retry.call_with_retry(settings, "w", attempt)
    sleeps = [(e["attempt"], e["sleep"]) for e in logs if e["event"] == "retrying"]
    assert len(sleeps) == 8
    for n, sleep in sleeps:
        assert 0 <= sleep <= round(min(0.002, 0.0001 * 2 ** (n - 1)), 3) + 0.001


# ---- ambiguous writes, resolved by looking ---------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_ack_that_failed_and_lost_its_lease_meanwhile_reports_the_lease_lost(tmp_path):
    path = str(tmp_path / "q.db")
    clock = Clock()
    a = LibsqlTransport(settings=quick(db_path=path, prefix="q"), clock=clock)
    b = LibsqlTransport(settings=quick(db_path=path, prefix="q"), clock=clock)
    a.publish("g", Event(kind="x"))
    lease_a = a.claim("a", 10)
    executor, taken = a.core.path.executor, []
    send = executor.execute

    async def locked_while_the_lease_lapses(stmt, **kwargs):
        if stmt.sql.startswith("DELETE") and not taken:  # a's ack is not applied; meanwhile
            clock.now += 20  # its lease lapses and b claims the message
            taken.append(b.claim("b", 10))
            raise ValueError("database is locked")
        return await send(stmt, **kwargs)

    executor.execute = locked_while_the_lease_lapses
    acked_by_a = a.ack(lease_a)
    assert taken[0] is not None and taken[0].seq == lease_a.seq, "b holds the message now"
    assert b.ack(taken[0]), "b processed it and acks it"
    assert not acked_by_a, "a's ack never took effect: it must say its lease was lost"
    for closable in (a, b):
        closable.close()


def test_a_probe_not_served_yet_is_asked_again_until_it_is_and_another_error_is_raised_at_once():
    quick = retry.Backoff(0.001, 0.001, tries=5)
    answers = iter([ValueError("Namespace `a` doesn't exist"), ValueError("Namespace `a` doesn't exist"), "served"])

    def probe():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry.until_served(probe, lambda exc: "doesn't exist" in str(exc), quick) == "served"
    calls = []

    def refused():
        calls.append(1)
        raise ValueError("token refused")

    with pytest.raises(ValueError, match="token refused"):
        retry.until_served(refused, lambda exc: "doesn't exist" in str(exc), quick)
    assert len(calls) == 1

    def never():
        calls.append(1)
        raise ValueError("doesn't exist")

    with pytest.raises(ValueError, match="doesn't exist"):
        retry.until_served(never, lambda exc: "doesn't exist" in str(exc), quick)
    assert len(calls) == 1 + quick.tries
