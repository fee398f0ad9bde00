"""A deployment's embedded replicas on a real sqld: each opened when its database has work, never
more open than the bound, closed after a quiet spell with every file given back; and a
deployment's worker doing the same for a tenant served through a namespace."""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import structlog
from harel.engine.execution import Execution
from harel.spec.states import Event
from pydantic import SecretStr

import harel_edge.examples.actions as actions
from harel_edge import migration
from harel_edge.deployment import create_database
from harel_edge.errors import ConfigurationError
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.replicas import FILES_PER_REPLICA, Replicas
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing.proxy import LatencyProxy
from harel_edge.worker import WorkerOptions
from harel_edge.worker_process import run_process

pytestmark = pytest.mark.sqld

EXAMPLES = str(Path(actions.__file__).parent)
STEPS = (("Start", {}), ("Pay", {"amount": 2.0}), ("Ship", {}), ("Deliver", {}))


def replica(server, path: Path, *, sync_url: str | None = None) -> ExplicitSettings:
    return ExplicitSettings.load(
        profile="replica", db_path=str(path), sync_url=sync_url or server.http_url, auth_token=server.rw_token,
        sync_interval=SYNC_EVERY,
    )


SYNC_EVERY = 0.1


def files_open_under(directory: Path) -> int:
    """How many of this process's open files are in `directory`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory))
        except OSError:
            continue  # closed while listed
    return count


async def files_given_back(directory: Path) -> bool:
    """Whether the files in `directory` are all closed within 10 s: the driver drops a closed
    replica's on its own threads, once a sync in flight has ended."""
    for _ in range(1000):
        if files_open_under(directory) == 0:
            return True
        await asyncio.sleep(0.01)
    return False


def test_replicas_open_as_their_databases_work_stay_within_the_bound_and_close_after_a_quiet_spell(
    module_sqld_primary, tmp_path
):
    clock = [0.0]
    work = {"a": 0, "b": 0, "c": 0}
    replicas = Replicas(2, idle_close=10.0, clock=lambda: clock[0])

    async def look() -> set[str]:
        await replicas.look()
        await replicas.opened()
        return {name for name in work if replicas.is_open(name)}

    proxy = LatencyProxy(urlsplit(module_sqld_primary.http_url).port, 0.0)  # counts what goes to the primary

    async def sent_while(seconds: float) -> int:
        before = proxy.stats()["bytes_up"]
        await asyncio.sleep(seconds)  # a window to observe, not a wait for something to happen
        return proxy.stats()["bytes_up"] - before

    async def main() -> None:
        for name in work:
            settings = replica(module_sqld_primary, tmp_path / f"{name}.db", sync_url=proxy.url)
            await replicas.keep(name, settings, lambda name=name: work[name])
        assert await look() == set(), "no work, no replica"
        assert files_open_under(tmp_path) == 0 and not list(tmp_path.iterdir()), "not even made"
        work["a"] += 1
        assert await look() == {"a"}
        assert 0 < files_open_under(tmp_path) <= FILES_PER_REPLICA
        clock[0] += 5
        work["b"] += 1
        work["c"] += 1
        assert await look() == {"a", "b"}, "room for one more: the bound is two"
        clock[0] += 6  # a quiet for 11 s, b and c for 6
        assert await look() == {"b", "c"}, "a's replica closed, and c, waiting, took its room"
        clock[0] += 20
        assert await sent_while(5 * SYNC_EVERY) > 0, "open replicas sync in the background"
        assert await look() == set()
        assert await files_given_back(tmp_path), "every file given back"
        assert await sent_while(5 * SYNC_EVERY) == 0, "a closed replica syncs no more (libsql's close alone goes on)"
        work["a"] += 1
        assert await look() == {"a"}, "work again: opened again"
        await replicas.leave("a")
        assert not replicas.is_open("a") and await files_given_back(tmp_path)

    with proxy, structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    waited = [entry for entry in logs if entry["event"].startswith("busy databases wait for an embedded replica")]
    assert len(waited) == 1 and waited[0]["waiting"] == 1, "said once, while c waited"
    closed = [entry["reason"] for entry in logs if entry["event"] == "embedded replica closed"]
    assert closed == ["no work for 10 s"] * 3 + ["its database is no longer served"]


