"""run_durably and DurableWorker on the local profile, with time moved by hand."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from datetime import timedelta

import pytest
from behaviours import LEASE, Stores, insert_effect, open_stores

from harel_edge.durable import Delivery, LibsqlDurable, LibsqlScheduler
from harel_edge.durable.runtime import (
    RESULT,
    Busy,
    Context,
    DurableWorker,
    Finished,
    Lost,
    Sleeping,
    Waiting,
    run_durably,
)
from harel_edge.settings import EdgeSettings

NOW = timedelta(0)


@pytest.fixture
def run(tmp_path):  # noqa: ANN001, ANN201
    """Run `scenario(stores)` in a fresh event loop on a fresh local file."""

    def runner(scenario):  # noqa: ANN001, ANN202
        async def main():  # noqa: ANN202
            stores = await open_stores(EdgeSettings(db_path=str(tmp_path / "durable.db")))
            try:
                return await scenario(stores)
            finally:
                await stores.database.aclose()

        return asyncio.run(main())

    return runner


def test_steps_run_once_and_later_passes_replay_their_recorded_results(run) -> None:  # noqa: ANN001
    calls: Counter[str] = Counter()

    async def scenario(s: Stores) -> None:
        wf = s.workflow()

        async def flow(ctx: Context) -> dict:
            async def fetch() -> int:
                calls["fetch"] += 1
                return 20

            quote = await ctx.step("quote", fetch)
            charged = await ctx.transact("charge", insert_effect(ctx.workflow, "charge"))
            await ctx.sleep_until(s.clock.current + timedelta(hours=1))
            calls["after sleep"] += 1
            return {"quote": quote + 1, "charged": charged is not None}

        first = await run_durably(s.durable, wf, flow)
        assert isinstance(first, Sleeping)
        s.clock.advance(minutes=30)
        assert isinstance(await run_durably(s.durable, wf, flow), Sleeping)
        s.clock.advance(minutes=31)
        assert await run_durably(s.durable, wf, flow) == Finished({"quote": 21, "charged": True})
        assert await run_durably(s.durable, wf, flow) == Finished({"quote": 21, "charged": True})
        assert calls == {"fetch": 1, "after sleep": 1}
        assert await s.effects(wf) == [("charge",)]
        assert (await s.checkpointer.load(wf))[RESULT] == {"quote": 21, "charged": True}

    run(scenario)


def test_a_sleep_keeps_the_deadline_its_first_pass_computed(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        start = s.clock.current

        async def flow(ctx: Context) -> str:
            await ctx.sleep_until(ctx.now() + timedelta(hours=1))  # computed from the clock each pass
            return "woke"

        assert await run_durably(s.durable, wf, flow) == Sleeping(start + timedelta(hours=1))
        s.clock.advance(minutes=30)
        assert await run_durably(s.durable, wf, flow) == Sleeping(start + timedelta(hours=1))
        # run_durably left the wakeup to the scheduler, at the recorded deadline.
        assert await s.queue_row(wf) == (start + timedelta(hours=1)).timestamp()
        s.clock.advance(minutes=30)
        worker = DurableWorker(s.durable, flow)
        assert await worker.run_once(NOW) == Finished("woke")
        assert await s.queue_row(wf) is None

    run(scenario)


def test_a_workflow_waiting_for_messages_is_woken_by_each_delivery(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()

        async def flow(ctx: Context) -> list:
            first = await ctx.receive()
            approval = await ctx.receive("approval")
            second = await ctx.receive()
            return [first, approval, second]

        worker = DurableWorker(s.durable, flow)
        assert await run_durably(s.durable, wf, flow) == Waiting(None)
        assert await worker.run_once(NOW) is None  # nothing to do until a message comes
        await s.durable.deliver(wf, "one")
        assert await worker.run_once(NOW) == Waiting("approval")
        await s.durable.arrive(wf, "approval", "granted")
        await s.durable.deliver(wf, "two")
        assert await worker.run_once(NOW) == Finished(["one", "granted", "two"])

    run(scenario)


def test_a_workflow_held_by_another_pass_is_left_alone_and_looked_at_again_soon(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        ran = []

        async def flow(ctx: Context) -> None:
            ran.append(ctx.workflow)

        other = await s.checkpointer.claim(wf, timedelta(minutes=5), timedelta(seconds=30))
        assert await run_durably(s.durable, wf, flow) == Busy()
        await s.scheduler.make_ready(wf)
        worker = DurableWorker(s.durable, flow, busy_retry=timedelta(seconds=2))
        assert await worker.run_once(NOW) == Busy()
        assert await s.queue_row(wf) == pytest.approx(s.clock.current.timestamp() + 2, abs=0.01)
        assert ran == []
        await s.checkpointer.release(other)
        s.clock.advance(seconds=3)
        assert await worker.run_once(NOW) == Finished(None)
        assert ran == [wf]

    run(scenario)


def test_a_pass_whose_claim_was_taken_over_stops_before_its_next_write(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        ran: list[str] = []

        async def flow(ctx: Context) -> None:
            async def slow_step() -> str:
                ran.append("first")
                s.clock.advance(minutes=1)  # this pass stalls past its claim...
                await s.checkpointer.claim(wf, timedelta(minutes=5), timedelta(seconds=30))  # ...taken over
                return "first"

            await ctx.step("first", slow_step)
            await ctx.step("second", lambda: ran.append("second"))

        assert await run_durably(s.durable, wf, flow, alive=timedelta(seconds=30)) == Lost()
        assert ran == ["first"]
        assert await s.checkpointer.load(wf) == {}

    run(scenario)


def test_a_refused_renewal_stops_the_pass_before_its_next_step_runs(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        ran: list[str] = []
        contexts: list[Context] = []
        proceed = asyncio.Event()

        async def flow(ctx: Context) -> None:
            contexts.append(ctx)
            await ctx.step("first", lambda: ran.append("first"))
            await proceed.wait()
            await ctx.step("second", lambda: ran.append("second"))

        # alive is short in real time so the background renewal runs often; the hand-moved
        # clock decides when the claim lapses.
        passing = asyncio.create_task(run_durably(s.durable, wf, flow, alive=timedelta(seconds=0.15)))
        while "first" not in ran or not await s.checkpointer.load(wf):
            await asyncio.sleep(0.01)
        s.clock.advance(seconds=1)
        assert await s.checkpointer.claim(wf, timedelta(minutes=5), timedelta(seconds=30)) is not None
        while not contexts[0].lost:  # the next renewal is refused
            await asyncio.sleep(0.01)
        proceed.set()
        assert await passing == Lost()
        assert ran == ["first"]

    run(scenario)


def test_a_crashed_workers_workflow_is_resumed_by_another_after_its_lease(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        calls: Counter[str] = Counter()

        async def flow(ctx: Context) -> str:
            await ctx.step("first", lambda: calls.update(["first"]))
            await ctx.transact("second", insert_effect(ctx.workflow, "second"))
            return "done"

        await s.scheduler.make_ready(wf)
        # The first worker takes the workflow, claims it, runs a step, and dies: no release,
        # no done, no renewals.
        delivery = await s.scheduler.next_ready(NOW)
        holder = await s.checkpointer.claim(wf, timedelta(minutes=5), timedelta(seconds=30))
        await s.checkpointer.record(holder, "first", None)
        calls["first"] += 1
        survivor = DurableWorker(s.durable, flow)
        assert await survivor.run_once(NOW) is None  # still leased to the dead worker
        s.clock.advance(seconds=61)  # past the lease (60 s) and the claim (30 s)
        assert await survivor.run_once(NOW) == Finished("done")
        assert calls == {"first": 1}
        assert await s.effects(wf) == [("second",)]
        await s.scheduler.done(delivery)  # the dead worker's receipt is stale: changes nothing
        assert await s.queue_row(wf) is None

    run(scenario)


def test_step_names_the_runtime_uses_itself_are_refused(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        ran = []

        async def flow(ctx: Context) -> None:
            await ctx.step("inbox/1", lambda: ran.append(1))

        with pytest.raises(ValueError, match="reserved"):
            await run_durably(s.durable, wf, flow)
        # The refusal came before the step ran or was recorded, and the workflow under test was
        # released: it can be claimed again at once, its records untouched.
        assert ran == []
        assert await s.checkpointer.load(wf) == {}
        assert await s.checkpointer.claim(wf, timedelta(minutes=1), timedelta(seconds=1)) is not None

    run(scenario)


def test_a_pass_ending_while_its_delivery_is_extended_keeps_the_new_receipt_and_sleeps(run, tmp_path) -> None:  # noqa: ANN001
    """The extend's write lands whatever happens to its caller, so the pass's wake_at must carry
    the receipt it wrote. The file is held locked from the moment the extend starts until the
    pass ends, so its write cannot finish before the keeper is cancelled."""
    blocker = sqlite3.connect(tmp_path / "durable.db", isolation_level=None)
    extending = asyncio.Event()

    async def scenario(s: Stores) -> None:
        wf = s.workflow()
        deadline = s.clock.current + timedelta(hours=1)

        class HeldExtend(LibsqlScheduler):
            async def extend(self, delivery: Delivery, within: timedelta) -> Delivery:
                s.clock.advance(seconds=1)  # so the extension writes a visibility the take did not
                blocker.execute("BEGIN IMMEDIATE")
                extending.set()
                return await super().extend(delivery, within)

        scheduler = HeldExtend(s.database, namespace=s.scheduler.namespace, lease=LEASE, now=s.clock)
        durable = LibsqlDurable(s.checkpointer, scheduler)
        passes: list[int] = []

        async def flow(ctx: Context) -> None:
            passes.append(1)
            if len(passes) == 2:  # the worker's pass: end it while its keeper is extending
                await extending.wait()
                blocker.execute("ROLLBACK")  # no await between this and the end of the pass
            await ctx.sleep_until(deadline)

        assert await run_durably(durable, wf, flow) == Sleeping(deadline)
        await scheduler.make_ready(wf)  # woken early: the next pass sleeps again
        worker = DurableWorker(durable, flow, alive=timedelta(milliseconds=30))  # keeper every 10 ms
        assert await worker.run_once(NOW) == Sleeping(deadline)
        assert await s.queue_row(wf) == deadline.timestamp()

    try:
        run(scenario)
    finally:
        blocker.close()


def test_a_step_name_or_message_key_with_a_nul_is_refused_before_anything_runs(run) -> None:  # noqa: ANN001
    async def scenario(s: Stores) -> None:
        ran: list[int] = []

        async def steps(ctx: Context) -> None:
            await ctx.step("charge\x00v2", lambda: ran.append(1))

        async def receives(ctx: Context) -> None:
            await ctx.receive("reply\x00v2")

        for flow in (steps, receives):
            with pytest.raises(ValueError, match="NUL"):
                await run_durably(s.durable, s.workflow(), flow)
        assert ran == []

    run(scenario)
