"""The compose deployment, brought up with Debian's docker-compose, runs harel_edge's worker on
the demo's statecharts, completes orders published with the CLI, and comes down clean.

Why: `make up` is how a user first meets harel_edge on a sqld of their own, so the compose
file, compose/up.sh and compose/down.sh are tested the way a user runs them: a project of its
own (unique name, free loopback ports, its own keys), a sqld primary and a replica node with
auth on, three `harel-edge worker` containers each with its own embedded replica, running the
definitions of harel_edge/examples (the default of HAREL_EDGE_DEFINITIONS_DIR). Orders are
published with the `harel-edge publish` command, as a user would, and every execution must
reach its final state on the primary.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harel.engine.execution import Status

from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import wait_until
from harel_edge.testing.fixtures import sqld_unavailable
from harel_edge.testing.sqld import _pid_alive

pytestmark = [pytest.mark.sqld, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
PROJECT_PREFIX = "harel-edge-e2e-"
WORKERS = 3
OWN_WORKERS = 1  # the user's-own-definitions test checks what the workers run, not how many
ORDERS = 3
CLI = REPO / ".venv" / "bin" / "harel-edge"
EXAMPLES = REPO / "harel_edge" / "examples"


@dataclass
class Deployment:
    project: str
    env: dict[str, str]
    primary_url: str
    replica_url: str
    token: str

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603
            ["docker-compose", "--file", str(COMPOSE_FILE), "--project-name", self.project, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def connect(self, url: str) -> Statements:
        return Statements(ExplicitSettings.load(profile="sqld", url=url, auth_token=self.token))

    def down(self) -> None:
        """compose/down.sh --volumes: idempotent, so the fixture can always call it again."""
        done = subprocess.run(
            ["bash", str(REPO / "compose" / "down.sh"), "--volumes"],
            env=self.env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, f"compose/down.sh failed:\n{done.stdout}\n{done.stderr}"

    def leftovers(self) -> list[str]:
        """Containers and volumes that still carry the project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for command in (["docker", "ps", "--all", "--quiet"], ["docker", "volume", "ls", "--quiet"]):
            listed = subprocess.run([*command, "--filter", label], capture_output=True, text=True, timeout=60)
            found += listed.stdout.split()
        return found


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _remove_projects_of_dead_test_runs() -> None:
    """A test process killed outright leaves its project running: its name carries its pid."""
    listed = subprocess.run(
        ["docker", "ps", "--all", "--filter", "label=com.docker.compose.project",
         "--format", '{{ .Label "com.docker.compose.project" }}'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for project in set(listed.stdout.split()):
        if project.startswith(PROJECT_PREFIX):
            pid = project[len(PROJECT_PREFIX) :].split("-")[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                subprocess.run(
                    ["docker-compose", "--file", str(COMPOSE_FILE), "--project-name", project,
                     "down", "--volumes", "--remove-orphans"],
                    capture_output=True, timeout=120,
                )  # fmt: skip


TICKET = """
bind {
  opened = ticket_actions.opened
}

event Close { by: string }

machine ticket {
  context {
    closed_by: string = ""
  }
  initial Open
  state Open {
    on enter opened
  }
  final Closed success
  from Open to Closed on Close set context.closed_by = event.by
}
"""
# The module the statechart's `bind` names: a worker that cannot import it does not start.
TICKET_ACTIONS = '''
def opened(execution, event, **_inputs):
    pass
'''


@pytest.fixture
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    """compose/up.sh in a project of this test; compose/down.sh --volumes afterwards, always.

    Parametrized indirectly with "own", the workers run a directory of the user's own (a
    statechart and the Python module its `bind` block names) instead of the demo's."""
    if shutil.which("docker-compose") is None:
        sqld_unavailable("docker-compose is not installed (apt-get install docker-compose)")
    from harel_edge.testing import backend_unavailable_reason

    reason = backend_unavailable_reason("docker")
    if reason:
        sqld_unavailable(reason)
    _remove_projects_of_dead_test_runs()

    primary_http, primary_grpc, replica_http = _free_ports(3)
    project = f"{PROJECT_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}
    env.update(
        COMPOSE_PROJECT_NAME=project,
        HAREL_EDGE_KEYS_DIR=str(tmp_path / "keys"),
        HAREL_EDGE_WORKERS=str(WORKERS),
        SQLD_PRIMARY_HTTP_PORT=str(primary_http),
        SQLD_PRIMARY_GRPC_PORT=str(primary_grpc),
        SQLD_REPLICA_HTTP_PORT=str(replica_http),
    )
    if getattr(request, "param", None) == "own":
        own = tmp_path / "my-statecharts"
        own.mkdir()
        (own / "ticket.stm").write_text(TICKET)
        (own / "ticket_actions.py").write_text(TICKET_ACTIONS)
        env["HAREL_EDGE_DEFINITIONS_DIR"] = str(own)
        env["HAREL_EDGE_WORKERS"] = str(OWN_WORKERS)
    made = Deployment(
        project, env, f"http://127.0.0.1:{primary_http}", f"http://127.0.0.1:{replica_http}", ""
    )
    try:
        up = subprocess.run(
            ["bash", str(REPO / "compose" / "up.sh")], env=env, capture_output=True, text=True, timeout=360
        )
        assert up.returncode == 0, f"compose/up.sh failed:\n{up.stdout}\n{up.stderr}"
        made.token = (tmp_path / "keys" / "token-rw").read_text().strip()
        yield made
    finally:
        made.down()


def _cli(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """`harel-edge ARGS` on the sqld profile against the composed primary, the token in the environment."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}
    env.update(
        HAREL_EDGE_PROFILE="sqld", HAREL_EDGE_URL=deployment.primary_url, HAREL_EDGE_AUTH_TOKEN=deployment.token
    )
    return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=120)  # noqa: S603


def test_composed_harel_edge_workers_complete_every_order_published_with_the_cli_and_down_removes_it_all(
    deployment: Deployment,
) -> None:
    # Every worker says it started (at the compose file's default log level), its schema in place.
    def workers_started() -> bool:
        logs = deployment.compose("logs", "--no-color", "edge-worker").stdout
        return logs.count("worker started") >= WORKERS

    wait_until(workers_started, timeout=120, interval=0.2, what=f"{WORKERS} harel-edge workers starting")

    orders = [f"order-{n:03d}" for n in range(1, ORDERS + 1)]
    for n, order in enumerate(orders):
        steps = [
            ("Start", "{}", ("--create", "order", "--definitions", str(EXAMPLES))),
            ("Pay", json.dumps({"amount": 10.0 + n}), ()),
            ("Ship", "{}", ()),
            ("Deliver", "{}", ()),
        ]
        for kind, data, extra in steps:
            done = _cli(deployment, "publish", order, kind, "--data", data, *extra)
            assert done.returncode == 0, f"publish {order} {kind} failed:\n{done.stdout}\n{done.stderr}"

    primary = deployment.connect(deployment.primary_url)

    def executions() -> dict[str, tuple[str, str, float]]:
        rows = primary.execute(
            "SELECT id, json_extract(data, '$.status'), json_extract(data, '$.active_path'), "
            "json_extract(data, '$.context.paid') FROM harel_executions"
        )
        return {row[0]: (row[1], row[2], row[3]) for row in rows}

    def completed() -> bool:
        found = executions()
        return len(found) == ORDERS and all(status == Status.DONE.value for status, _, _ in found.values())

    wait_until(completed, timeout=180, interval=0.2, what="every order reaching its final state")
    found = executions()
    print(f"\n{ORDERS} orders through {WORKERS} composed harel-edge workers: {found}")
    assert sorted(found) == orders
    for n, order in enumerate(orders):
        status, active, paid = found[order]
        assert "Delivered" in str(active), found[order]
        assert paid == 10.0 + n
    assert primary.execute("SELECT count(*) FROM harel_transport_messages")[0][0] == 0
    logs = deployment.compose("logs", "--no-color").stdout
    assert "Traceback" not in logs
    # The workers' token never reaches their output.
    assert deployment.token not in logs
    primary.close()

    deployment.down()
    assert deployment.leftovers() == []


@pytest.mark.parametrize("deployment", ["own"], indirect=True)
def test_composed_workers_run_the_users_own_statecharts_and_the_modules_they_bind(
    deployment: Deployment, tmp_path: Path
) -> None:
    wait_until(
        lambda: deployment.compose("logs", "--no-color", "edge-worker").stdout.count("worker started") >= OWN_WORKERS,
        timeout=120, interval=0.2, what="the harel-edge worker starting",
    )  # fmt: skip
    logs = deployment.compose("logs", "--no-color", "edge-worker").stdout
    assert "ticket" in logs and "'order'" not in logs  # the user's machines, not the demo's
    own = tmp_path / "my-statecharts"
    lines = [
        json.dumps({"group": f"t-{n}", "kind": "Start", "create": "ticket", "id": f"start-{n}"}) for n in range(3)
    ] + [json.dumps({"group": f"t-{n}", "kind": "Close", "data": {"by": f"ada-{n}"}, "id": f"close-{n}"}) for n in range(3)]
    (tmp_path / "tickets.ndjson").write_text("\n".join(lines) + "\n")
    done = _cli(deployment, "publish", "--from", str(tmp_path / "tickets.ndjson"), "--definitions", str(own))
    assert done.returncode == 0, done.stderr
    primary = deployment.connect(deployment.primary_url)

    def closed() -> dict[str, tuple[str, str]]:
        rows = primary.execute(
            "SELECT id, json_extract(data, '$.status'), json_extract(data, '$.context.closed_by') FROM harel_executions"
        )
        found = {row[0]: (row[1], row[2]) for row in rows}
        return found if len(found) == 3 and all(v[0] == Status.DONE.value for v in found.values()) else {}

    found = wait_until(closed, timeout=180, interval=0.2, what="every ticket reaching its final state")
    assert found == {f"t-{n}": (Status.DONE.value, f"ada-{n}") for n in range(3)}
    primary.close()
    deployment.down()
    assert deployment.leftovers() == []


def test_up_refuses_a_definitions_directory_without_statecharts_before_starting_anything(tmp_path: Path) -> None:
    empty = tmp_path / "definitions"
    empty.mkdir()
    env = {**os.environ, "HAREL_EDGE_DEFINITIONS_DIR": str(empty), "HAREL_EDGE_KEYS_DIR": str(tmp_path / "keys")}
    done = subprocess.run(
        ["bash", str(REPO / "compose" / "up.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "holds no .stm file" in done.stderr
    assert not (tmp_path / "keys").exists()  # nothing was made, nothing started


def test_the_compose_file_mounts_the_users_definitions_directory_when_one_is_named(tmp_path: Path) -> None:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed")
    mine = tmp_path / "mine"
    mine.mkdir()
    base = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}

    def rendered(**env: str) -> str:
        done = subprocess.run(  # noqa: S603
            ["docker-compose", "--file", str(COMPOSE_FILE), "config"],
            env={**base, "HAREL_EDGE_KEYS_DIR": str(tmp_path / "keys"), **env},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert f"{mine}:/opt/harel-edge/definitions:ro" in rendered(HAREL_EDGE_DEFINITIONS_DIR=str(mine))
    assert f"{EXAMPLES}:/opt/harel-edge/definitions:ro" in rendered()
    assert "_workers.py" not in rendered()