def test_a_bound_of_replicas_this_process_could_not_open_the_files_of_is_refused_at_start(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        refused_above(soft, tmp_path)
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))  # no limit would refuse nothing: give it one
    try:
        refused_above(4096, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def refused_above(soft: int, tmp_path: Path) -> None:
    too_many = soft // FILES_PER_REPLICA + 1
    settings = ExplicitSettings.load(
        profile="replica", sync_url="http://{database}.primary.internal:8080", db_path=str(tmp_path / "{database}.db"),
        databases="a,b", max_open_replicas=too_many,
    )
    with pytest.raises(ConfigurationError, match=f"HAREL_EDGE_MAX_OPEN_REPLICAS={too_many} .* lower HAREL_EDGE_MAX_OPEN_REPLICAS"):
        Replicas.of_deployment(settings)
    assert Replicas.of_deployment(settings.model_copy(update={"max_open_replicas": 1})).max_open == 1


def test_a_deployments_worker_opens_a_tenants_replica_when_its_work_comes_and_closes_it_once_idle(sqld_namespaces, tmp_path):
    # The replica asks sqld for the namespace its sync URL's host starts with, up to its first dot:
    # tenant "127" at 127.0.0.1 reaches sqld on loopback without a name server.
    port = urlsplit(sqld_namespaces.http_url).port
    settings = ExplicitSettings.load(
        profile="replica", sync_url=f"http://{{database}}.0.0.1:{port}", db_path=str(tmp_path / "{database}.db"),
        auth_token=sqld_namespaces.rw_token, admin_url=sqld_namespaces.admin_url, databases="127",
        replica_idle_close=0.5, retry_deadline=60.0,
    )
    tenant = settings.for_database("127")
    create_database(settings, "127")
    migration.migrate(tenant)
    local = tmp_path / "127.db"

    async def main() -> None:
        stop = asyncio.Event()
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005, sample_every=0.2)
        with structlog.testing.capture_logs() as logs:
            worker = asyncio.create_task(run_process(settings, options, stop))
            try:
                for _ in range(100):  # a hang guard (10 s): the worker's first idle look
                    if any(entry["event"] == "worker started" for entry in logs) or worker.done():
                        break
                    await asyncio.sleep(0.1)
                assert not local.exists(), "no work yet: the tenant's replica is not opened"
                await asyncio.to_thread(seed, tenant, 3)

                def said(event: str) -> list[dict]:
                    return [entry for entry in logs if entry["event"] == event]

                for _ in range(600):  # a hang guard (60 s): the verdict is what the logs, files and report say
                    if worker.done() or (said("embedded replica closed") and await asyncio.to_thread(depth, tenant) == 0):
                        break
                    await asyncio.sleep(0.1)
            finally:
                stop.set()
                report = await asyncio.wait_for(worker, 60)
        assert report.acks == 3 * len(STEPS), report
        assert {entry["database"] for entry in said("embedded replica opened")} == {"127"}
        assert [entry["reason"] for entry in said("embedded replica closed")][:1] == ["no work for 0.5 s"]
        assert await files_given_back(tmp_path), "the closed replica holds no file"

    asyncio.run(main())
    connection = sqlite3.connect(f"file:{local}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT count(*) FROM harel_executions").fetchone()
    finally:
        connection.close()
    assert rows == (3,), "the replica synced the tenant's executions while it was open"


def seed(settings, orders: int) -> None:
    with EdgeStore(settings) as store, LibsqlTransport(settings=settings) as transport:
        for i in range(orders):
            store.save(Execution(id=f"order-{i}", definition_id="order"))
        transport.publish_many(Message(f"order-{i}", Event(kind=k, data=d)) for i in range(orders) for k, d in STEPS)


def depth(settings) -> int:
    with LibsqlTransport(settings=settings, create_schema=False) as transport:
        return transport.depth()


