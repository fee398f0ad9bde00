"""compose/docker-compose.turso.yml as far as it can run here: Turso itself is out of reach (no
network but package registries), so a real sqld on loopback stands in for the remote primary. Two
composed `harel-edge worker` containers, each with its own embedded replica of it, complete orders
published with the CLI, and `down` leaves nothing."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from harel.engine.execution import Status

from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements
from harel_edge.testing import wait_until
from harel_edge.testing.fixtures import sqld_unavailable

pytestmark = [pytest.mark.sqld, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.turso.yml"
CLI = REPO / ".venv" / "bin" / "harel-edge"
EXAMPLES = REPO / "harel_edge" / "examples"
WORKERS, ORDERS = 2, 3


def test_the_turso_compose_files_workers_complete_orders_against_a_remote_primary(fresh_sqld_primary, tmp_path):
    if shutil.which("docker-compose") is None:
        sqld_unavailable("docker-compose is not installed (apt-get install docker-compose)")
    built = subprocess.run(["bash", str(REPO / "compose" / "build-worker-image.sh")], capture_output=True, text=True, timeout=360)
    assert built.returncode == 0, built.stderr[-2000:]
    token = fresh_sqld_primary.rw_token
    project = f"harel-edge-e2e-{os.getpid()}-turso-{secrets.token_hex(3)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("HAREL_EDGE_")}
    env.update(HAREL_EDGE_SYNC_URL=fresh_sqld_primary.http_url, HAREL_EDGE_AUTH_TOKEN=token)

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603
            ["docker-compose", "--file", str(COMPOSE_FILE), "--project-name", project, *args],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    try:
        up = compose("up", "-d", "--scale", f"edge-worker={WORKERS}")
        assert up.returncode == 0, up.stderr[-2000:]
        wait_until(
            lambda: compose("logs", "--no-color").stdout.count("worker started") >= WORKERS,
            timeout=120, interval=0.2, what=f"{WORKERS} composed workers starting",
        )  # fmt: skip
        lines = [
            {"group": f"order-{n}", "kind": kind, "data": data, **({"create": "order"} if kind == "Start" else {})}
            for n in range(ORDERS)
            for kind, data in (("Start", {}), ("Pay", {"amount": 5.0 + n}), ("Ship", {}), ("Deliver", {}))
        ]
        cli_env = dict(env, HAREL_EDGE_PROFILE="sqld", HAREL_EDGE_URL=fresh_sqld_primary.http_url)
        del cli_env["HAREL_EDGE_SYNC_URL"]
        published = subprocess.run(  # noqa: S603
            [str(CLI), "publish", "--from", "-", "-D", str(EXAMPLES)], input="\n".join(json.dumps(x) for x in lines),
            env=cli_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
        primary = Statements(ExplicitSettings.load(profile="sqld", url=fresh_sqld_primary.http_url, auth_token=token))
        try:
            def statuses() -> dict[str, str]:
                rows = primary.execute("SELECT id, json_extract(data, '$.status') FROM harel_executions")
                return dict(rows)

            wait_until(
                lambda: statuses() == {f"order-{n}": Status.DONE.value for n in range(ORDERS)},
                timeout=180, interval=0.2, what="every order reaching its final state",
            )  # fmt: skip
            assert primary.execute("SELECT count(*) FROM harel_transport_messages") == [(0,)]
        finally:
            primary.close()
        logs = compose("logs", "--no-color").stdout
        assert "Traceback" not in logs and token not in logs
    finally:
        down = compose("down", "--volumes", "--remove-orphans")
    assert down.returncode == 0, down.stderr[-2000:]
    label = f"label=com.docker.compose.project={project}"
    left = subprocess.run(["docker", "ps", "--all", "--quiet", "--filter", label], capture_output=True, text=True, timeout=60)
    assert left.stdout.split() == [], "down leaves nothing running"
