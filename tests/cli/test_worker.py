"""`harel-edge worker` as a deployment runs it: statecharts and durable workflows, then SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.durable import LibsqlCheckpointer, LibsqlDurable, LibsqlScheduler, connect
from harel_edge.examples.workflow import LEDGER_DDL
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")
WORKFLOW = "fulfil=harel_edge.examples.workflow:fulfil"
ORDER = (("Start", {}), ("Pay", {"amount": 4.0}), ("Ship", {}), ("Deliver", {}))


def seed_orders(settings, orders: list[str], context: dict | None = None) -> None:
    store = EdgeStore(settings)
    transport = LibsqlTransport(settings=store.settings)
    store.execute(LEDGER_DDL)
    for order in orders:
        store.save(Execution(id=order, definition_id="order", context=context or {}))
        for kind, data in ORDER:
            transport.publish(order, Event(kind=kind, data=data), priority=1, routing_key="eu")
    store.close()


def seed_workflows(settings, names: list[str]) -> None:
    async def main() -> None:
        database = connect(settings)
        durable = LibsqlDurable(LibsqlCheckpointer(database), LibsqlScheduler(database, namespace="fulfil"))
        for name in names:
            await durable.scheduler.make_ready(name)
            await durable.arrive(name, "confirmation", {"by": "test"})
        await database.aclose()

    asyncio.run(main())


def outcome(settings, orders: list[str]) -> tuple[list[str], int, int, int]:
    """(each order's status, workflows finished, ledger rows, messages left), read fresh."""
    store = EdgeStore(settings, create_schema=False)
    try:
        statuses = [store.load(o).status.name for o in orders]
        finished = store.execute("SELECT count(*) FROM workflow_checkpoint WHERE step = '$result'")[0][0]
        ledger = store.execute("SELECT count(*) FROM demo_ledger")[0][0]
        left = store.execute(f"SELECT count(*) FROM {settings.prefix}_transport_messages")[0][0]
    finally:
        store.close()
    return statuses, finished, ledger, left


def start_worker(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen:
    """`harel-edge worker` with JSON log lines going to `cwd/worker.log` (read by `log_of`)."""
    log = (cwd / "worker.log").open("w")
    process = subprocess.Popen(
        [COMMAND, "--log-format", "json", "--log-level", "info", "worker", "-D", EXAMPLES, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    process.log_path = cwd / "worker.log"  # type: ignore[attr-defined]
    log.close()
    return process


def log_of(process: subprocess.Popen) -> str:
    return process.log_path.read_text()  # type: ignore[attr-defined]


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> tuple[str, str]:
    """Signal the worker, wait for it, and return ('', its log)."""
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"the worker did not stop after {timeout} s:\n{log_of(process)}") from None
    return "", log_of(process)


def wait_until(predicate, timeout: float = 60, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the worker exited early ({process.returncode}):\n{log_of(process)}")
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def free_ports(count: int) -> int:
    """A port P such that P .. P+count-1 are all free now (a worker process n serves P+n)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            held = []
            for n in range(count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port + n))
            return port
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no free port range")


def test_a_worker_runs_statecharts_and_workflows_then_exits_0_on_sigterm(place, tmp_path):
    values = {**place.values(), "worker_id": "edge-test"}
    settings = place.settings(**values)
    orders = [f"order-{i}" for i in range(3)]
    seed_orders(settings, orders)
    seed_workflows(settings, ["wf-1", "wf-2"])
    process = start_worker(env_for(values), tmp_path, "-w", WORKFLOW, "--poll", "0.1")
    try:
        done = wait_until(
            lambda: (o := outcome(settings, orders))[0] == ["DONE"] * 3 and o[1] == 2 and o[3] == 0 and o,
            process=process,
        )
    finally:
        _, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert done[2] == 2, "each workflow charged exactly once"
    names = [e["event"] for e in events(stderr)]
    assert "worker started" in names and names[-1] == "worker stopped"
    stopped = events(stderr)[-1]
    assert stopped["acks"] == 12 and stopped["worker_id"] == "edge-test"


def test_sigterm_lets_the_event_in_hand_finish_and_leaves_the_rest_queued(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    settings = ExplicitSettings.load(**values)
    seed_orders(settings, ["slow"], context={"pack_seconds": 2.0})
    process = start_worker(env_for(values), tmp_path)

    # In hand: its action has begun (a lease alone may be one claimed ahead, given back at a stop).
    try:
        wait_until(lambda: "packing slowly" in log_of(process), process=process)
    finally:
        _, stderr = stop(process)
    assert process.returncode == 0, stderr
    store = EdgeStore(settings, create_schema=False)
    try:
        exe = store.load("slow")
        left = store.execute(
            "SELECT json_extract(event, '$.kind'), locked_by FROM harel_transport_messages ORDER BY seq"
        )
    finally:
        store.close()
    assert exe.active_path.endswith("Shipped") and exe.status is Status.RUNNING, (
        "the Ship in hand was finished"
    )
    assert left == [("Deliver", None)], "the next event is still queued, and not held by anyone"


def test_worker_processes_share_the_work_serve_metrics_and_stop_together(tmp_path):
    port = free_ports(2)
    values = {"profile": "local", "db_path": str(tmp_path / "q.db"), "worker_id": "pool"}
    settings = ExplicitSettings.load(**values)
    orders = [f"order-{i}" for i in range(6)]
    seed_orders(settings, orders)
    seed_workflows(settings, ["wf-1"])
    process = start_worker(
        env_for(values),
        tmp_path,
        "-w",
        WORKFLOW,
        "--poll",
        "0.1",
        "--processes",
        "2",
        "--metrics-port",
        str(port),
    )
    try:
        wait_until(lambda: (o := outcome(settings, orders))[0] == ["DONE"] * 6 and o[1] == 1, process=process)

        def scrape(p: int) -> dict[str, float] | None:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode()
            except OSError:
                return None  # not serving yet
            return {
                line.split(" ")[0]: float(line.split(" ")[1])
                for line in text.splitlines()
                if line.startswith("harel_edge_") and " " in line
            }

        samples = [wait_until(lambda p=p: scrape(p)) for p in (port, port + 1)]
    finally:
        _, stderr = stop(process)
    assert process.returncode == 0, stderr
    acks = sum(s.get("harel_edge_acks_total", 0) for s in samples)
    claims = sum(s.get("harel_edge_claims_total", 0) for s in samples)
    steps = sum(v for s in samples for k, v in s.items() if k.startswith("harel_edge_workflow_steps_total"))
    assert acks == claims == 24, samples
    assert steps >= 4, "reserve, charge, ship, result (and the sleep deadline)"
    stopped = [e for e in events(stderr) if e["event"] == "worker stopped"]
    assert sorted(e["worker_id"] for e in stopped) == ["pool-1", "pool-2"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["-D", "/nowhere"], "is not a directory"),
        (["-w", "no-colon"], "is not [namespace=]module:function"),
        (["-w", "x=harel_edge.examples.workflow:nothing_here"], "cannot be loaded"),
        ([], "nothing to run"),
    ],
    ids=["no directory", "bad workflow", "missing function", "nothing"],
)
def test_a_worker_with_nothing_valid_to_run_says_why_and_exits_2(args, words, tmp_path):
    path = tmp_path / "q.db"
    result = subprocess.run(
        [COMMAND, "worker", *args],
        env=env_for({"db_path": str(path)}),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert not path.exists()


def test_an_execution_started_from_the_command_line_runs_on_the_worker(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    env = env_for(values)
    for args in (
        ["migrate"],  # publish creates no database: `migrate` (or a worker) does
        [
            "publish",
            "order-9",
            "Start",
            "--create",
            "order",
            "-D",
            EXAMPLES,
            "--data",
            '{"pack_seconds": 0}',
            "-p",
            "3",
            "-r",
            "ap",
        ],
        ["publish", "order-9", "Pay", "--data", '{"amount": 9.5}'],
    ):
        result = subprocess.run(
            [COMMAND, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
    settings = ExplicitSettings.load(**values)
    process = start_worker(env, tmp_path)

    def paid():
        store = EdgeStore(settings, create_schema=False)
        try:
            exe = store.load("order-9")
        finally:
            store.close()
        return exe if (exe.active_path or "").endswith("Paid") else None

    try:
        exe = wait_until(paid, process=process)
    finally:
        stop(process)
    assert exe.context["paid"] == 9.5 and exe.priority == 3


@pytest.mark.sqld
def test_a_worker_outlives_its_primarys_restart_and_carries_on(fresh_sqld_primary, tmp_path):
    server = fresh_sqld_primary
    values = {
        "profile": "sqld",
        "url": server.http_url,
        "auth_token": server.rw_token,
        "retry_deadline": "1",  # give up fast, so the loop itself has to survive the outage
        "retry_attempts": "3",
    }
    settings = ExplicitSettings.load(**values)
    seed_orders(settings, ["before"])
    process = start_worker(env_for(values), tmp_path)
    try:
        wait_until(lambda: outcome(settings, ["before"])[0] == ["DONE"], process=process)
        server.stop()
        wait_until(lambda: "loop failed; restarting" in log_of(process), process=process)
        server.restart()
        seed_orders(settings, ["after"])
        wait_until(lambda: outcome(settings, ["after"])[0] == ["DONE"], process=process)
    finally:
        _, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert any(e["event"] == "loop failed; restarting" for e in events(stderr)), stderr


def test_an_event_for_a_machine_the_worker_does_not_run_is_dead_lettered_at_once_with_the_reason(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    settings = ExplicitSettings.load(**values)
    with EdgeStore(settings) as store, LibsqlTransport(settings=settings) as transport:
        store.save(Execution(id="stray-1", definition_id="nosuchmachine"))
        transport.publish("stray-1", Event(kind="Start"))
    seed_orders(settings, ["fine"])

    def read(sql: str) -> list[tuple]:
        with EdgeStore(settings, create_schema=False) as store:
            return store.execute(sql)

    process = start_worker(env_for(values), tmp_path)
    try:
        wait_until(lambda: read("SELECT 1 FROM harel_executions WHERE id = 'fine' AND json_extract(data, '$.status') = 'DONE'"), process=process)
        dead = wait_until(lambda: read("SELECT attempts, last_error FROM harel_dead_letters WHERE group_id = 'stray-1'"), process=process)
    finally:
        _, stderr = stop(process)
    ((attempts, error),) = dead
    assert attempts == 0 and error.startswith("unknown machine 'nosuchmachine': this worker runs order"), error
    assert "Traceback" not in stderr, "one line, not a traceback at each delivery"
    assert process.returncode == 0, stderr
