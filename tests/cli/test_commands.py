"""The commands as a user runs them (subprocess), on a local file and on a real sqld."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for, run
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.connection import EdgeConnection
from harel_edge.migrations import SCHEMA_VERSION
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


def schema_of(path: Path) -> tuple[int, list[tuple]]:
    """The file's schema version and every table, index, view and trigger, as SQL."""
    db = sqlite3.connect(path)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        objects = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        db.close()
    return version, objects


def handled_everything(path: Path, execution: str) -> tuple[str, int] | None:
    """(the execution's status, messages left) once it is done and the queue is empty."""
    store = EdgeStore(ExplicitSettings.load(profile="local", db_path=str(path)), create_schema=False)
    try:
        status = store.load(execution).status.name
        left = store.execute("SELECT count(*) FROM harel_transport_messages")[0][0]
    finally:
        store.close()
    return (status, left) if status == "DONE" and left == 0 else None


def poll_until(predicate, process: subprocess.Popen, log: Path, timeout: float = 60):  # noqa: ANN001, ANN201
    """Look again every 0.1 s until `predicate()` answers; fail if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if process.poll() is not None:
            raise AssertionError(f"the worker exited early ({process.returncode}):\n{log.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting; the worker's log:\n{log.read_text()}")


def test_publish_then_status_shows_the_message_by_priority_and_routing_key(place, tmp_path):
    env = env_for(place.values())
    assert run(["migrate"], env, tmp_path).returncode == 0
    published = run(
        ["publish", "order-1", "Pay", "--data", '{"amount": 12.5}', "-p", "2", "-r", "eu", "--json"],
        env,
        tmp_path,
    )
    assert published.returncode == 0, published.stderr
    event = json.loads(published.stdout)["event"]
    assert event["kind"] == "Pay" and event["data"] == {"amount": 12.5}
    assert run(["publish", "order-2", "Ship"], env, tmp_path).returncode == 0

    shown = run(["status", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    queue = json.loads(shown.stdout)["queue"]
    assert queue["totals"] == {"messages": 2, "queued": 2, "in_flight": 0, "parked": 0, "groups": 2}
    rows = {(r["priority"], r["routing_key"]): r["messages"] for r in queue["by_priority_and_routing_key"]}
    assert rows == {(2, "eu"): 1, (0, None): 1}
    assert queue["oldest"]["group_id"] == "order-1" and queue["oldest"]["age_seconds"] >= 0


def test_status_counts_messages_in_flight_and_parked(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    transport = LibsqlTransport(str(tmp_path / "q.db"))
    for group in ("a", "b", "c"):
        transport.publish(group, Event(kind="E"))
    transport.claim("w", 30)
    transport.nack(transport.claim("w", 30), delay=300)
    transport.close()
    shown = run(["status", "--json"], env_for(values), tmp_path)
    assert shown.returncode == 0, shown.stderr
    totals = json.loads(shown.stdout)["queue"]["totals"]
    assert (totals["in_flight"], totals["parked"], totals["queued"]) == (1, 1, 1)


def test_status_on_a_missing_file_says_so_and_creates_nothing(tmp_path):
    path = tmp_path / "nothing.db"
    shown = run(["status"], env_for({"profile": "local", "db_path": str(path)}), tmp_path)
    assert shown.returncode == 5
    assert "no database at" in shown.stderr and "migrate" in shown.stderr
    assert not path.exists()


def test_migrate_creates_the_schema_once_and_then_finds_it_up_to_date(place, tmp_path):
    env = env_for(place.values())
    first = run(["migrate"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"-> {SCHEMA_VERSION}" in first.stdout
    again = run(["migrate"], env, tmp_path)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_migrate_print_sql_touches_nothing_and_builds_a_schema_the_commands_accept(tmp_path):
    path = tmp_path / "q.db"
    env = env_for({"profile": "local", "db_path": str(path)})
    printed = run(["migrate", "--print-sql"], env, tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert not path.exists(), "printing the SQL must not open the database"
    assert "CREATE TRIGGER" in printed.stdout and f"PRAGMA user_version = {SCHEMA_VERSION};" in printed.stdout
    # what a migration tool would do with it, with SQLite itself
    db = sqlite3.connect(path)
    db.executescript(printed.stdout)
    db.close()
    built = schema_of(path)
    assert run(["migrate"], env, tmp_path).stdout.startswith(f"schema version {SCHEMA_VERSION}: up to date")
    assert run(["publish", "g", "E"], env, tmp_path).returncode == 0
    # A worker that only checks the schema (a migration tool owns it) runs a statechart on it:
    # every table it reads and writes is there, as the printed SQL made it.
    for kind, data in (("Start", "{}"), ("Pay", '{"amount": 4.0}'), ("Ship", "{}"), ("Deliver", "{}")):
        extra = ["--create", "order", "-D", EXAMPLES] if kind == "Start" else []
        assert run(["publish", "order-1", kind, "--data", data, *extra], env, tmp_path).returncode == 0
    log = tmp_path / "worker.log"
    command = [COMMAND, "--log-format", "json", "worker", "--no-migrate", "-D", EXAMPLES]
    with log.open("w") as stderr:
        worker = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        handled = poll_until(lambda: handled_everything(path, "order-1"), worker, log)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, log.read_text()
    assert handled == ("DONE", 0), "order-1 ran to its end and every message was taken"
    assert schema_of(path) == built, "neither migrate nor the worker had to add or change anything"


def test_config_show_prints_the_settings_with_the_token_redacted(tmp_path):
    secret = "eyJhbGciOiJFZERTQSJ9.never-printed.sig"
    env = env_for(
        {"profile": "sqld", "url": "http://127.0.0.1:9", "auth_token": secret, "routing_keys": "eu,us"}
    )
    shown = run(["config", "show", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    values = json.loads(shown.stdout)
    assert values["auth_token"]["value"] == "**********" and values["routing_keys"]["value"] == ["eu", "us"]
    table = run(["config", "show"], env, tmp_path)
    assert secret not in shown.stdout + shown.stderr + table.stdout + table.stderr


def test_global_options_override_the_environment(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "env.db")})
    shown = run(["--db-path", str(tmp_path / "option.db"), "config", "show", "--json"], env, tmp_path)
    assert json.loads(shown.stdout)["db_path"] == {"value": str(tmp_path / "option.db"), "source": "option"}


def test_config_show_says_where_each_value_came_from(tmp_path):
    (tmp_path / ".env").write_text("HAREL_EDGE_VISIBILITY=45\nHAREL_EDGE_ROUTING_KEYS=fromfile\n")
    env = env_for({"routing_keys": "fromenv"}, HAREL_LIBSQL_DB=str(tmp_path / "harel.db"))
    shown = json.loads(run(["--prefix", "mine", "config", "show", "--json"], env, tmp_path).stdout)
    assert shown["prefix"] == {"value": "mine", "source": "option"}
    assert shown["routing_keys"] == {"value": ["fromenv"], "source": "environment (HAREL_EDGE_ROUTING_KEYS)"}
    assert shown["db_path"] == {"value": str(tmp_path / "harel.db"), "source": "environment (HAREL_LIBSQL_DB)"}
    assert shown["visibility"] == {"value": 45.0, "source": ".env (HAREL_EDGE_VISIBILITY)"}
    assert shown["max_deliveries"]["source"] == "default"
    table = run(["config", "show"], {**env, "COLUMNS": "200"}, tmp_path).stdout
    assert ".env (HAREL_EDGE_VISIBILITY)" in table and "environment (HAREL_EDGE_ROUTING_KEYS)" in table


def test_doctor_passes_on_a_healthy_database_and_checks_the_primarys_clock(place, tmp_path):
    values = place.values()
    env = env_for(values)
    assert run(["migrate"], env, tmp_path).returncode == 0
    if place.profile == "replica":  # as a worker does at start: the replica file syncs
        EdgeConnection(ExplicitSettings.load(**values)).close()
    checked = run(["doctor", "--json"], env, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    levels = {c["name"]: c["level"] for c in report["checks"]}
    assert report["ok"] is True and levels["schema version"] == "ok"
    if place.profile != "local":
        assert levels["connectivity"] == levels["auth"] == levels["clock skew"] == "ok"
    if place.profile == "replica":
        assert levels["sync health"] == "ok"


@pytest.mark.sqld
def test_status_works_with_a_read_only_token(fresh_sqld_primary, tmp_path):
    rw = env_for(
        {"profile": "sqld", "url": fresh_sqld_primary.http_url, "auth_token": fresh_sqld_primary.rw_token}
    )
    assert run(["publish", "g", "E", "-r", "eu"], rw, tmp_path).returncode == 0
    ro = env_for(
        {"profile": "sqld", "url": fresh_sqld_primary.http_url, "auth_token": fresh_sqld_primary.ro_token}
    )
    shown = run(["status", "--json"], ro, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["queue"]["totals"]["messages"] == 1