def test_a_replica_left_while_it_opens_is_closed_once_opened_and_its_file_is_free_again(module_sqld_primary, tmp_path):
    work = {"a": 1}
    replicas = Replicas(1, idle_close=None)
    proxy = LatencyProxy(urlsplit(module_sqld_primary.http_url).port, 0.1)  # an open takes a few round trips
    settings = replica(module_sqld_primary, tmp_path / "a.db", sync_url=proxy.url)

    async def main() -> None:
        await replicas.keep("a", settings, lambda: work["a"])
        work["a"] += 1
        await replicas.look()
        assert not replicas.is_open("a"), "still opening"
        await replicas.leave("a")  # a database's worker stopping while its replica opens
        assert not replicas.is_open("a") and replicas.open_count() == 0
        assert await files_given_back(tmp_path), "what the open made is closed"
        await replicas.keep("a", settings, lambda: work["a"], now=True)  # started again: the file is free
        assert replicas.is_open("a")
        await replicas.leave("a")

    with proxy, structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    assert not [entry for entry in logs if entry["event"].startswith("embedded replica not opened")], logs


def test_a_replica_whose_primary_does_not_answer_is_not_opened_and_the_loop_goes_on_until_it_answers(
    fresh_sqld_primary, tmp_path
):
    # libsql opens a replica holding the GIL until its primary answers: opened against a paused
    # primary, the whole process would stop with it.
    clock = [0.0]
    work = {"a": 0}
    replicas = Replicas(1, idle_close=None, clock=lambda: clock[0])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    async def main() -> None:
        nonlocal ticks
        await replicas.keep("a", replica(fresh_sqld_primary, tmp_path / "a.db"), lambda: work["a"])
        running = asyncio.create_task(ticker())
        fresh_sqld_primary.pause()
        try:
            work["a"] += 1
            await replicas.look()
            await asyncio.wait_for(replicas.opened(), 60)  # a hang guard
            assert ticks > 0, "the loop ran while the open waited"
            assert not replicas.is_open("a")
        finally:
            fresh_sqld_primary.resume()
            running.cancel()
        clock[0] += 29
        await replicas.look()
        await replicas.opened()
        assert not replicas.is_open("a"), "tried again after 30 s, not before"
        clock[0] += 1
        await replicas.look()
        await replicas.opened()
        assert replicas.is_open("a"), "the primary answers again: opened"
        await replicas.leave("a")

    with structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    failed = [entry for entry in logs if entry["event"].startswith("embedded replica not opened")]
    assert len(failed) == 1 and failed[0]["retry_in"] == 30.0, failed
    assert "did not answer within 5 s" in failed[0]["error"]


def test_a_replica_whose_token_is_refused_is_not_tried_again(module_sqld_primary, tmp_path):
    clock = [0.0]
    work = {"a": 0}
    replicas = Replicas(1, idle_close=None, clock=lambda: clock[0])
    settings = replica(module_sqld_primary, tmp_path / "a.db").model_copy(update={"auth_token": SecretStr("not-a-token")})

    async def main() -> None:
        await replicas.keep("a", settings, lambda: work["a"])
        for _ in range(3):
            work["a"] += 1
            await replicas.look()
            await replicas.opened()
            clock[0] += 1000

    with structlog.testing.capture_logs() as logs:
        asyncio.run(main())
    failed = [entry for entry in logs if entry["event"].startswith("embedded replica not opened")]
    assert len(failed) == 1 and "not tried again" in failed[0]["event"], failed
    assert "restart the worker" in failed[0]["hint"]
    assert "not-a-token" not in str(logs)
    assert not list(tmp_path.iterdir()), "no file made"


def test_the_replicas_run_opens_as_work_comes_and_closes_every_one_at_its_stop(module_sqld_primary, tmp_path):
    work = {"a": 0}
    replicas = Replicas(1, idle_close=None)

    async def main() -> None:
        stop = asyncio.Event()
        await replicas.keep("a", replica(module_sqld_primary, tmp_path / "a.db"), lambda: work["a"])
        running = asyncio.create_task(replicas.run(stop))
        work["a"] += 1
        for _ in range(300):  # a hang guard (30 s): its next look opens it
            if replicas.is_open("a"):
                break
            await asyncio.sleep(0.1)
        assert replicas.is_open("a")
        stop.set()
        await asyncio.wait_for(running, 30)
        assert replicas.open_count() == 0
        assert await files_given_back(tmp_path)

    asyncio.run(main())
