"""The sqld launchers of harel_edge.testing, against a real sqld on both backends.

Why: every sqld test in the project stands on these launchers, so they are checked for
what the other tests take for granted: the server answers, auth is really enforced, a
replica node and an embedded replica really follow the primary, and the fault-injection
handles (kill, pause, restart) really do what they say, in a container and as a process.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jwt
import libsql
import pytest

from harel_edge.testing import (
    SqldServer,
    SqldStartError,
    SqldUnavailable,
    choose_backend,
    generate_keys,
    start_sqld_primary,
    start_sqld_replica_node,
    wait_until,
)
from harel_edge.testing.sqld.stress import concurrent_writes

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sqld


@pytest.fixture
def primary(sqld_backend: str) -> Iterator[SqldServer]:
    """A fresh primary on the backend under test."""
    with start_sqld_primary(backend=sqld_backend) as server:
        yield server


def _connect(server: SqldServer, token: str | None = None):
    return libsql.connect(server.http_url, auth_token=token or server.rw_token)


def _post_pipeline(server: SqldServer, token: str | None) -> int:
    """POST a Hrana pipeline with a plain SELECT (with ``token`` if given); return the HTTP status.

    Callers assign the status before asserting on it, so that pytest's report of a failed
    assertion never prints the token.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = json.dumps(
        {"requests": [{"type": "execute", "stmt": {"sql": "SELECT 1"}}, {"type": "close"}]}
    ).encode()
    request = urllib.request.Request(  # noqa: S310 - loopback URL we built
        f"{server.http_url}/v2/pipeline",
        data=body,
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _table_exists(conn, name: str) -> bool:
    sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (name,)).fetchone()[0] == 1


# --------------------------------------------------------------------------- serving


def test_a_started_primary_answers_health_and_a_query_over_http(primary: SqldServer) -> None:
    assert primary.http_url.startswith("http://127.0.0.1:")
    assert primary.grpc_url is not None and primary.grpc_url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{primary.http_url}/health", timeout=5) as response:  # noqa: S310
        assert response.status == 200
    conn = _connect(primary)
    conn.execute("CREATE TABLE greetings (word TEXT)")
    conn.execute("INSERT INTO greetings VALUES ('hello')")
    conn.commit()
    assert conn.execute("SELECT word FROM greetings").fetchall() == [("hello",)]
    assert primary.ready_seconds is not None and primary.ready_seconds < primary.startup_timeout


def test_the_session_primary_fixture_serves_queries(sqld_primary: SqldServer) -> None:
    assert _connect(sqld_primary).execute("SELECT 40 + 2").fetchone() == (42,)


def test_a_started_primary_keeps_answering_sixteen_concurrent_writers(primary: SqldServer) -> None:
    # With sqld's automatic checkpoint (after the commit that fills 1,000 pages) this load wedged
    # sqld 0.24.32 for good before 400 commits in every run; the launcher's timer checkpoint keeps it answering.
    outcome = asyncio.run(concurrent_writes(primary.http_url, primary.rw_token, writers=16, batches=60))
    assert outcome.finished, f"sqld stopped answering after {outcome.committed} commits"
    assert outcome.committed == 16 * 60


# --------------------------------------------------------------------------- auth


def test_a_read_only_token_is_refused_on_a_write(primary: SqldServer) -> None:
    writer = _connect(primary)
    writer.execute("CREATE TABLE items (n INTEGER)")
    writer.commit()
    reader = _connect(primary, primary.ro_token)
    assert reader.execute("SELECT count(*) FROM items").fetchone() == (0,)
    with pytest.raises(ValueError, match="doesn't not have Write permission"):
        reader.execute("INSERT INTO items VALUES (1)")
        reader.commit()
    assert writer.execute("SELECT count(*) FROM items").fetchone() == (0,)


def test_a_request_without_a_token_is_refused(primary: SqldServer) -> None:
    status = _post_pipeline(primary, None)
    assert status == 401
    status = _post_pipeline(primary, primary.rw_token)
    assert status == 200


def test_a_token_signed_by_another_key_is_refused(primary: SqldServer) -> None:
    stranger = generate_keys().token("rw")
    status = _post_pipeline(primary, stranger)
    assert status == 401
    with pytest.raises(ValueError, match="401 Unauthorized"):
        _connect(primary, stranger).execute("SELECT 1").fetchall()


def test_an_expired_token_is_refused(primary: SqldServer) -> None:
    # sqld allows 60 s of clock skew past "exp", so this one expired an hour ago.
    expired = primary.token("rw", expires_in=-3600)
    status = _post_pipeline(primary, expired)
    assert status == 401


@pytest.mark.parametrize("key_format", ["pem", "base64"])
def test_sqld_accepts_the_public_key_in_either_file_format(sqld_backend: str, key_format: str) -> None:
    with start_sqld_primary(backend=sqld_backend, key_format=key_format) as server:
        status = _post_pipeline(server, server.rw_token)
        assert status == 200
        status = _post_pipeline(server, None)
        assert status == 401


