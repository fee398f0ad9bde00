"""`harel-edge dead-letter` as a user runs it, on a local file the workers' code filled."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from cli_helpers import env_for, run
from harel.spec.states import Event

from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler, connect, migrate
from harel_edge.durable.runtime import DurableWorker
from harel_edge.executor import open_executor
from harel_edge.migration import migrate as migrate_schema
from harel_edge.queue import EventTransport
from harel_edge.settings import ExplicitSettings


def poisoned(path) -> None:  # noqa: ANN001
    """One message (group order-7) and one workflow (refunds/wf-1) that failed until dead-lettered."""
    settings = ExplicitSettings.load(profile="local", db_path=str(path), max_deliveries=2)
    migrate_schema(settings)

    async def main() -> None:
        now = [1000.0]
        executor = open_executor(settings)
        transport = EventTransport(executor, settings, clock=lambda: now[0], max_deliveries=2)
        try:
            await transport.publish("order-7", Event(kind="Pay", data={"amount": 3}), priority=1, routing_key="eu")
            for _ in range(2):
                lease = await transport.claim("w", 30)
                transport.failed(lease, ZeroDivisionError("division by zero"))
                await transport.nack(lease, delay=5)
                now[0] += 6
            assert await transport.claim("w", 30) is None
        finally:
            await executor.aclose()
        database = connect(settings)
        try:
            await migrate(database)
            clock = lambda: datetime(2031, 1, 1, tzinfo=UTC)  # noqa: E731
            scheduler = LibsqlScheduler(database, namespace="refunds", now=clock)
            durable = LibsqlDurable(LibsqlCheckpointer(database, now=clock), scheduler)

            async def flow(ctx):  # noqa: ANN001, ANN202
                raise LookupError("no such refund")

            await scheduler.make_ready("wf-1")
            with pytest.raises(LookupError):
                await DurableWorker(durable, flow, max_failed_passes=1).run_once(timedelta(0))
        finally:
            await database.aclose()

    asyncio.run(main())


@pytest.fixture
def env(tmp_path):  # noqa: ANN001, ANN201
    path = tmp_path / "q.db"
    poisoned(path)
    return env_for({"profile": "local", "db_path": str(path)})


def test_dead_letter_list_shows_each_dead_letter_with_its_count_and_last_error(env, tmp_path):
    listed = run(["dead-letter", "list", "--json"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    message, workflow = json.loads(listed.stdout)
    assert (message["kind"], message["group_id"], message["attempts"]) == ("message", "order-7", 2)
    assert message["last_error"] == "ZeroDivisionError: division by zero"
    assert (message["priority"], message["routing_key"], message["event"]["data"]) == (1, "eu", {"amount": 3})
    assert (workflow["kind"], workflow["namespace"], workflow["workflow"], workflow["attempts"]) == (
        "workflow",
        "refunds",
        "wf-1",
        1,
    )
    table = run(["dead-letter", "list"], {**env, "COLUMNS": "200"}, tmp_path)  # no wrapped cells
    assert table.returncode == 0, table.stderr
    for shown in ("order-7", "Pay", "refunds/wf-1", "ZeroDivisionError: division by zero", "LookupError"):
        assert shown in table.stdout
    only = run(["dead-letter", "list", "--kind", "workflow", "--json"], env, tmp_path)
    assert [letter["kind"] for letter in json.loads(only.stdout)] == ["workflow"]
    wrong = run(["dead-letter", "list", "--kind", "event"], env, tmp_path)
    assert wrong.returncode == 2 and "--kind 'event'" in wrong.stderr and "message or workflow" in wrong.stderr


def test_dead_letter_show_prints_one_with_its_event(env, tmp_path):
    (first, _) = json.loads(run(["dead-letter", "list", "--json"], env, tmp_path).stdout)
    shown = run(["dead-letter", "show", str(first["id"])], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"dead letter #{first['id']}: message of order-7" in shown.stdout
    assert "failed deliveries: 2" in shown.stdout and "routing key eu" in shown.stdout
    assert '"amount": 3' in shown.stdout
    as_json = run(["dead-letter", "show", str(first["id"]), "--json"], env, tmp_path)
    assert json.loads(as_json.stdout) == first


def test_dead_letter_requeue_puts_a_message_at_its_groups_tail_and_a_workflow_back_in_its_queue(env, tmp_path):
    message, workflow = json.loads(run(["dead-letter", "list", "--json"], env, tmp_path).stdout)
    assert run(["publish", "order-7", "Ship"], env, tmp_path).returncode == 0  # the group lives on
    back = run(["dead-letter", "requeue", str(message["id"])], env, tmp_path)
    assert back.returncode == 0, back.stderr
    assert back.stdout.strip() == f"requeued message #{message['id']} at the tail of group order-7"
    woken = run(["dead-letter", "requeue", str(workflow["id"])], env, tmp_path)
    assert woken.stdout.strip() == f"requeued workflow #{workflow['id']} (refunds/wf-1): ready now"
    assert json.loads(run(["dead-letter", "list", "--json"], env, tmp_path).stdout) == []
    status = json.loads(run(["status", "--json"], env, tmp_path).stdout)
    assert status["queue"]["totals"]["messages"] == 2
    assert status["workflows"]["namespaces"][0]["namespace"] == "refunds"
    again = run(["dead-letter", "requeue", str(message["id"])], env, tmp_path)
    assert again.returncode == 1 and f"no dead letter #{message['id']}" in again.stderr


def test_dead_letter_purge_deletes_one_or_all_and_needs_exactly_one_of_them(env, tmp_path):
    message, _workflow = json.loads(run(["dead-letter", "list", "--json"], env, tmp_path).stdout)
    neither = run(["dead-letter", "purge"], env, tmp_path)
    both = run(["dead-letter", "purge", str(message["id"]), "--all"], env, tmp_path)
    assert neither.returncode == both.returncode == 2 and "ID or --all" in neither.stderr
    one = run(["dead-letter", "purge", str(message["id"])], env, tmp_path)
    assert one.returncode == 0 and one.stdout.strip() == f"purged dead letter #{message['id']}"
    gone = run(["dead-letter", "show", str(message["id"])], env, tmp_path)
    assert gone.returncode == 1 and f"no dead letter #{message['id']}" in gone.stderr
    rest = run(["dead-letter", "purge", "--all", "--yes"], env, tmp_path)
    assert rest.returncode == 0 and rest.stdout.strip() == "purged 1 dead letter"
    assert run(["dead-letter", "list"], env, tmp_path).stdout.strip() == "no dead letters"


def test_status_says_how_many_dead_letters_there_are(env, tmp_path):
    shown = run(["status"], {**env, "COLUMNS": "200"}, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "dead letters: 1 message, 1 workflow (`harel-edge dead-letter list` shows them)" in shown.stdout
    report = json.loads(run(["status", "--json"], env, tmp_path).stdout)
    assert report["dead_letters"]["messages"] == 1 and report["dead_letters"]["workflows"] == 1


def test_dead_letter_commands_on_a_database_without_the_table_say_to_migrate(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # a harel 0.9 queue: no dead-letter table yet
        db.execute(
            "CREATE TABLE harel_transport_messages (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
            " group_id TEXT NOT NULL, event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)"
        )
    listed = run(["dead-letter", "list"], env_for({"profile": "local", "db_path": str(path)}), tmp_path)
    assert listed.returncode == 5 and "harel-edge migrate" in listed.stderr
