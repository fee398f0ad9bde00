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
