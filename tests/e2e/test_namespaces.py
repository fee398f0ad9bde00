"""A database per tenant on a real sqld serving namespaces: made with `databases create`, each
reached by its own requests, and ONE worker process serving them all, a missing one reported
and retried on its own while the others are served."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from pathlib import Path

import structlog
from harel.engine.execution import Execution
from harel.spec.states import Event

import harel_edge.examples.actions as actions
from harel_edge.migrations import SCHEMA_VERSION
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing import spawned
from harel_edge.worker import WorkerOptions
from harel_edge.worker_process import run_process

EXAMPLES = str(Path(actions.__file__).parent)
STEPS = (("Start", {}), ("Pay", {"amount": 2.0}), ("Ship", {}), ("Deliver", {}))
ORDERS = 6
COMMAND = str(Path(sys.executable).parent / "harel-edge")


def env_for(values: dict) -> dict[str, str]:
    """A clean environment with only these settings (a developer's own HAREL_* left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAREL_", "RUST_LOG"))}
    for key, value in values.items():
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        env[f"HAREL_EDGE_{key.upper()}"] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path):
    """`harel-edge ARGS` as a user runs it (forked from the test run's server)."""
    return spawned.command(COMMAND, args, env, cwd, timeout=60)


def deployment(server, names: list[str], **more) -> ExplicitSettings:
    return ExplicitSettings.load(
        profile="sqld", url=server.http_url, auth_token=server.rw_token, admin_url=server.admin_url,
        databases=",".join(names), retry_deadline=60.0, **more,
    )


def tenants(count: int) -> list[str]:
    tag = secrets.token_hex(3)
    return [f"t{tag}-{i}" for i in range(count)]


def test_databases_create_makes_namespaces_whose_queues_are_apart(sqld_namespaces, tmp_path):
    names = tenants(2)
    settings = deployment(sqld_namespaces, names)
    env = env_for({k: v for k, v in settings.model_dump().items() if k in ("profile", "url", "auth_token", "admin_url", "databases")})
    made = run(["databases", "create", *names], env, tmp_path)
    assert made.returncode == 0, made.stderr
    assert [line.split(":")[0] for line in made.stdout.splitlines()] == names
    assert all(f"made; schema version 0 -> {SCHEMA_VERSION}" in line for line in made.stdout.splitlines())
    assert run(["databases", "create", names[0]], env, tmp_path).stdout.startswith(f"{names[0]}: already there")
    assert run(["publish", "g", "Go", "--database", names[1]], env, tmp_path).returncode == 0
    shown = run(["status", "--all", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    queued = {name: each["queue"]["totals"]["queued"] for name, each in json.loads(shown.stdout)["databases"].items()}
    assert queued == {names[0]: 0, names[1]: 1}


def test_databases_create_without_the_admin_address_says_how_to_make_one(sqld_namespaces, tmp_path):
    settings = deployment(sqld_namespaces, tenants(1))
    env = env_for({"profile": "sqld", "url": settings.url, "auth_token": settings.auth_token, "databases": settings.databases[0]})
    refused = run(["databases", "create", settings.databases[0]], env, tmp_path)
    assert refused.returncode == 2 and "HAREL_EDGE_ADMIN_URL is not set" in refused.stderr


def seed(settings, orders: int) -> None:
    with EdgeStore(settings) as store, LibsqlTransport(settings=settings) as transport:
        for i in range(orders):
            store.save(Execution(id=f"order-{i}", definition_id="order"))
        transport.publish_many(Message(f"order-{i}", Event(kind=k, data=d)) for i in range(orders) for k, d in STEPS)


def delivered(settings) -> tuple[int, int]:
    """(orders delivered with what they were paid, messages left) in one database."""
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        done = 0
        for i in range(ORDERS):
            exe = store.load(f"order-{i}")
            done += exe is not None and exe.active_path == "Delivered" and exe.context.get("paid") == 2.0
        return done, t.depth()


def test_one_worker_serves_every_tenant_and_one_missing_tenant_holds_up_none(sqld_namespaces, tmp_path):
    served, missing = tenants(3), tenants(1)[0]
    settings = deployment(sqld_namespaces, [*served, missing], max_in_flight=64)
    env = env_for({"profile": "sqld", "url": settings.url, "auth_token": settings.auth_token,
                   "admin_url": settings.admin_url, "databases": ",".join(served)})
    assert run(["databases", "create", *served], env, tmp_path).returncode == 0
    for name in served:
        seed(settings.for_database(name), ORDERS)

    async def main() -> dict[str, tuple[int, int]]:
        stop = asyncio.Event()
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.005, sample_every=0.2)
        worker = asyncio.create_task(run_process(settings, options, stop))
        seen: dict[str, tuple[int, int]] = {}
        try:
            for _ in range(600):  # a hang guard (60 s): the verdict is what each database holds
                seen = {name: await asyncio.to_thread(delivered, settings.for_database(name)) for name in served}
                if all(done == (ORDERS, 0) for done in seen.values()) or worker.done():
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            report = await asyncio.wait_for(worker, 60)
        assert report.acks == len(served) * ORDERS * len(STEPS), report
        return seen

    with structlog.testing.capture_logs() as logs:
        seen = asyncio.run(main())
    assert seen == {name: (ORDERS, 0) for name in served}, "every order of every tenant delivered, each event once"
    failed = [entry for entry in logs if entry["event"] == "loop failed; restarting"]
    assert failed and {entry["loop"] for entry in failed} == {f"database {missing}"}, "only the missing tenant failed"
    assert "doesn't exist" in failed[0]["error"], failed[0]


def test_a_publish_rings_the_doorbell_namespace_and_wakes_its_tenant_out_of_a_ten_minute_pause(sqld_namespaces, tmp_path):
    served = tenants(2)
    bell = f"bell-{served[0]}"
    settings = deployment(sqld_namespaces, served, doorbell=bell)
    env = env_for({"profile": "sqld", "url": settings.url, "auth_token": settings.auth_token,
                   "admin_url": settings.admin_url, "databases": ",".join(served)})
    assert run(["databases", "create", *served, bell], env, tmp_path).returncode == 0
    first, second = settings.for_database(served[0]), settings.for_database(served[1])

    async def main() -> dict:
        stop = asyncio.Event()
        # Every idle pause is ten minutes from the first: only a ring can bring an order in.
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=600.0, sample_every=0.2)
        worker = asyncio.create_task(run_process(settings, options, stop))
        try:
            for one in (first, second):  # the second tenant idles in its long pause when its orders come
                await asyncio.to_thread(seed, one, ORDERS)
                for _ in range(300):  # a hang guard (30 s): far under the pause without a ring
                    if await asyncio.to_thread(delivered, one) == (ORDERS, 0) or worker.done():
                        break
                    await asyncio.sleep(0.1)
                assert await asyncio.to_thread(delivered, one) == (ORDERS, 0), "the rung tenant served at once"
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)
        with LibsqlTransport(settings=settings.doorbell_settings(), create_schema=False) as doorbell:
            return dict(doorbell.execute("SELECT database, rung FROM harel_doorbell"))

    rings = asyncio.run(main())
    assert set(rings) == set(served) and rings[served[1]] > rings[served[0]], rings
