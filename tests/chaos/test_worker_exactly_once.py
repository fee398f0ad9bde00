"""The edge worker through a 100 ms link, its window following it, while it is killed and its
primary is paused and killed.

Each execution is a chain of states, one event a step (Start, then E1..En), and each step adds one
to `count`: an event applied twice overshoots, a lost one stalls the chain, an event out of order
finds no transition. So, at the end, every execution in its final state with count n and n + 1
processed events means every event was applied exactly once, in order. Two shapes: many executions
of a few steps (60 x 20), and a few hot ones (4 x 150) whose queued steps come in runs under one
lease (bounded at 16 here, so the queue outlasts the faults). Workers (`harel-edge
worker`, two processes) are SIGKILLed while they hold leases (between the claim and the commit),
and the primary is paused for longer than a lease and later killed and restarted.

The test paces the workers with a gate, not with time: each state's enter action waits while a
file exists. With the gate shut, a worker that claims an event stops inside its handler holding
its leases, which is where a kill must land; between faults the gate opens until a few more
events are processed, so however fast the workers are, the queue outlasts the faults.
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
from harel_edge.testing import wait_until
from harel_edge.testing.proxy import LatencyProxy

COMMAND = str(Path(__import__("sys").executable).parent / "harel-edge")
SHAPES = {"many": (60, 20, None), "hot": (4, 150, 16)}  # executions, steps, HAREL_EDGE_MAX_RUN
VISIBILITY = 3.0
PROGRESS_BETWEEN_FAULTS = 10  # events processed with the gate open before the next fault

pytestmark = [pytest.mark.sqld, pytest.mark.chaos, pytest.mark.slow]


def gate_action(directory: Path, gate: Path) -> None:
    """The enter action every state runs: it waits while the test holds the gate shut."""
    (directory / "chaos_gate.py").write_text(
        "import time\nfrom pathlib import Path\n\n"
        f"GATE = Path({str(gate)!r})\n\n\n"
        "def wait_at_gate(execution, event, **_inputs):\n"
        "    deadline = time.monotonic() + 120\n"
        "    while GATE.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
    )


def chain_definition(directory: Path, steps: int) -> None:
    events = "\n".join(f"event E{i} {{}}" for i in range(1, steps + 1))
    states = "\n".join(f"  state S{i} {{ on enter wait_at_gate }}" for i in range(steps))
    moves = "\n".join(
        f"  from S{i - 1} to S{i} on E{i} set context.count = context.count + 1" for i in range(1, steps + 1)
    )
    (directory / "chain.stm").write_text(
        "bind {\n  wait_at_gate = chaos_gate.wait_at_gate\n}\n"
        f"{events}\n"
        "machine chain {\n  context {\n    count: int = 0\n  }\n"
        f"  initial S0\n{states}\n  final S{steps} success\n{moves}\n}}\n"
    )


def worker_env(profile: str, proxy: LatencyProxy, server, prefix: str, n: int, tmp: Path, max_run: int | None) -> dict[str, str]:
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
        PYTHONPATH=str(tmp / "actions"),
    )
    if max_run is not None:
        env["HAREL_EDGE_MAX_RUN"] = str(max_run)
    if profile == "sqld":
        env["HAREL_EDGE_URL"] = proxy.url
    else:
        env.update(HAREL_EDGE_SYNC_URL=proxy.url, HAREL_EDGE_DB_PATH=str(tmp / f"replica-{n}-{time.monotonic_ns()}.db"))
    return env


def fail_primary(action: str, server, gate: Path) -> str:
    """Pause the primary longer than a lease ("pause primary") or kill and restart it, with the
    gate open so that events are in flight meanwhile; returns the state the fault left it in."""
    gate.unlink()
    if action == "pause primary":
        server.pause()
        state = server.state
        time.sleep(VISIBILITY + 2)  # the fault's length: longer than a lease, so every lease lapses
        server.resume()
    else:
        server.kill()
        state = server.state
        server.restart()
    gate.touch()
    return state


def start(env: dict[str, str], definitions: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [COMMAND, "--log-level", "warning", "worker", "-D", str(definitions)],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=(cwd / f"worker-{env['HAREL_EDGE_WORKER_ID']}.log").open("a"),
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("profile", ["sqld", "replica"])
def test_every_event_is_applied_exactly_once_in_order_while_workers_are_killed_and_the_primary_fails(
    fresh_sqld_primary, tmp_path, profile, shape
):
    server = fresh_sqld_primary
    executions, steps, max_run = SHAPES[shape]
    prefix = f"chaos_{profile}"
    direct = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix=prefix)
    definitions, actions, gate = tmp_path / "definitions", tmp_path / "actions", tmp_path / "gate"
    definitions.mkdir()
    actions.mkdir()
    chain_definition(definitions, steps)
    gate_action(actions, gate)
    gate.touch()  # shut until the first fault: claimed events wait in their handlers
    store = EdgeStore(direct)
    transport = LibsqlTransport(settings=store.settings)
    ids = [f"chain-{i:03d}" for i in range(executions)]
    for execution_id in ids:
        store.save(Execution(id=execution_id, definition_id="chain", context={"count": 0}))
    kinds = ["Start", *(f"E{step}" for step in range(1, steps + 1))]
    transport.publish_many((execution_id, Event(kind=kind), 0, None) for kind in kinds for execution_id in ids)
    store.close()

    def look(sql: str, *args):
        probe = EdgeStore(direct, create_schema=False)
        try:
            return probe.execute(sql, args)
        finally:
            probe.close()

    def holding() -> dict[int, int]:
        """Leases each worker holds now, by worker number."""
        sql = f"SELECT substr(locked_by, 7, 1), count(*) FROM {prefix}_transport_messages WHERE locked_by LIKE 'chaos-_#%' GROUP BY 1"
        return {int(n): int(held) for n, held in look(sql)}

    def processed_so_far() -> int:
        return int(look(f"SELECT count(*) FROM {prefix}_processed_events")[0][0])

    def still_queued() -> int:
        return int(look(f"SELECT count(*) FROM {prefix}_transport_messages")[0][0])

    kills, held_at_kill, faults = 0, 0, []
    with LatencyProxy(server.http_port, delay=0.050) as proxy:
        envs = [worker_env(profile, proxy, server, prefix, n, tmp_path, max_run) for n in range(2)]
        workers = [start(env, definitions, tmp_path) for env in envs]
        deadline = time.monotonic() + 300

        def wait_for(what: str, condition):  # noqa: ANN202 - what `condition` returned, truthy
            return wait_until(condition, timeout=max(deadline - time.monotonic(), 0.1), interval=0.02, what=what)

        def let_events_through() -> None:
            """Open the gate until a few more events are processed, then shut it again."""
            before = processed_so_far()
            gate.unlink()
            wait_for("events to be processed", lambda: processed_so_far() >= before + PROGRESS_BETWEEN_FAULTS)
            gate.touch()

        rng = random.Random(7)
        plan = ["kill"] * 3 + ["pause primary"] + ["kill"] * 2 + ["kill primary"] + ["kill"] * 2
        try:
            for action in plan:
                if action == "kill":
                    # The gate is shut: a worker that claimed events waits in a handler, holding leases.
                    assert still_queued() > 0, "the queue outlasts the faults (the gate lets few events through)"
                    held = wait_for("a worker holding leases", holding)
                    n = rng.choice(sorted(held))
                    held_at_kill += held[n]
                    workers[n].send_signal(signal.SIGKILL)
                    workers[n].wait(timeout=30)
                    kills += 1
                    envs[n] = worker_env(profile, proxy, server, prefix, n, tmp_path, max_run)
                    workers[n] = start(envs[n], definitions, tmp_path)
                else:
                    faults.append(fail_primary(action, server, gate))
                let_events_through()
            gate.unlink()
            wait_for("the queue to drain", lambda: still_queued() == 0)
        finally:
            gate.unlink(missing_ok=True)
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
        "shape": shape,
        "executions": len(ids),
        "events": len(ids) * (steps + 1),
        "worker kills": kills,
        "leases held at the kills": held_at_kill,
        "primary faults": faults,
        "left in queue": left,
        "executions complete": sum(1 for eid in ids if counts[eid] == steps and final[eid]["status"] == "DONE"),
        "executions short": sorted(eid for eid in ids if counts[eid] < steps),
        "executions over": sorted(eid for eid in ids if counts[eid] > steps),
    }
    print(json.dumps(report, indent=2))
    assert faults == ["paused", "killed"], "the primary really was paused and killed"
    assert kills == plan.count("kill") and held_at_kill >= kills, f"workers were killed while holding leases: {report}"
    assert left == 0, f"every event was delivered: {report}"
    assert all(counts[eid] == steps for eid in ids), f"every event applied exactly once: {report}"
    assert all(final[eid]["status"] == "DONE" for eid in ids), "every chain reached its final state"
    assert all(processed.get(eid) == steps + 1 for eid in ids), "Start and every step's event processed once per execution"
