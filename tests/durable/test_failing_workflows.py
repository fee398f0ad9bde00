"""A durable workflow whose passes always raise ends in the dead-letter table, on a local file."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from behaviours import LEASE, Stores, open_stores

from harel_edge import dead_letter
from harel_edge.durable.runtime import Context, DurableWorker, Finished, Sleeping
from harel_edge.settings import ExplicitSettings

NOW = timedelta(0)
PAST_LEASE = {"seconds": LEASE.total_seconds() + 1}  # a failed pass's row is visible again then


@pytest.fixture
def run(tmp_path):  # noqa: ANN001, ANN201
    """Run `scenario(stores)` in a fresh event loop on a fresh local file."""

    def runner(scenario):  # noqa: ANN001, ANN202
        async def main():  # noqa: ANN202
            settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "durable.db"))
            stores = await open_stores(settings)
            try:
                return await scenario(stores)
            finally:
                await stores.database.aclose()

        return asyncio.run(main())

    return runner


async def letters(s: Stores) -> list[dead_letter.DeadLetter]:
    prefix = s.database.connection.settings.prefix
    return await s.database.run(lambda c: dead_letter.list_dead_letters(c.execute, prefix))


def test_a_workflow_whose_passes_always_raise_is_dead_lettered_after_n_and_no_longer_scheduled(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        passes = []

        async def flow(ctx: Context) -> None:
            passes.append(ctx.workflow)
            raise ValueError(f"bad input, pass {len(passes)}")

        worker = DurableWorker(s.durable, flow, max_failed_passes=3)
        await s.scheduler.make_ready(wf)
        for n in range(1, 4):
            with pytest.raises(ValueError, match=f"pass {n}"):
                await worker.run_once(NOW)  # the pass's own error still reaches the caller
            if n < 3:
                assert await s.queue_row(wf) is not None, "retried after its lease, as before"
                assert await worker.run_once(NOW) is None, "not before its lease ends"
            s.clock.advance(**PAST_LEASE)
        assert await s.queue_row(wf) is None, "out of the scheduler's queue"
        s.clock.advance(hours=1)
        assert await worker.run_once(NOW) is None and len(passes) == 3, "and never run again"
        (letter,) = await letters(s)
        assert (letter.kind, letter.namespace, letter.workflow) == ("workflow", s.scheduler.namespace, wf)
        assert letter.attempts == 3 and letter.last_error == "ValueError: bad input, pass 3"
        assert letter.target == f"{s.scheduler.namespace}/{wf}"

    run(scenario)


def test_a_requeued_workflow_is_ready_at_once_and_replays_from_its_records(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        broken = [True]
        quotes = []

        async def flow(ctx: Context) -> int:
            quote = await ctx.step("quote", lambda: quotes.append(1) or 42)
            if broken[0]:
                raise RuntimeError("the charge service is down")
            return quote

        worker = DurableWorker(s.durable, flow, max_failed_passes=1)
        await s.scheduler.make_ready(wf)
        with pytest.raises(RuntimeError):
            await worker.run_once(NOW)
        (letter,) = await letters(s)
        broken[0] = False  # the cause is fixed; the operator requeues it
        prefix = s.database.connection.settings.prefix
        at = s.clock.current.timestamp()
        assert await s.database.run(lambda c: dead_letter.requeue(c.execute, prefix, letter.id, now=at)) == letter
        assert await letters(s) == []
        assert await worker.run_once(NOW) == Finished(42)
        assert quotes == [1], "the step recorded before the failure was not run again"

    run(scenario)


def test_a_pass_that_ends_well_clears_the_count_of_failed_passes(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        failed = [0, 0, 0]

        async def flow(ctx: Context) -> None:
            for stage in range(3):  # before each sleep: two failed passes, then one that sleeps
                if failed[stage] < 2:
                    failed[stage] += 1
                    raise RuntimeError(f"flaky before sleep {stage}")
                await ctx.sleep_until(ctx.now() + timedelta(minutes=5))

        worker = DurableWorker(s.durable, flow, max_failed_passes=3)
        await s.scheduler.make_ready(wf)
        for _ in range(3):
            for _ in range(2):
                with pytest.raises(RuntimeError):
                    await worker.run_once(NOW)
                s.clock.advance(**PAST_LEASE)
            assert isinstance(await worker.run_once(NOW), Sleeping)
            s.clock.advance(hours=1)
        assert await letters(s) == [], "never three failures in a row"
        assert await s.queue_row(wf) is not None

    run(scenario)
