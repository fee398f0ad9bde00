"""Cancel, resume and fork as an operator uses them on a running deployment, on every profile:
a cancel lands while a worker's pass is inside a `transact` (from another connection, as
`harel-edge workflows cancel` does), and a finished workflow is forked from its second step."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from behaviours import settings_for

from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler, connect, migrate
from harel_edge.durable.runtime import Cancelled, DurableWorker, Finished
from harel_edge.settings import EdgeSettings
from harel_edge.workflow_control import cancel_workflow, fork_workflow, resume_workflow
from harel_edge.workflows import list_workflows, show_workflow

PROFILES = ["local", pytest.param("sqld", marks=pytest.mark.sqld), pytest.param("replica", marks=pytest.mark.sqld)]
STEPS = ("one", "two", "three", "four")


async def opened(settings: EdgeSettings, namespace: str) -> LibsqlDurable:
    database = connect(settings)
    await migrate(database)
    await database.run(
        lambda c: c.execute("CREATE TABLE IF NOT EXISTS control_effects (id INTEGER PRIMARY KEY, workflow TEXT, step TEXT)")
    )
    scheduler = LibsqlScheduler(database, namespace=namespace, poll=timedelta(milliseconds=50))
    return LibsqlDurable(LibsqlCheckpointer(database), scheduler)


async def effects(durable: LibsqlDurable, workflow: str) -> list[str]:
    def read(connection):  # noqa: ANN001, ANN202
        connection.sync()
        return connection.execute("SELECT step FROM control_effects WHERE workflow = ? ORDER BY id", (workflow,))

    return [step for (step,) in await durable.database.run(read)]


def steps_flow(hold: dict[str, threading.Event] | None = None, gate: asyncio.Event | None = None):  # noqa: ANN201
    """Four `transact` steps, each inserting one effect row; with `hold`, the first pass's step
    "two" says it is inside its transaction and waits to be let go; with `gate`, a plain step
    after "two" waits for it, so the pass cannot finish before the test's cancel has landed."""

    def effect(workflow: str, step: str):  # noqa: ANN202
        def run(tx):  # noqa: ANN001, ANN202
            if hold is not None and step == "two" and not hold["inside"].is_set():
                hold["inside"].set()
                assert hold["go"].wait(60), "the test never let the effect go"
            tx.execute("INSERT INTO control_effects (workflow, step) VALUES (?, ?)", (workflow, step))
            return step

        return run

    async def opened_gate() -> str:
        if gate is not None:
            await gate.wait()
        return "through"

    async def flow(ctx) -> str:  # noqa: ANN001
        for step in STEPS:
            await ctx.transact(step, effect(ctx.workflow, step))
            if step == "two":
                await ctx.step("gate", opened_gate)
        return "done"

    return flow


@pytest.mark.parametrize("profile", PROFILES)
def test_a_workflow_cancelled_inside_transact_commits_nothing_after_the_cancel_and_resumed_finishes_exactly_once(
    profile: str, request: pytest.FixtureRequest, tmp_path  # noqa: ANN001
) -> None:
    settings = settings_for(profile, request, tmp_path)
    workflow = f"order-{profile}-{tmp_path.name}"
    hold = {"inside": threading.Event(), "go": threading.Event()}

    async def scenario() -> None:
        durable = await opened(settings, f"control-{tmp_path.name}")
        gate = asyncio.Event()
        worker = DurableWorker(durable, steps_flow(hold, gate))
        try:
            await durable.scheduler.make_ready(workflow)
            running = asyncio.create_task(worker.run_once(timedelta(seconds=30)))
            assert await asyncio.to_thread(hold["inside"].wait, 60)
            # The operator's cancel, from its own connection, while the pass holds its transaction.
            cancelling = asyncio.create_task(asyncio.to_thread(cancel_workflow, settings, workflow))
            hold["go"].set()
            change = await cancelling
            gate.set()
            assert (change.before, change.after, change.changed) == ("running", "cancelled", True)
            assert await running == Cancelled()
            done = await effects(durable, workflow)
            # "two" was inside its transaction: it committed before the cancel or not at all.
            assert done in (["one"], ["one", "two"]), done
            assert [w.state for w in list_workflows(settings) if w.workflow == workflow] == ["cancelled"]
            assert await worker.run_once(timedelta(0)) is None, "the scheduler never offers it"
            resumed = resume_workflow(settings, workflow)
            assert (resumed.before, resumed.after) == ("cancelled", "ready")
            assert await worker.run_once(timedelta(seconds=30)) == Finished("done")
            assert await effects(durable, workflow) == list(STEPS), "every effect exactly once"
        finally:
            hold["go"].set()
            await durable.database.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("profile", PROFILES)
def test_a_fork_from_step_two_of_a_finished_workflow_runs_two_onwards_again_and_leaves_the_original_as_it_was(
    profile: str, request: pytest.FixtureRequest, tmp_path  # noqa: ANN001
) -> None:
    settings = settings_for(profile, request, tmp_path)
    workflow = f"invoice-{profile}-{tmp_path.name}"

    async def scenario() -> None:
        durable = await opened(settings, f"fork-{tmp_path.name}")
        worker = DurableWorker(durable, steps_flow())
        try:
            await durable.scheduler.make_ready(workflow)
            assert await worker.run_once(timedelta(seconds=30)) == Finished("done")
            original = show_workflow(settings, workflow).records
            change = fork_workflow(settings, workflow, "two", f"{workflow}-again")
            assert change.changed and change.forked_from == workflow
            assert await worker.run_once(timedelta(seconds=30)) == Finished("done")
            assert await effects(durable, f"{workflow}-again") == ["two", "three", "four"]
            assert await effects(durable, workflow) == list(STEPS)
            assert show_workflow(settings, workflow).records == original
            forked = show_workflow(settings, f"{workflow}-again")
            assert [r["step"] for r in forked.records] == ["one", "two", "gate", "three", "four", "$result"]
            assert (forked.summary.forked_from, forked.summary.forked_step) == (workflow, "two")
        finally:
            await durable.database.aclose()

    asyncio.run(scenario())

