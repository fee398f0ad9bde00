"""The compose deployment, brought up with Debian's docker-compose, does real work and comes down clean.

Why: `make up` is how a user first meets harel_edge on a sqld of their own, so the compose
file, compose/up.sh and compose/down.sh are tested the way a user runs them: a project of its
own (unique name, free loopback ports, its own keys), a sqld primary and a replica node with
auth on, three edge workers in containers each with its own embedded replica. Messages are
published through the replica node (writes forwarded to the primary); the workers drain them
through their replicas; the log the workers keep on the primary (tests/e2e/_workers.py)
shows every message processed exactly once, in group order, one at a time per group.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import _workers
import pytest
from harel.spec.states import Event

from harel_edge.connection import EdgeConnection
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.schema import SCHEMA_VERSION
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import wait_until
from harel_edge.testing.fixtures import sqld_unavailable
from harel_edge.testing.sqld import _pid_alive

pytestmark = [pytest.mark.sqld, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
PROJECT_PREFIX = "harel-edge-e2e-"
WORKERS = 3
GROUPS, PER_GROUP = 30, 10


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

    def connect(self, url: str) -> EdgeConnection:
        return EdgeConnection(ExplicitSettings.load(profile="sqld", url=url, auth_token=self.token))

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


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """compose/up.sh in a project of this test; compose/down.sh --volumes afterwards, always."""
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


def test_composed_workers_drain_work_published_through_the_replica_node_once_each_and_down_removes_it_all(
    deployment: Deployment,
) -> None:
    # Every worker has opened its replica (and upgraded the schema) before work arrives.
    def workers_ready() -> bool:
        logs = deployment.compose("logs", "--no-color", "edge-worker").stdout
        return logs.count(" ready") >= WORKERS

    wait_until(workers_ready, timeout=120, interval=0.2, what=f"{WORKERS} edge workers reporting ready")

    replica_node = deployment.connect(deployment.replica_url)
    # A replica node forwards writes but prepares them against its own copy: wait until it
    # has the whole schema the workers made (its version is written last).
    wait_until(
        lambda: replica_node.execute("SELECT user_version FROM pragma_user_version")[0][0] >= SCHEMA_VERSION,
        timeout=30,
        what="the replica node seeing the transport's whole schema",
    )
    publisher = LibsqlTransport(
        settings=ExplicitSettings.load(
            profile="sqld", url=deployment.replica_url, auth_token=deployment.token
        )
    )
    published: dict[str, tuple[str, int]] = {}
    batch = []
    for index in range(PER_GROUP):
        for g in range(GROUPS):
            event = Event(kind="work", data={"index": index})
            published[event.id] = (f"group-{g:02d}", index)
            batch.append(Message(f"group-{g:02d}", event, g % 5, None))
    began = time.monotonic()
    publisher.publish_many(batch)
    publisher.close()

    primary = deployment.connect(deployment.primary_url)

    def drained() -> bool:
        ends = primary.execute(f"SELECT count(*) FROM {_workers.LOG_TABLE} WHERE kind = 'end'")[0][0]
        depth = primary.execute("SELECT count(*) FROM harel_transport_messages")[0][0]
        return depth == 0 and ends >= len(published)

    wait_until(drained, timeout=180, interval=0.2, what="the workers draining the queue")
    elapsed = time.monotonic() - began
    rows = _workers.read_log(primary)
    found = _workers.replay_log(rows, published)
    by_worker: dict[str, int] = {}
    for row in rows:
        if row[2] == "start":
            by_worker[row[1]] = by_worker.get(row[1], 0) + 1
    print(
        f"\n{len(published)} messages through {WORKERS} composed workers: published and drained in "
        f"{elapsed:.2f} s; per worker {by_worker}; {found}"
    )

    assert (found["duplicates"], found["lost"], found["unknown"]) == (0, 0, 0)
    assert (found["overlaps"], found["unheld"]) == (0, 0)
    assert found["out_of_order_groups"] == []
    assert len(by_worker) == WORKERS  # every composed worker took part
    # The replica node follows the primary: it sees the whole log too.
    wait_until(
        lambda: replica_node.execute(f"SELECT count(*) FROM {_workers.LOG_TABLE}")[0][0] == len(rows),
        timeout=30,
        what="the replica node catching up with the log",
    )
    # The workers' token never reaches their output.
    logs = deployment.compose("logs", "--no-color").stdout
    assert deployment.token not in logs
    primary.close()
    replica_node.close()

    deployment.down()
    assert deployment.leftovers() == []
