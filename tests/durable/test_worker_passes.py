"""The worker runs several passes of durable workflows at once, never more than
HAREL_EDGE_MAX_WORKFLOW_PASSES, each workflow to its end, on a real local file."""

from __future__ import annotations

import asyncio

import pytest

from harel_edge.durable import LibsqlScheduler, connect, migrate
from harel_edge.migration import migrate as migrate_schema
from harel_edge.settings import ExplicitSettings
from harel_edge.worker import WorkerOptions, parse_workflow, run_worker

NAMESPACE = "gated"


class Gate:
    """Counts the passes inside their first step and lets them out once `expected` are in together."""

    def __init__(self) -> None:
        self.inside = 0
        self.peak = 0
        self.expected = 0
        self.all_in: asyncio.Event | None = None

    async def meet(self) -> str:
        assert self.all_in is not None
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        if self.inside >= self.expected:
            self.all_in.set()
        try:
            # A bound for a failing run only: the passes meet as soon as enough of them run at once.
            await asyncio.wait_for(self.all_in.wait(), 60)
        finally:
            self.inside -= 1
        return "met"


GATE = Gate()


async def gated(ctx):  # noqa: ANN001, ANN201 - the worker loads it as test_worker_passes:gated
    await ctx.step("meet", GATE.meet)
    await ctx.step("after", lambda: "done")
    return "done"


def drain(tmp_path, workflows: int, passes: int) -> list[tuple]:
    """Start `workflows` workflows, run a worker allowing `passes` at once until all have ended."""
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "w.db"), max_workflow_passes=passes)
    migrate_schema(settings)

    async def main() -> list[tuple]:
        GATE.__init__()
        GATE.expected, GATE.all_in = min(workflows, passes), asyncio.Event()
        database = connect(settings)
        try:
            await migrate(database)
            scheduler = LibsqlScheduler(database, namespace=NAMESPACE)
            for n in range(workflows):
                await scheduler.make_ready(f"wf-{n}")
            stop = asyncio.Event()
            options = WorkerOptions(workflows=(parse_workflow(f"{NAMESPACE}={__name__}:gated"),), poll=0.05, sample_every=3600)
            worker = asyncio.create_task(run_worker(settings, options, stop))
            for _ in range(6000):  # polled, up to 60 s
                if not await database.execute("test.left", "SELECT 1 FROM workflow_queue LIMIT 1"):
                    break
                await asyncio.sleep(0.01)
            stop.set()
            report = await asyncio.wait_for(worker, 60)
            assert report.error is None, report
            return await database.execute(
                "test.results", "SELECT workflow FROM workflow_checkpoint WHERE step = 'after' ORDER BY workflow"
            )
        finally:
            await database.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize(("workflows", "passes"), [(8, 8), (9, 3)])
def test_the_worker_runs_up_to_its_limit_of_workflow_passes_at_once_and_every_workflow_to_its_end(tmp_path, workflows, passes):
    finished = drain(tmp_path, workflows, passes)
    assert [row[0] for row in finished] == sorted(f"wf-{n}" for n in range(workflows))
    assert GATE.peak == passes, f"{passes} passes met inside one step at once; at most {passes}"
