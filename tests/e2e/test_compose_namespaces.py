"""The compose deployment of a database per tenant (HAREL_EDGE_COMPOSE=namespaces), brought up
with Debian's docker-compose as a user runs it: a sqld primary serving namespaces, its `tenants`
service making three tenants' databases, and two `harel-edge worker` containers each serving
all three. Orders published to each tenant with the CLI must all be delivered, each in its own
database, and `compose/down.sh` must leave nothing behind."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from test_compose import PROJECT_PREFIX, _free_ports, _remove_projects_of_dead_test_runs

from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import backend_unavailable_reason, wait_until
from harel_edge.testing.fixtures import sqld_unavailable

pytestmark = [pytest.mark.sqld, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / ".venv" / "bin" / "harel-edge"
EXAMPLES = REPO / "harel_edge" / "examples"
TENANTS = ("tenant1", "tenant2", "tenant3")
ORDERS = 5
WORKERS = 2


def test_two_composed_workers_serve_three_tenants_databases_and_deliver_every_order_in_its_own(tmp_path: Path) -> None:
    if shutil.which("docker-compose") is None:
        sqld_unavailable("docker-compose is not installed (apt-get install docker-compose)")
    reason = backend_unavailable_reason("docker")
    if reason:
        sqld_unavailable(reason)
    _remove_projects_of_dead_test_runs()
    http, grpc, admin = _free_ports(3)
    project = f"{PROJECT_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}
    env.update(
        HAREL_EDGE_COMPOSE="namespaces", COMPOSE_PROJECT_NAME=project, HAREL_EDGE_KEYS_DIR=str(tmp_path / "keys"),
        SQLD_PRIMARY_HTTP_PORT=str(http), SQLD_PRIMARY_GRPC_PORT=str(grpc), SQLD_ADMIN_PORT=str(admin),
    )  # fmt: skip
    compose = ["docker-compose", "--file", str(REPO / "compose" / "docker-compose.namespaces.yml"), "--project-name", project]
    try:
        up = subprocess.run(["bash", str(REPO / "compose" / "up.sh")], env=env, capture_output=True, text=True, timeout=360)
        assert up.returncode == 0, f"compose/up.sh failed:\n{up.stdout}\n{up.stderr}"
        token = (tmp_path / "keys" / "token-rw").read_text().strip()
        user = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}
        user.update(HAREL_EDGE_PROFILE="sqld", HAREL_EDGE_URL=f"http://127.0.0.1:{http}", HAREL_EDGE_AUTH_TOKEN=token,
                    HAREL_EDGE_DATABASES=",".join(TENANTS))  # fmt: skip
        for tenant in TENANTS:
            lines = [
                {"group": f"{tenant}-{n}", "kind": kind, "id": f"{tenant}-{n}-{kind}", "data": data,
                 **({"create": "order"} if kind == "Start" else {})}
                for n in range(ORDERS)
                for kind, data in (("Start", {}), ("Pay", {"amount": 1.0 + n}), ("Ship", {}), ("Deliver", {}))
            ]  # fmt: skip
            (tmp_path / f"{tenant}.ndjson").write_text("".join(json.dumps(line) + "\n" for line in lines))
            done = subprocess.run(
                [str(CLI), "publish", "--database", tenant, "--from", str(tmp_path / f"{tenant}.ndjson"), "-D", str(EXAMPLES)],
                env=user, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, f"publish to {tenant} failed:\n{done.stdout}\n{done.stderr}"
        databases = {
            tenant: Statements(ExplicitSettings.load(profile="sqld", url=f"http://127.0.0.1:{http}", database=tenant,
                                                     auth_token=token))
            for tenant in TENANTS
        }  # fmt: skip

        def delivered(tenant: str) -> list[str]:
            rows = databases[tenant].execute("SELECT id, json_extract(data, '$.active_path') FROM harel_executions")
            return sorted(row[0] for row in rows if "Delivered" in str(row[1]))

        for tenant in TENANTS:
            wait_until(lambda tenant=tenant: len(delivered(tenant)) == ORDERS, timeout=180, interval=0.2,
                       what=f"every order of {tenant} delivered")  # fmt: skip
            assert delivered(tenant) == sorted(f"{tenant}-{n}" for n in range(ORDERS)), "only its own orders"
            assert databases[tenant].execute("SELECT count(*) FROM harel_transport_messages")[0][0] == 0
            databases[tenant].close()
        logs = subprocess.run([*compose, "logs", "--no-color", "edge-worker"], env=env, capture_output=True, text=True,
                              timeout=120).stdout  # fmt: skip
        assert logs.count("serving databases") == WORKERS, logs[-2000:]
        assert "Traceback" not in logs and token not in logs
    finally:
        down = subprocess.run(["bash", str(REPO / "compose" / "down.sh"), "--volumes"], env=env, capture_output=True,
                              text=True, timeout=180)  # fmt: skip
        assert down.returncode == 0, f"compose/down.sh failed:\n{down.stdout}\n{down.stderr}"
    label = f"label=com.docker.compose.project={project}"
    left = [subprocess.run([*command, "--filter", label], capture_output=True, text=True, timeout=60).stdout.split()
            for command in (["docker", "ps", "--all", "--quiet"], ["docker", "volume", "ls", "--quiet"])]  # fmt: skip
    assert left == [[], []]
