"""The Hrana executor strands no caller when its tasks are cancelled (as `asyncio.run` cancels
every task at its end): units queued behind a cancelled drain are sent, and a unit whose
request was cancelled in flight is told its outcome is unknown, on a real sqld."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from harel_edge.errors import PrimaryUnavailableError
from harel_edge.executor import Stmt
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import ExplicitSettings
from harel_edge.testing.http import loopback_http

pytestmark = pytest.mark.sqld

ANSWER_WITHIN = 10  # seconds: a stranded caller fails the test instead of hanging it


class GatedRelay:
    """Forwards Hrana requests to sqld; while `gate` is shut, a request waits in the relay."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client = aiohttp.ClientSession()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def __call__(self, request: web.BaseRequest) -> web.Response:
        body = await request.read()
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with self.client.post(self.upstream + request.path, data=body, headers=headers) as answer:
            return web.Response(status=answer.status, body=await answer.read(), content_type="application/json")


def test_units_queued_behind_a_cancelled_drain_are_sent_and_a_cancelled_request_says_its_outcome_is_unknown(fresh_sqld_primary):
    server = fresh_sqld_primary

    async def main():
        relay = GatedRelay(server.http_url)
        async with loopback_http(relay) as url:
            try:
                return await exchange_through(relay, url)
            finally:
                await relay.client.close()

    async def exchange_through(relay: GatedRelay, url: str):
        settings = ExplicitSettings.load(profile="sqld", url=url, auth_token=server.rw_token)
        executor = HranaExecutor(settings, max_requests=1, linger=0.0)
        try:
            await executor.execute(Stmt("CREATE TABLE t (x)"))
            relay.gate.clear()
            in_flight = asyncio.ensure_future(executor.execute(Stmt("INSERT INTO t VALUES (1)")))
            await relay.waiting.wait()
            exchange = next(iter(executor._tasks))
            behind = [asyncio.ensure_future(executor.execute(Stmt("INSERT INTO t VALUES (?)", (x,)))) for x in (2, 3)]
            await asyncio.sleep(0)  # yields only: a new drain waits for the one request slot
            for task in list(executor._tasks):
                task.cancel()  # the drain waiting for a slot, and the exchange in flight
            assert not exchange.done()
            relay.gate.set()
            answers = await asyncio.wait_for(asyncio.gather(in_flight, *behind, return_exceptions=True), ANSWER_WITHIN)
            rows = (await executor.execute(Stmt("SELECT x FROM t ORDER BY x"))).rows
            return answers, rows
        finally:
            await executor.aclose()

    answers, rows = asyncio.run(main())
    assert isinstance(answers[0], PrimaryUnavailableError), f"the cancelled request's caller was answered: {answers[0]!r}"
    assert "outcome is unknown" in str(answers[0])
    assert [a.affected for a in answers[1:]] == [1, 1], f"the units queued behind were sent: {answers[1:]!r}"
    assert rows in ([(2,), (3,)], [(1,), (2,), (3,)])
