"""How many exchanges the Hrana executor keeps in flight: 2, until a worker's window makes room
for more (`make_room`), up to the widest window's, on a real sqld through a relay that counts."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from harel_edge.executor import Stmt
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import ExplicitSettings
from harel_edge.testing.http import loopback_http

pytestmark = pytest.mark.sqld

ARRIVE_WITHIN = 10  # seconds: requests that never arrive fail the test instead of hanging it


class CountingRelay:
    """Forwards Hrana requests to sqld, holding them while `gate` is shut; counts how many are
    in the relay at once, and wakes `arrived` whenever one comes in."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client = aiohttp.ClientSession()
        self.gate = asyncio.Event()
        self.gate.set()
        self.inside = 0
        self.most = 0
        self.arrived = asyncio.Condition()

    async def __call__(self, request: web.BaseRequest) -> web.Response:
        body = await request.read()
        self.inside += 1
        self.most = max(self.most, self.inside)
        async with self.arrived:
            self.arrived.notify_all()
        try:
            await self.gate.wait()
            headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
            async with self.client.post(self.upstream + request.path, data=body, headers=headers) as answer:
                return web.Response(status=answer.status, body=await answer.read(), content_type="application/json")
        finally:
            self.inside -= 1

    async def until_inside(self, n: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: self.inside >= n), ARRIVE_WITHIN)


def test_two_exchanges_go_at_once_until_a_window_makes_room_for_more_up_to_the_widest_windows(sqld_primary):
    server = sqld_primary

    async def burst(executor: HranaExecutor, relay: CountingRelay, units: int, wait_for: int) -> int:
        relay.gate.clear()
        relay.most = 0
        calls = [asyncio.ensure_future(executor.execute(Stmt("SELECT ?", (i,)))) for i in range(units)]
        await relay.until_inside(wait_for)
        relay.gate.set()
        answers = await asyncio.gather(*calls)
        assert [a.rows[0][0] for a in answers] == list(range(units))
        return relay.most

    async def main() -> tuple[int, int, int]:
        relay = CountingRelay(server.http_url)
        async with loopback_http(relay) as url:
            settings = ExplicitSettings.load(profile="sqld", url=url, auth_token=server.rw_token, max_in_flight=512)
            executor = HranaExecutor(settings, linger=0.0)
            try:
                before = await burst(executor, relay, 128 * 6, wait_for=2)
                executor.make_room(256)  # 4 exchanges carry 256 events twice over
                middle = await burst(executor, relay, 128 * 10, wait_for=4)
                executor.make_room(100_000)  # never more than the widest window's (512: 8)
                after = await burst(executor, relay, 128 * 12, wait_for=8)
                return before, middle, after
            finally:
                await executor.aclose()
                await relay.client.close()

    before, middle, after = asyncio.run(main())
    assert before == 2, f"{before} exchanges at once before any window made room"
    assert middle == 4, f"{middle} exchanges at once for a window of 256"
    assert after == 8, f"{after} exchanges at once for the widest window (512)"