def test_the_tokens_carry_the_access_claim_sqld_reads() -> None:
    keys = generate_keys()
    public = keys._private_key.public_key()  # noqa: SLF001 - checking the signature
    assert jwt.decode(keys.token("rw"), public, algorithms=["EdDSA"])["a"] == "rw"
    assert jwt.decode(keys.token("ro"), public, algorithms=["EdDSA"])["a"] == "ro"
    assert "a" not in jwt.decode(keys.token(None), public, algorithms=["EdDSA"])
    assert jwt.get_unverified_header(keys.token())["alg"] == "EdDSA"


def test_a_server_repr_never_shows_its_tokens_or_keys(primary: SqldServer) -> None:
    shown = repr(primary) + str(primary) + repr(primary.keys)
    assert primary.rw_token and primary.rw_token not in shown
    assert primary.ro_token and primary.ro_token not in shown
    assert primary.keys is not None
    assert primary.keys.private_key_pem.decode() not in shown
    assert "<redacted>" in repr(primary)


# --------------------------------------------------------------------------- replication


def test_a_replica_node_forwards_writes_to_the_primary(primary: SqldServer) -> None:
    primary_conn = _connect(primary)
    primary_conn.execute("CREATE TABLE notes (body TEXT)")
    primary_conn.commit()
    with start_sqld_replica_node(primary) as replica:
        assert replica.role == "replica" and replica.grpc_url is None
        replica_conn = _connect(replica)
        wait_until(lambda: _table_exists(replica_conn, "notes"), what="the replica node seeing the table")

        def insert() -> bool:
            # Measured on sqld 0.24.32: for tens of milliseconds after a new replica node's
            # reads see a table, a write it forwards can still fail with "no such table".
            # Retry only that; the exact row count below proves no attempt applied twice.
            try:
                replica_conn.execute("INSERT INTO notes VALUES ('written on the replica node')")
                replica_conn.commit()
            except ValueError as exc:
                if "no such table" not in str(exc):
                    raise
                return False
            return True

        wait_until(insert, what="a write forwarded by the replica node")
        assert primary_conn.execute("SELECT body FROM notes").fetchall() == [("written on the replica node",)]


def test_the_replica_node_fixture_follows_its_primary(
    fresh_sqld_primary: SqldServer, sqld_replica_node: SqldServer
) -> None:
    table = "followed"
    primary_conn = _connect(fresh_sqld_primary)
    primary_conn.execute(f"CREATE TABLE {table} (n INTEGER)")
    primary_conn.execute(f"INSERT INTO {table} VALUES (7)")
    primary_conn.commit()
    replica_conn = _connect(sqld_replica_node)
    wait_until(
        lambda: (
            _table_exists(replica_conn, table)
            and replica_conn.execute(f"SELECT n FROM {table}").fetchall() == [(7,)]
        ),
        what="the replica node catching up",
        timeout=30.0,
    )


def test_an_embedded_replica_syncs_from_the_primary(primary: SqldServer, tmp_path: Path) -> None:
    primary_conn = _connect(primary)
    primary_conn.execute("CREATE TABLE events (name TEXT)")
    primary_conn.execute("INSERT INTO events VALUES ('from the primary')")
    primary_conn.commit()

    local = libsql.connect(str(tmp_path / "edge.db"), sync_url=primary.http_url, auth_token=primary.rw_token)
    local.sync()
    assert local.execute("SELECT name FROM events").fetchall() == [("from the primary",)]

    local.execute("INSERT INTO events VALUES ('from the edge')")
    local.commit()
    assert sorted(primary_conn.execute("SELECT name FROM events").fetchall()) == [
        ("from the edge",),
        ("from the primary",),
    ]


# --------------------------------------------------------------------------- faults


def test_a_restarted_primary_keeps_its_data(primary: SqldServer) -> None:
    conn = _connect(primary)
    conn.execute("CREATE TABLE kept (n INTEGER)")
    conn.execute("INSERT INTO kept VALUES (1), (2)")
    conn.commit()
    url = primary.http_url
    primary.restart()
    assert primary.http_url == url
    assert _connect(primary).execute("SELECT sum(n) FROM kept").fetchone() == (3,)


def test_a_killed_primary_restarts_on_the_same_port_with_its_committed_data(
    primary: SqldServer,
) -> None:
    conn = _connect(primary)
    conn.execute("CREATE TABLE durable (n INTEGER)")
    conn.execute("INSERT INTO durable VALUES (42)")
    conn.commit()
    primary.kill()
    assert not primary.healthy()
    primary.restart()
    assert primary.state == "running"
    assert _connect(primary).execute("SELECT n FROM durable").fetchall() == [(42,)]


