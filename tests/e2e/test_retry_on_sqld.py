"""The retry policy and the replica's sync policy against a real sqld: the texts it really
produces are classified as they say, and a replica syncs when it opens and on its interval."""

from __future__ import annotations

from pathlib import Path

import pytest
from harel.spec.states import Event

from harel_edge import retry
from harel_edge.connection import EdgeConnection
from harel_edge.errors import AuthError
from harel_edge.queue import LibsqlTransport
from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import wait_until

pytestmark = pytest.mark.sqld


# ---- the replica's sync policy, on a real sqld ----------------------------------------------------


def replica_settings(server, path: Path, **overrides):
    values = dict(
        profile="replica",
        db_path=str(path),
        sync_url=server.http_url,
        auth_token=server.rw_token,
        prefix="q",
        retry_deadline=20.0,
    )
    values.update(overrides)
    return ExplicitSettings.load(**values)


def remote_settings(server, **overrides):
    values = dict(
        profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix="q", retry_deadline=20.0
    )
    values.update(overrides)
    return ExplicitSettings.load(**values)


def test_errors_from_a_real_sqld_are_classified_as_their_texts_say(fresh_sqld_primary, tmp_path):
    server = fresh_sqld_primary
    remote = Statements(remote_settings(server))
    remote.execute("CREATE TABLE t (v INTEGER UNIQUE)")
    remote.execute("INSERT INTO t VALUES (1)")
    replica = EdgeConnection(replica_settings(server, tmp_path / "r.db"))
    read_only = Statements(remote_settings(server, auth_token=server.ro_token))

    def error_of(conn, sql):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - what it is, is the question
            conn.execute(sql)
        return caught.value

    permanent = {
        "remote unique": error_of(remote, "INSERT INTO t VALUES (1)"),
        "remote syntax": error_of(remote, "SELEC 1"),
        "replica syntax": error_of(replica, "SELEC 1"),
        "replica read of a missing table": error_of(replica, "SELECT * FROM nosuch"),
        "remote read-only write": error_of(read_only, "INSERT INTO t VALUES (2)"),
    }
    for name, exc in permanent.items():
        assert not retry.is_transient(exc), f"{name}: {exc}"
    assert isinstance(permanent["remote read-only write"], AuthError)

    server.kill()
    down = error_of(remote, "SELECT 1")
    assert retry.is_transient(down), f"remote, primary killed: {down}"
    server.restart()
    assert remote.execute("SELECT v FROM t") == [(1,)], "the next request after a restart works by itself"
    for conn in (remote, replica, read_only):
        conn.close()


def test_a_replica_opened_with_a_refused_token_fails_at_once_with_an_auth_error(fresh_sqld_primary, tmp_path):
    """A replica's sync reports a bad token like an unreachable primary; the start-up probe tells
    them apart, so the token error is not retried until the deadline."""
    settings = replica_settings(
        fresh_sqld_primary, tmp_path / "r.db", auth_token="not-a-jwt", retry_attempts=2
    )
    with pytest.raises(AuthError, match="refused the credentials") as caught:
        EdgeConnection(settings)
    assert "not-a-jwt" not in str(caught.value)


def test_a_replica_is_synced_when_it_opens(fresh_sqld_primary, tmp_path):
    remote = LibsqlTransport(settings=remote_settings(fresh_sqld_primary))
    remote.publish("g", Event(kind="before-open"))
    replica = EdgeConnection(replica_settings(fresh_sqld_primary, tmp_path / "r.db"))
    assert replica.execute("SELECT count(*) FROM q_transport_messages") == [(1,)], "a local read, no sync asked for"
    remote.close()
    replica.close()


def test_a_replica_with_a_sync_interval_sees_remote_writes_without_asking_and_one_without_does_not(
    fresh_sqld_primary, tmp_path
):
    remote = LibsqlTransport(settings=remote_settings(fresh_sqld_primary))
    periodic = EdgeConnection(replica_settings(fresh_sqld_primary, tmp_path / "p.db", sync_interval=0.1))
    manual = EdgeConnection(replica_settings(fresh_sqld_primary, tmp_path / "m.db"))

    def depth(replica: EdgeConnection) -> int:
        return replica.execute("SELECT count(*) FROM q_transport_messages")[0][0]

    assert depth(periodic) == depth(manual) == 0
    remote.publish("g", Event(kind="remote-write"))
    wait_until(lambda: depth(periodic) == 1, timeout=10, interval=0.02, what="the periodic sync")
    assert depth(manual) == 0, "no sync_interval: nothing arrives until .sync()"
    manual.sync()
    assert depth(manual) == 1
    for closable in (remote, periodic, manual):
        closable.close()


def test_a_replica_reads_its_own_publish_claim_and_ack_at_once(fresh_sqld_primary, tmp_path):
    replica = LibsqlTransport(settings=replica_settings(fresh_sqld_primary, tmp_path / "r.db"))
    replica.publish("g", Event(kind="mine"))
    assert replica.depth() == 1, "its own publish, read locally without a sync"
    lease = replica.claim("w", 30)
    assert lease is not None and lease.event.kind == "mine"
    ((locked_by,),) = replica.execute("SELECT locked_by FROM q_transport_messages")
    assert locked_by == lease.token, "its own claim, read locally"
    assert replica.ack(lease)
    assert replica.depth() == 0, "its own ack, read locally"
    replica.close()


