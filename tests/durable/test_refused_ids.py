"""Ids the durable stores keep must come back intact: workflow ids, keys and namespaces with a
NUL are refused before anything is written (the driver would read them back cut at the NUL)."""

from __future__ import annotations

import asyncio

import pytest
from behaviours import ALIVE, BUDGET, HOUR, Stores, open_stores

from harel_edge.durable import LibsqlScheduler
from harel_edge.settings import EdgeSettings

BAD = "order\x0042"


async def _claimed(s: Stores):  # noqa: ANN202
    return await s.checkpointer.claim(s.workflow(), BUDGET, ALIVE)


CALLS = {
    "claim": lambda s: s.checkpointer.claim(BAD, BUDGET, ALIVE),
    "load": lambda s: s.checkpointer.load(BAD),
    "history": lambda s: s.checkpointer.history(BAD),
    "supply workflow": lambda s: s.checkpointer.supply(BAD, "approval", "yes"),
    "supply key": lambda s: s.checkpointer.supply(s.workflow(), BAD, "yes"),
    "append workflow": lambda s: s.checkpointer.append(BAD, "hello"),
    "append key": lambda s: s.checkpointer.append(s.workflow(), "hello", key=BAD),
    "discard": lambda s: s.checkpointer.discard(BAD),
    "make_ready": lambda s: s.scheduler.make_ready(BAD),
    "schedule": lambda s: s.scheduler.schedule(BAD, s.clock.current + HOUR),
    "drop": lambda s: s.scheduler.drop(BAD),
    "arrive workflow": lambda s: s.durable.arrive(BAD, "approval", "yes"),
    "arrive key": lambda s: s.durable.arrive(s.workflow(), BAD, "yes"),
    "deliver workflow": lambda s: s.durable.deliver(BAD, "hello"),
    "deliver key": lambda s: s.durable.deliver(s.workflow(), "hello", key=BAD),
    "delete": lambda s: s.durable.delete(BAD),
}


async def _record(s: Stores) -> None:
    await s.checkpointer.record(await _claimed(s), BAD, 1)


async def _transact(s: Stores) -> None:
    await s.checkpointer.transact(await _claimed(s), BAD, lambda tx: tx.execute("SELECT 1"))


async def _namespace(s: Stores) -> None:
    LibsqlScheduler(s.database, namespace=BAD)


CALLS |= {"record key": _record, "transact key": _transact, "scheduler namespace": _namespace}


async def _stored(s: Stores) -> list[tuple]:
    return await s.rows(
        "SELECT (SELECT count(*) FROM workflow_checkpoint), (SELECT count(*) FROM workflow_claim),"
        " (SELECT count(*) FROM workflow_queue)"
    )


@pytest.mark.parametrize("name", list(CALLS))
def test_an_id_with_a_nul_is_refused_with_what_to_do_and_nothing_is_written(name, tmp_path) -> None:  # noqa: ANN001
    async def scenario() -> None:
        s = await open_stores(EdgeSettings(db_path=str(tmp_path / "durable.db")))
        try:
            with pytest.raises(ValueError, match=r"NUL character .* remove it or encode the id"):
                await CALLS[name](s)
            claims = 1 if name in ("record key", "transact key") else 0  # the claim made to get there
            assert await _stored(s) == [(0, claims, 0)]
        finally:
            await s.database.aclose()

    asyncio.run(scenario())