def test_a_primary_started_while_another_is_killed_takes_none_of_its_ports(
    primary: SqldServer, sqld_backend: str
) -> None:
    primary.kill()
    other = start_sqld_primary(backend=sqld_backend)
    try:
        assert {other.http_port, other.grpc_port}.isdisjoint({primary.http_port, primary.grpc_port})
        primary.restart()
        assert primary.healthy() and other.healthy()
    finally:
        other.close()


def test_a_paused_primary_does_not_answer_until_it_is_resumed(primary: SqldServer) -> None:
    primary.pause()
    try:
        assert not primary.healthy(timeout=0.3)
    finally:
        primary.resume()
    primary.wait_ready(10)
    assert _connect(primary).execute("SELECT 1").fetchone() == (1,)


def test_a_stopped_primary_refuses_connections_and_restart_brings_it_back(
    primary: SqldServer,
) -> None:
    primary.stop()
    assert primary.state == "stopped"
    assert not primary.healthy()
    primary.restart()
    assert primary.healthy()


def test_a_server_that_cannot_start_reports_its_last_log_lines(sqld_backend: str) -> None:
    with pytest.raises(SqldStartError) as caught:
        start_sqld_primary(backend=sqld_backend, extra_args=["--no-such-flag"], startup_timeout=15)
    message = str(caught.value)
    assert "exited before it was ready" in message
    assert "--no-such-flag" in message


# --------------------------------------------------------------------------- choosing


def test_the_backend_follows_the_environment_variable(
    sqld_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAREL_EDGE_SQLD_BACKEND", sqld_backend)
    assert choose_backend() == sqld_backend
    monkeypatch.setenv("HAREL_EDGE_SQLD_BACKEND", "podman")
    with pytest.raises(SqldUnavailable, match="HAREL_EDGE_SQLD_BACKEND"):
        choose_backend()


def test_a_missing_binary_is_reported_as_unavailable_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HAREL_EDGE_SQLD_BINARY", str(tmp_path / "no-sqld-here"))
    with pytest.raises(SqldUnavailable, match="HAREL_EDGE_SQLD_BINARY"):
        start_sqld_primary(backend="binary")


# --------------------------------------------------------------------------- make-keys


def test_make_keys_writes_a_key_sqld_accepts_and_private_files_only_its_owner_reads(
    sqld_backend: str, tmp_path: Path
) -> None:
    out = tmp_path / "keys"
    result = subprocess.run(  # noqa: S603
        [sys.executable, str(REPO / "sqld" / "make-keys.py"), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    rw_token = (out / "token-rw").read_text().strip()
    ro_token = (out / "token-ro").read_text().strip()
    assert rw_token not in result.stdout + result.stderr
    for secret in ("private-key.pem", "token-rw", "token-ro"):
        assert stat.S_IMODE((out / secret).stat().st_mode) == 0o600

    from harel_edge.testing import load_keys

    keys = load_keys(out / "private-key.pem")
    assert (out / "jwt-key.pem").read_bytes() == keys.public_key_pem
    assert (out / "jwt-key.b64").read_text() == keys.public_key_base64
    with start_sqld_primary(backend=sqld_backend, keys=keys, key_format="base64") as server:
        status = _post_pipeline(server, rw_token)
        assert status == 200
        with pytest.raises(ValueError, match="Write permission"):
            conn = _connect(server, ro_token)
            conn.execute("CREATE TABLE nope (n INTEGER)")
            conn.commit()


# --------------------------------------------------------------------------- fixtures


def _run_pytest_with_sqld_unavailable(tmp_path: Path, *, required: bool) -> subprocess.CompletedProcess[str]:
    """Run a one-test suite that asks for ``sqld_primary`` where no sqld can start."""
    (tmp_path / "test_needs_sqld.py").write_text("def test_needs_sqld(sqld_primary):\n    pass\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "HAREL_EDGE_SQLD_BACKEND": "binary",
        "HAREL_EDGE_SQLD_BINARY": str(tmp_path / "no-sqld-here"),
        "HAREL_EDGE_REQUIRE_SQLD": "1" if required else "",
    }
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-p", "harel_edge.testing.fixtures", "-p", "no:cacheprovider",
         "-rs", "-q", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def test_a_sqld_fixture_skips_with_the_reason_when_sqld_cannot_start(tmp_path: Path) -> None:
    result = _run_pytest_with_sqld_unavailable(tmp_path, required=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "HAREL_EDGE_SQLD_BINARY" in result.stdout


def test_a_sqld_fixture_fails_with_the_reason_when_sqld_is_required(tmp_path: Path) -> None:
    result = _run_pytest_with_sqld_unavailable(tmp_path, required=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout
    assert "sqld is required (HAREL_EDGE_REQUIRE_SQLD=1) but cannot start" in result.stdout
    assert "HAREL_EDGE_SQLD_BINARY" in result.stdout
