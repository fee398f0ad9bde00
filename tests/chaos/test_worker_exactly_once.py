"""The edge worker through a 100 ms link, its window following it, while it is killed and its
primary is paused and killed.

Each execution is a chain of ten states, one event a step (Start, then E1..E10), and each step adds one to
`count`: an event applied twice overshoots, a lost one stalls the chain, an event out of order
finds no transition. So, at the end, every execution in S10 with count 10 and ten processed
events means every event was applied exactly once, in order. Workers (`harel-edge worker`, two
processes) are SIGKILLed while they hold leases (between the claim and the commit), and the
primary is paused for longer than a lease and later killed and restarted.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing.proxy import LatencyProxy

COMMAND = str(Path(__import__("sys").executable).parent / "harel-edge")
STEPS = 10
EXECUTIONS = 60
VISIBILITY = 3.0

pytestmark = [pytest.mark.sqld, pytest.mark.chaos, pytest.mark.slow]


def chain_definition(directory: Path) -> None:
    events = "\n".join(f"event E{i} {{}}" for i in range(1, STEPS + 1))
    states = "\n".join(f"  state S{i} {{ on enter pack }}" for i in range(STEPS))
    moves = "\n".join(
        f"  from S{i - 1} to S{i} on E{i} set context.count = context.count + 1" for i in range(1, STEPS + 1)
    )
    (directory / "chain.stm").write_text(
        "bind {\n  pack = harel_edge.examples.actions.pack\n}\n"
        f"{events}\n"
        "machine chain {\n  context {\n    count: int = 0\n    pack_seconds: float = 0.0\n  }\n"
        f"  initial S0\n{states}\n  final S{STEPS} success\n{moves}\n}}\n"
    )


def worker_env(profile: str, proxy: LatencyProxy, server, prefix: str, n: int, tmp: Path) -> dict[str, str]:
    import os  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAREL_", "RUST_LOG"))}
    env.update(
        HAREL_EDGE_PROFILE=profile,
        HAREL_EDGE_AUTH_TOKEN=server.rw_token,
        HAREL_EDGE_PREFIX=prefix,
        HAREL_EDGE_VISIBILITY=str(VISIBILITY),
        HAREL_EDGE_WORKER_ID=f"chaos-{n}",
        HAREL_EDGE_RETRY_DEADLINE="120",
        HAREL_EDGE_RETRY_MAX_DELAY="1",
    )
    if profile == "sqld":
        env["HAREL_EDGE_URL"] = proxy.url
    else:
        env.update(HAREL_EDGE_SYNC_URL=proxy.url, HAREL_EDGE_DB_PATH=str(tmp / f"replica-{n}-{time.monotonic_ns()}.db"))
    return env


def start(env: dict[str, str], definitions: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [COMMAND, "--log-level", "warning", "worker", "-D", str(definitions)],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=(cwd / f"worker-{env['HAREL_EDGE_WORKER_ID']}.log").open("a"),
    )


@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_every_event_is_applied_exactly_once_in_order_while_workers_are_killed_and_the_primary_fails(
    fresh_sqld_primary, tmp_path, profile
):
    server = fresh_sqld_primary
    prefix = f"chaos_{profile}"
    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=prefix)
    definitions = tmp_path / "definitions"
    definitions.mkdir()
    chain_definition(definitions)
    store = EdgeStore(direct)
    transport = LibsqlTransport(settings=store.settings)
    ids = [f"chain-{i:03d}" for i in range(EXECUTIONS)]
    for execution_id in ids:
        store.save(Execution(id=execution_id, definition_id="chain", context={"count": 0, "pack_seconds": 0.05}))
    kinds = ["Start", *(f"E{step}" for step in range(1, STEPS + 1))]
    transport.publish_many((execution_id, Event(kind=kind), 0, None) for kind in kinds for execution_id in ids)
    store.close()

    def look(sql: str, *args):
        probe = EdgeStore(direct, create_schema=False)
        try:
            return probe.execute(sql, args)
        finally:
            probe.close()

    kills, held_at_kill, faults = 0, 0, []
    with LatencyProxy(server.http_port, delay=0.050) as proxy:
        envs = [worker_env(profile, proxy, server, prefix, n, tmp_path) for n in range(2)]
        workers = [start(env, definitions, tmp_path) for env in envs]
        try:
            deadline = time.monotonic() + 300
            rng = random.Random(7)
            plan = ["kill"] * 3 + ["pause primary"] + ["kill"] * 2 + ["kill primary"] + ["kill"] * 2
            def held_by(n: int) -> int:
                sql = f"SELECT count(*) FROM {prefix}_transport_messages WHERE locked_by LIKE ?"
                return int(look(sql, f"chaos-{n}#%")[0][0])

            def left() -> int:
                return int(look(f"SELECT count(*) FROM {prefix}_transport_messages")[0][0])

            for action in plan:
                time.sleep(rng.uniform(0.1, 0.4))  # pacing between faults, not synchronisation
                if action == "kill":
                    n = rng.randrange(len(workers))
                    # Kill only a worker seen holding leases (between its claim and its commit):
                    # wait for that state, however slow the machine is to start a worker.
                    held = 0
                    while time.monotonic() < deadline and not (held := held_by(n)) and left():
                        time.sleep(0.02)
                    if not held:
                        continue  # the queue drained first: nothing left to interrupt
                    held_at_kill += held
                    workers[n].send_signal(signal.SIGKILL)
                    workers[n].wait(timeout=30)
                    kills += 1
                    envs[n] = worker_env(profile, proxy, server, prefix, n, tmp_path)
                    workers[n] = start(envs[n], definitions, tmp_path)
                elif action == "pause primary":
                    server.pause()
                    faults.append(server.state)
                    time.sleep(VISIBILITY + 2)  # longer than a lease: every held lease lapses
                    server.resume()
                else:
                    server.kill()
                    faults.append(server.state)
                    server.restart()
            while time.monotonic() < deadline:
                if look(f"SELECT count(*) FROM {prefix}_transport_messages")[0][0] == 0:
                    break
                time.sleep(0.2)
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    worker.kill()

    rows = look(f"SELECT id, data FROM {prefix}_executions ORDER BY id")
    final = {row[0]: json.loads(row[1]) for row in rows}
    processed = dict(look(f"SELECT execution_id, count(*) FROM {prefix}_processed_events GROUP BY execution_id"))
    left = look(f"SELECT count(*) FROM {prefix}_transport_messages")[0][0]
    counts = {eid: final[eid]["context"].get("count", 0) for eid in ids}
    report = {
        "profile": profile,
        "executions": len(ids),
        "events": len(ids) * (STEPS + 1),
        "worker kills": kills,
        "leases held at the kills": held_at_kill,
        "primary faults": faults,
        "left in queue": left,
        "executions complete": sum(1 for eid in ids if counts[eid] == STEPS and final[eid]["status"] == "DONE"),
        "executions short": sorted(eid for eid in ids if counts[eid] < STEPS),
        "executions over": sorted(eid for eid in ids if counts[eid] > STEPS),
    }
    print(json.dumps(report, indent=2))
    assert faults == ["paused", "killed"], "the primary really was paused and killed"
    assert kills >= 3 and held_at_kill >= kills, f"workers were killed while holding leases: {report}"
    assert left == 0, f"every event was delivered: {report}"
    assert all(counts[eid] == STEPS for eid in ids), f"every event applied exactly once: {report}"
    assert all(final[eid]["status"] == "DONE" for eid in ids), "every chain reached its final state"
    assert all(processed.get(eid) == STEPS + 1 for eid in ids), "Start and ten events processed per execution"
