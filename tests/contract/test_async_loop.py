"""The async transport as built by `create`/`from_settings`, on every profile: on sqld and replica
its connections live in worker processes, and the event loop stays free during a call.

Loop freedom is judged by counting: a 1 ms ticker runs while one call travels through a
latency proxy that makes every round trip at least 100 ms, once on the thread design (the
baseline: the driver holds the GIL, so the loop is frozen) and once on worker processes. Only
tick counts are compared, never durations.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract

from harel_edge import AsyncLibsqlTransport
from harel_edge.procpool import PoolClosedError
from harel_edge.testing.loop import ticks_during
from harel_edge.testing.proxy import LatencyProxy

REMOTE = [pytest.param("sqld", marks=pytest.mark.sqld), pytest.param("replica", marks=pytest.mark.sqld)]


def test_harels_async_transport_contract_holds_on_the_default_design(edge):
    made = []

    async def make(clock):
        transport = await AsyncLibsqlTransport.from_settings(edge.settings(), clock, processes=2)
        made.append((transport, transport.processes))
        return transport

    asyncio.run(assert_async_transport_contract(make))
    assert len(made) >= 7
    expected = 0 if edge.profile == "local" else 1
    assert all(started == expected for _, started in made), "local runs on a thread; remote starts one worker"
    assert all(t.processes == 0 for t, _ in made), "every worker process was closed"


def test_operations_in_flight_together_each_get_a_different_group(edge):
    async def main():
        t = await AsyncLibsqlTransport.from_settings(edge.settings(), processes=4)
        try:
            await t.publish_many([(f"G{i}", Event(kind=f"e{i}")) for i in range(8)])
            leases = await asyncio.gather(*(t.claim(f"w{i}", 30) for i in range(8)))
            assert sorted(lease.group_id for lease in leases) == [f"G{i}" for i in range(8)]
            assert await t.claim("late", 30) is None, "every group is in flight"
            assert all(await asyncio.gather(*(t.ack(lease) for lease in leases)))
            assert await t.depth() == 0
            if edge.profile != "local":
                assert t.processes > 1, "the calls were spread over several worker processes"
        finally:
            await t.close()

    asyncio.run(main())


def test_a_depth_counts_every_message_published_through_any_worker(edge):
    async def main():
        t = await AsyncLibsqlTransport.from_settings(edge.settings(), processes=2)
        try:
            for round_ in range(1, 4):
                await asyncio.gather(
                    t.publish(f"a{round_}", Event(kind="a")), t.publish(f"b{round_}", Event(kind="b"))
                )
                assert await t.depth() == 2 * round_, "a replica worker catches up before it counts"
        finally:
            await t.close()

    asyncio.run(main())


def test_the_loop_keeps_ticking_while_a_remote_call_is_in_flight_through_a_slow_link(edge):
    if edge.profile == "local":
        pytest.skip("the local profile has no link to the primary")

    async def main(proxy: LatencyProxy):
        settings = _through(edge, proxy)
        threads = await AsyncLibsqlTransport.from_settings(settings, processes=0)
        processes = await AsyncLibsqlTransport.from_settings(edge.peer(settings), processes=1)
        try:
            await threads.publish("warm", Event(kind="w"))  # both connections made and used
            await processes.depth()
            counts = {}
            for name, t in (("threads", threads), ("processes", processes)):
                before = proxy.stats()["chunks_up"]
                # An UPDATE on every profile: on a replica it is delegated to the primary.
                counts[name], lease = await ticks_during(lambda t=t: t.claim("w", 30, min_priority=4))
                assert lease is None
                assert proxy.stats()["chunks_up"] > before, f"the {name} call went through the proxy"
            return counts
        finally:
            await threads.close()
            await processes.close()

    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:  # each round trip >= 100 ms
        counts = asyncio.run(main(proxy))
    assert counts["processes"] >= 20, f"the loop ticked during the call on worker processes: {counts}"
    assert counts["processes"] >= 5 * (counts["threads"] + 1), f"far more than on a frozen loop: {counts}"


async def _until(predicate, what: str) -> None:
    """Poll, never a fixed sleep, for something another process does."""
    for _ in range(6000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"gave up waiting for {what}")


def _through(edge, proxy: LatencyProxy):
    key = "url" if edge.profile == "sqld" else "sync_url"
    return edge.settings(**{key: proxy.url})


def test_a_cancelled_claim_still_takes_effect_and_its_worker_answers_the_next_call(edge):
    if edge.profile == "local":
        pytest.skip("the local profile runs on a thread (offload.OneAtATime has its own tests)")

    async def main(proxy: LatencyProxy):
        t = await AsyncLibsqlTransport.from_settings(_through(edge, proxy), processes=1)
        try:
            await t.publish("G", Event(kind="only"))
            sent = proxy.stats()["chunks_up"]
            claim = asyncio.create_task(t.claim("cancelled", 30))
            await _until(lambda: proxy.stats()["chunks_up"] > sent, "the claim to be on the wire")
            claim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claim
            assert await t.claim("next", 30) is None, "the cancelled claim ran to the end: G is in flight"
            assert await t.depth() == 1, "and nothing was lost"
            assert t.processes == 1, "the worker was kept: it was never handed over mid-call"
        finally:
            await t.close()

    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:
        asyncio.run(main(proxy))


def test_close_waits_for_the_call_in_flight_then_no_worker_process_is_left(edge):
    if edge.profile == "local":
        pytest.skip("the local profile runs on a thread")

    async def main(proxy: LatencyProxy):
        t = await AsyncLibsqlTransport.from_settings(_through(edge, proxy), processes=2)
        await t.publish("G", Event(kind="e"))
        await asyncio.gather(t.depth(), t.depth())
        pids = list(t._pool.pids)
        assert len(pids) == 2
        sent = proxy.stats()["chunks_up"]
        claim = asyncio.create_task(t.claim("w", 30))
        await _until(lambda: proxy.stats()["chunks_up"] > sent, "the claim to be on the wire")
        await t.close()
        assert claim.done() and (await claim).event.kind == "e", "the claim in flight was answered first"
        with pytest.raises(PoolClosedError):
            await t.depth()
        assert t.processes == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)

    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:
        asyncio.run(main(proxy))
