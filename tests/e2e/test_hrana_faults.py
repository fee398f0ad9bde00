"""Bad answers from the primary, on the worker's Hrana path to a real sqld.

`FaultyRelay` stands between the executor and the primary (an ASGI app the HTTP client is
pointed at): it forwards each request to sqld, or fails it as told: before sqld sees it, or
after sqld applied it and before the answer comes back, which is the ambiguous case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta

import httpx
import pytest
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge.durable import LibsqlCheckpointer, LibsqlScheduler, SqlEffect, connect, migrate
from harel_edge.errors import AuthError
from harel_edge.executor.remote import HranaExecutor
from harel_edge.migration import prepare_database
from harel_edge.queue import EventPath, EventTransport
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EventStore

pytestmark = pytest.mark.sqld


class FaultyRelay:
    """Forwards Hrana requests to sqld; `faults` lists what to do with the next requests."""

    def __init__(self, upstream: str) -> None:
        self.upstream = httpx.AsyncClient(base_url=upstream)
        self.faults: list[str] = []
        self.applied = 0  # requests sqld answered
        self.transactions = 0  # of which carried a transaction (a batch)

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        fault = self.faults.pop(0) if self.faults else None
        if fault == "500 before":
            return await _respond(send, 500, b"internal error")
        if fault == "stream expired":
            requests = json.loads(body)["requests"]
            error = {"type": "error", "error": {"message": "stream expired", "code": "STREAM_EXPIRED"}}
            return await _respond(send, 200, json.dumps({"baton": None, "results": [error] * len(requests)}).encode())
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.lower() in (b"authorization", b"content-type")}
        answer = await self.upstream.post(scope["path"], content=body, headers=headers)
        self.applied += 1
        self.transactions += b'"type":"batch"' in body.replace(b" ", b"")
        if fault == "500 after":
            return await _respond(send, 500, b"internal error")
        if fault == "garbage after":
            return await _respond(send, 200, b'{"results": [{"type": "ok", "resp')
        if fault == "closed after":
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        await _respond(send, answer.status_code, answer.content)


async def _respond(send, status: int, body: bytes) -> None:  # noqa: ANN001
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _settings(server, **overrides):
    values = {
        "profile": "sqld",
        "url": server.http_url,
        "auth_token": server.rw_token,
        "retry_initial_delay": 0.01,
        "retry_deadline": 20.0,
        **overrides,
    }
    return ExplicitSettings.load(**values)


@contextlib.asynccontextmanager
async def relayed(server):
    """A prepared database on `server`, and the event path to it through a `FaultyRelay`."""
    settings = _settings(server)
    prepare_database(settings)
    relay = FaultyRelay(server.http_url)
    executor = HranaExecutor(settings, transport=httpx.ASGITransport(app=relay))
    path = EventPath(executor, settings)
    try:
        yield relay, EventTransport(path), EventStore(path)
    finally:
        await executor.aclose()


AMBIGUOUS = ["500 after", "garbage after", "closed after"]


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_commit_whose_answer_was_lost_is_looked_up_and_never_applied_twice(fresh_sqld_primary, fault):
    async def main():
        async with relayed(fresh_sqld_primary) as (relay, transport, store):
            exe = Execution(id="x", definition_id="d")
            await store.save(exe)
            await transport.publish("x", Event(kind="go"))
            lease = await transport.claim("w", 30)
            loaded, _ = await store.load_for_event("x", lease.event.id)
            relay.faults = [fault]
            sent_before = relay.transactions
            seqs = await store.commit(loaded, [(None, Event(kind="out"))], processed_event_id=lease.event.id)
            assert relay.transactions == sent_before + 1, "the commit went once, then was looked up, not resent"
            assert loaded.version == 2 and len(seqs) == 1 and seqs[0] > 0
            assert await transport.ack(lease) is True, "the ack went out with the commit"
            assert await transport.depth() == 0
            assert [e.event.kind for e in await store.pending_outbox()] == ["out"], "one outbox entry, not two"
            assert (await store.load("x")).version == 2

    asyncio.run(main())


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_claim_whose_answer_was_lost_returns_the_lease_it_took(fresh_sqld_primary, fault):
    async def main():
        async with relayed(fresh_sqld_primary) as (relay, transport, _store):
            await transport.publish("a", Event(kind="a1"))
            await transport.publish("b", Event(kind="b1"))
            relay.faults = [fault]
            leases = await transport.claim_many("w", 30, 2)
            assert sorted(lease.event.kind for lease in leases) == ["a1", "b1"]
            assert await transport.claim_many("w", 30, 2) == [], "nothing was leased twice"
            assert await transport.ack_many(leases) == [True, True]

    asyncio.run(main())


@pytest.mark.parametrize("fault", ["500 after", "closed after"])
def test_a_publish_whose_answer_was_lost_is_queued_once(fresh_sqld_primary, fault):
    async def main():
        async with relayed(fresh_sqld_primary) as (relay, transport, _store):
            relay.faults = [fault]
            await transport.publish("a", Event(kind="a1"))
            assert await transport.depth() == 1

    asyncio.run(main())


@pytest.mark.parametrize("fault", ["500 before", "stream expired"])
def test_a_request_the_primary_failed_before_applying_is_retried_and_applied_once(fresh_sqld_primary, fault):
    async def main():
        async with relayed(fresh_sqld_primary) as (relay, transport, store):
            exe = Execution(id="x", definition_id="d")
            relay.faults = [fault]
            await store.save(exe)
            assert exe.version == 1 and (await store.load("x")).version == 1
            relay.faults = [fault]
            await transport.publish("x", Event(kind="go"))
            assert await transport.depth() == 1

    asyncio.run(main())


def test_a_refused_token_fails_at_once_with_what_to_do_and_without_the_token(fresh_sqld_primary):
    async def main():
        prepare_database(_settings(fresh_sqld_primary))
        bad = _settings(fresh_sqld_primary, auth_token="not-a-valid-token")
        executor = HranaExecutor(bad)
        path = EventPath(executor, bad)
        try:
            with pytest.raises(AuthError) as raised:
                await EventTransport(path).publish("a", Event(kind="a1"))
            assert "HAREL_EDGE_AUTH_TOKEN" in str(raised.value)
            assert "not-a-valid-token" not in str(raised.value) and "not-a-valid-token" not in repr(executor)
        finally:
            await executor.aclose()
        settings = _settings(fresh_sqld_primary)
        good = HranaExecutor(settings)
        try:
            assert await EventTransport(EventPath(good, settings)).depth() == 0, "nothing was queued"
        finally:
            await good.aclose()

    asyncio.run(main())


def test_a_token_with_a_trailing_newline_is_used_without_it(fresh_sqld_primary):
    async def main():
        prepare_database(_settings(fresh_sqld_primary))
        settings = _settings(fresh_sqld_primary, auth_token=fresh_sqld_primary.rw_token + "\n")
        executor = HranaExecutor(settings)
        try:
            assert await EventTransport(EventPath(executor, settings)).depth() == 0
        finally:
            await executor.aclose()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def durable_relayed(server):
    """The durable stores on `server` through a `FaultyRelay`."""
    settings = _settings(server)
    relay = FaultyRelay(server.http_url)
    database = connect(settings)
    await database.executor.aclose()
    database.executor = HranaExecutor(settings, transport=httpx.ASGITransport(app=relay))
    try:
        await migrate(database)
        await database.execute("test.effects", "CREATE TABLE IF NOT EXISTS fault_effects (workflow TEXT)")
        yield relay, database
    finally:
        await database.aclose()


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_an_sql_effect_whose_answer_was_lost_is_looked_up_and_applied_once(fresh_sqld_primary, fault):
    async def main():
        async with durable_relayed(fresh_sqld_primary) as (relay, database):
            checkpointer = LibsqlCheckpointer(database)
            workflow = f"wf-{fault}"
            holder = await checkpointer.claim(workflow, timedelta(minutes=5), timedelta(minutes=5))
            effect = SqlEffect(("INSERT INTO fault_effects (workflow) VALUES (?)", (workflow,)), value="done")
            relay.faults = [fault]
            sent_before = relay.transactions
            assert await checkpointer.transact(holder, "charge", effect) == "done"
            assert relay.transactions == sent_before + 1, "sent once, then looked up, not resent"
            rows = await database.execute("test.read", "SELECT count(*) FROM fault_effects WHERE workflow = ?", (workflow,))
            assert rows == [(1,)], "the effect was applied exactly once"

    asyncio.run(main())


@pytest.mark.parametrize("fault", AMBIGUOUS)
def test_a_delivery_extend_whose_answer_was_lost_returns_the_receipt_it_wrote(fresh_sqld_primary, fault):
    async def main():
        async with durable_relayed(fresh_sqld_primary) as (relay, database):
            scheduler = LibsqlScheduler(database, namespace=f"ns-{fault}")
            await scheduler.make_ready("wf")
            delivery = await scheduler.next_ready(timedelta(0))
            relay.faults = [fault]
            extended = await scheduler.extend(delivery, timedelta(seconds=60))
            assert extended.receipt != delivery.receipt, "the receipt the landed extend wrote"
            await scheduler.done(extended)
            rows = await database.execute("test.read", "SELECT count(*) FROM workflow_queue WHERE namespace = ?", (f"ns-{fault}",))
            assert rows == [(0,)], "done with that receipt removed the row"

    asyncio.run(main())
