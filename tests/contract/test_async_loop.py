"""The async transport as built by `create`/`from_settings`, on every profile: on sqld and replica
its calls are Hrana requests from the event loop, which stays free during a call.

Loop freedom is judged by counting: a 1 ms ticker runs while one call travels through a
latency proxy that makes every round trip at least 100 ms, once through the libsql driver on a
thread (the baseline: the driver holds the GIL, so the loop is frozen) and once through the
transport. Only tick counts are compared, never durations.
"""

from __future__ import annotations

import asyncio

import pytest
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract

from harel_edge import AsyncLibsqlTransport, LibsqlTransport
from harel_edge.executor import ExecutorClosedError
from harel_edge.testing.loop import ticks_during
from harel_edge.testing.proxy import LatencyProxy

REMOTE = [pytest.param("sqld", marks=pytest.mark.sqld), pytest.param("replica", marks=pytest.mark.sqld)]


def test_harels_async_transport_contract_holds_on_the_default_design(edge):
    made = []

    async def make(clock):
        transport = await AsyncLibsqlTransport.from_settings(edge.settings(), clock)
        made.append(transport)
        return transport

    asyncio.run(assert_async_transport_contract(make))
    assert len(made) >= 7, "the contract built a fresh transport for each of its checks"
    assert all(t.path.executor.closed for t in made), "the contract closed every transport it made"


def test_operations_in_flight_together_each_get_a_different_group(edge):
    async def main():
        t = await AsyncLibsqlTransport.from_settings(edge.settings())
        try:
            await t.publish_many([(f"G{i}", Event(kind=f"e{i}")) for i in range(8)])
            leases = await asyncio.gather(*(t.claim(f"w{i}", 30) for i in range(8)))
            assert sorted(lease.group_id for lease in leases) == [f"G{i}" for i in range(8)]
            assert await t.claim("late", 30) is None, "every group is in flight"
            assert all(await asyncio.gather(*(t.ack(lease) for lease in leases)))
            assert await t.depth() == 0
        finally:
            await t.close()

    asyncio.run(main())


def test_a_depth_counts_every_message_published_through_any_worker(edge):
    async def main():
        t = await AsyncLibsqlTransport.from_settings(edge.settings())
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
        driver = await asyncio.to_thread(LibsqlTransport, settings=settings)
        transport = await AsyncLibsqlTransport.from_settings(edge.peer(settings))
        try:
            await asyncio.to_thread(driver.publish, "warm", Event(kind="w"))  # both used once
            await transport.depth()
            calls = {
                "sync face on a thread": lambda: asyncio.to_thread(driver.claim, "w", 30, 4),
                "transport": lambda: transport.claim("w", 30, min_priority=4),
            }
            counts = {}
            for name, call in calls.items():
                before = proxy.stats()["chunks_up"]
                # An UPDATE on every profile: on a replica it is delegated to the primary.
                counts[name], lease = await ticks_during(call)
                assert lease is None
                assert proxy.stats()["chunks_up"] > before, f"the {name} call went through the proxy"
            return counts
        finally:
            await asyncio.to_thread(driver.close)
            await transport.close()

    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:  # each round trip >= 100 ms
        counts = asyncio.run(main(proxy))
    assert counts["transport"] >= 20, f"the loop ticked during the transport's call: {counts}"
    assert counts["sync face on a thread"] >= 20, f"the sync face (aiohttp on its own loop thread) never froze the loop: {counts}"


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


def test_a_cancelled_claim_still_takes_effect_and_nothing_is_lost(edge):
    if edge.profile == "local":
        pytest.skip("the local profile has no link to the primary")

    async def main(proxy: LatencyProxy):
        t = await AsyncLibsqlTransport.from_settings(_through(edge, proxy))
        try:
            await t.publish("G", Event(kind="only"))
            sent = proxy.stats()["chunks_up"]
            claim = asyncio.create_task(t.claim("cancelled", 30))
            await _until(lambda: proxy.stats()["chunks_up"] > sent, "the claim to be on the wire")
            claim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claim
            assert await t.claim("next", 30) is None, "the cancelled claim ran to the end: G is in flight"
            assert await t.depth() == 1, "and nothing was lost: its lease lapses and G is delivered again"
        finally:
            await t.close()

    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:
        asyncio.run(main(proxy))


def test_close_waits_for_the_call_in_flight_then_refuses_new_calls(edge):
    async def main(url_of):
        t = await AsyncLibsqlTransport.from_settings(url_of())
        await t.publish("G", Event(kind="e"))
        claim = asyncio.create_task(t.claim("w", 30))
        await asyncio.sleep(0)  # the claim is queued: close must answer it before closing
        await t.close()
        assert claim.done() and (await claim).event.kind == "e", "the claim in flight was answered first"
        with pytest.raises(ExecutorClosedError, match="closed"):
            await t.depth()

    if edge.profile == "local":
        asyncio.run(main(edge.settings))
        return
    with LatencyProxy(edge.server.http_port, delay=0.050) as proxy:
        asyncio.run(main(lambda: _through(edge, proxy)))
