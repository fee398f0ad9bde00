"""`harel-edge workflows list / show` as a user runs them, on a local file the durable runtime
filled: a workflow finished, one failing, one dead-lettered and one not yet run."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from cli_helpers import env_for, run

from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler, connect, migrate
from harel_edge.durable.runtime import DurableWorker
from harel_edge.migration import migrate as migrate_schema
from harel_edge.settings import ExplicitSettings
from harel_edge.workflows import list_workflows, show_workflow


def filled(path) -> ExplicitSettings:  # noqa: ANN001
    settings = ExplicitSettings.load(profile="local", db_path=str(path))
    migrate_schema(settings)

    async def main() -> None:
        database = connect(settings)
        try:
            await migrate(database)
            def worker(namespace: str, flow, failed_passes: int) -> DurableWorker:  # noqa: ANN001
                scheduler = LibsqlScheduler(database, namespace=namespace)
                durable = LibsqlDurable(LibsqlCheckpointer(database), scheduler)
                return DurableWorker(durable, flow, max_failed_passes=failed_passes), scheduler

            async def ships(ctx):  # noqa: ANN001, ANN202
                await ctx.step("pack", lambda: "packed")
                await ctx.step("ship", lambda: {"carrier": "post"})
                return "shipped"

            async def fails(ctx):  # noqa: ANN001, ANN202
                await ctx.step("look up", lambda: 1)
                raise LookupError("no such refund")

            for name, namespace, flow, limit in (
                ("wf-done", "orders", ships, 3),
                ("wf-failing", "refunds", fails, 3),
                ("wf-dead", "audits", fails, 1),
            ):
                loop, scheduler = worker(namespace, flow, limit)
                await scheduler.make_ready(name)
                try:
                    await loop.run_once(timedelta(0))
                except LookupError:
                    pass
            _, waiting = worker("later", ships, 3)
            await waiting.make_ready("wf-waiting")
        finally:
            await database.aclose()

    asyncio.run(main())
    return settings


@pytest.fixture
def settings(tmp_path):  # noqa: ANN001, ANN201
    return filled(tmp_path / "q.db")


def test_workflows_list_says_where_each_workflow_stands(settings):
    found = {w.workflow: w for w in list_workflows(settings)}
    assert set(found) == {"wf-done", "wf-failing", "wf-dead", "wf-waiting"}
    # A finished workflow leaves the scheduler's queue; its own row keeps its namespace.
    assert (found["wf-done"].state, found["wf-done"].steps, found["wf-done"].namespace) == ("finished", 2, "orders")
    failing = found["wf-failing"]
    assert (failing.state, failing.attempts, failing.steps) == ("sleeping", 1, 1), "backing off after its failed pass"
    assert "no such refund" in failing.last_error and failing.wakes_in_seconds is not None
    dead = found["wf-dead"]
    assert (dead.state, dead.namespace) == ("dead", "audits") and "no such refund" in dead.last_error
    assert (found["wf-waiting"].state, found["wf-waiting"].steps) == ("ready", 0)
    assert [w.workflow for w in list_workflows(settings, state="dead")] == ["wf-dead"]
    assert [w.workflow for w in list_workflows(settings, namespace="refunds")] == ["wf-failing"]


def test_workflows_show_gives_each_record_in_the_order_written(settings):
    detail = show_workflow(settings, "wf-done")
    assert [r["step"] for r in detail.records] == ["pack", "ship", "$result"]
    assert detail.records[1]["value"] == {"carrier": "post"} and detail.records[2]["value"] == "shipped"
    assert show_workflow(settings, "nobody") is None


def test_the_workflows_commands_render_the_same_and_refuse_an_unknown_state(settings, tmp_path):
    env = env_for({"profile": "local", "db_path": settings.db_path})
    listed = run(["workflows", "list", "--json"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert {w["workflow"]: w["state"] for w in json.loads(listed.stdout)}["wf-dead"] == "dead"
    table = run(["workflows", "list"], {**env, "COLUMNS": "200"}, tmp_path)
    assert "wf-failing" in table.stdout and "no such refund" in table.stdout
    shown = run(["workflows", "show", "wf-done"], {**env, "COLUMNS": "200"}, tmp_path)
    assert shown.returncode == 0 and "workflow wf-done (orders): finished" in shown.stdout and "ship" in shown.stdout
    missing = run(["workflows", "show", "nobody"], env, tmp_path)
    assert missing.returncode == 1 and "harel-edge workflows list" in missing.stderr
    wrong = run(["workflows", "list", "--state", "asleep"], env, tmp_path)
    assert wrong.returncode == 2 and "use one of ready, sleeping, running, waiting, finished, dead, cancelled" in wrong.stderr


def test_status_counts_the_failing_workflows_and_says_where_to_look(settings, tmp_path):
    env = env_for({"profile": "local", "db_path": settings.db_path})
    shown = run(["status", "--json"], env, tmp_path)
    assert json.loads(shown.stdout)["workflows"]["failing"] == 1, "wf-failing; the dead one left the queue"
    table = run(["status"], {**env, "COLUMNS": "200"}, tmp_path)
    assert "1 failing: `harel-edge workflows list`" in table.stdout


def test_cancel_resume_and_fork_each_say_what_they_changed_and_change_nothing_where_they_do_not_apply(settings, tmp_path):
    env = env_for({"profile": "local", "db_path": settings.db_path})

    def command(*args: str):  # noqa: ANN202
        return run(["workflows", *args], {**env, "COLUMNS": "200"}, tmp_path)

    cancelled = command("cancel", "wf-waiting")
    assert cancelled.returncode == 0 and "wf-waiting: ready -> cancelled" in cancelled.stdout, cancelled.stderr
    again = command("cancel", "wf-waiting", "--json")
    assert json.loads(again.stdout) | {"forked_from": None} == {
        "workflow": "wf-waiting", "command": "cancel", "before": "cancelled", "after": "cancelled",
        "forked_from": None, "changed": False,
    }  # fmt: skip
    assert "wf-waiting" in command("list", "--state", "cancelled").stdout
    finished = command("cancel", "wf-done")
    assert finished.returncode == 0 and "wf-done is finished: cancel changed nothing" in finished.stdout
    assert "wf-done is finished: resume changed nothing" in command("resume", "wf-done").stdout
    assert command("resume", "wf-waiting").stdout.strip() == "wf-waiting: cancelled -> ready"
    dead = json.loads(command("resume", "wf-dead", "--json").stdout)
    assert (dead["before"], dead["after"], dead["changed"]) == ("dead", "ready", True)
    unknown = command("cancel", "nobody")
    assert unknown.returncode == 1 and "no workflow 'nobody'" in unknown.stderr
    no_step = command("fork", "wf-done", "--from-step", "unpack")
    assert no_step.returncode == 2 and "its steps are pack, ship" in no_step.stderr
    forked = json.loads(command("fork", "wf-done", "--from-step", "ship", "--id", "wf-again", "--json").stdout)
    assert forked == {
        "workflow": "wf-again", "command": "fork", "before": "absent", "after": "ready",
        "forked_from": "wf-done", "changed": True,
    }  # fmt: skip
    detail = show_workflow(settings, "wf-again")
    assert [r["step"] for r in detail.records] == ["pack"] and detail.summary.namespace == "orders"
    taken = command("fork", "wf-done", "--from-step", "pack", "--id", "wf-again")
    assert taken.returncode == 2 and "exists already" in taken.stderr
    assert [r["step"] for r in show_workflow(settings, "wf-again").records] == ["pack"], "the refused fork changed nothing"


def test_two_cancels_at_once_one_says_it_changed_it(settings):
    from concurrent.futures import ThreadPoolExecutor

    from harel_edge.workflow_control import cancel_workflow

    with ThreadPoolExecutor(2) as pool:
        changes = list(pool.map(lambda _: cancel_workflow(settings, "wf-failing"), range(2)))
    assert sorted(c.changed for c in changes) == [False, True]
    assert {c.before for c in changes} == {"sleeping", "cancelled"}


def test_workflows_list_filters_by_the_time_of_the_last_change(settings, tmp_path):
    env = env_for({"profile": "local", "db_path": settings.db_path})
    everything = {w.workflow for w in list_workflows(settings)}
    recorded = {w.workflow for w in list_workflows(settings) if w.changed_at is not None}
    assert recorded == {"wf-done", "wf-failing", "wf-dead"}, "wf-waiting never recorded anything"
    newest = max(w.changed_at for w in list_workflows(settings) if w.changed_at is not None)
    assert {w.workflow for w in list_workflows(settings, since=newest)} == {
        w.workflow for w in list_workflows(settings) if w.changed_at == newest
    }
    assert {w.workflow for w in list_workflows(settings, until=newest + 1)} == recorded
    assert list_workflows(settings, since=newest + 1) == []
    listed = run(["workflows", "list", "--since", "1h", "--json"], env, tmp_path)
    assert {w["workflow"] for w in json.loads(listed.stdout)} == recorded < everything
    wrong = run(["workflows", "list", "--since", "yesterday"], env, tmp_path)
    assert wrong.returncode == 2 and "15m, 2h, 3d" in wrong.stderr
