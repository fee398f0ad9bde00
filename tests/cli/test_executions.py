"""`harel-edge executions list / show` and the library functions under them: every execution
with its status and active state, the events still queued for it, its last error and its
history, on a database a worker really ran."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for, run

from harel_edge import executions
from harel_edge.errors import ConfigurationError
from harel_edge.settings import ExplicitSettings
from harel_edge.testing import wait_until

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


@pytest.fixture
def ran(tmp_path):
    """A local database where a worker delivered order-1 and order-2 waits for its payment
    (its Pay still queued, published after the worker stopped)."""
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    lines = [
        {"group": "order-1", "kind": "Start", "create": "order", "id": "s1"},
        {"group": "order-1", "kind": "Pay", "data": {"amount": 4.5}, "id": "p1"},
        {"group": "order-1", "kind": "Ship", "id": "sh1"},
        {"group": "order-1", "kind": "Deliver", "id": "d1"},
        {"group": "order-2", "kind": "Start", "create": "order", "id": "s2"},
    ]
    done = run(
        ["publish", "--from", "-", "-D", EXAMPLES], env, tmp_path, input="\n".join(json.dumps(x) for x in lines)
    )
    assert done.returncode == 0, done.stderr
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    worker = subprocess.Popen(  # noqa: S603
        [COMMAND, "worker", "-D", EXAMPLES], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: {e.id: e.status for e in executions.list_executions(settings)} == {"order-1": "DONE", "order-2": "RUNNING"},
            timeout=60, interval=0.1, what="the worker delivering order-1 and starting order-2",
        )  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert run(["publish", "order-2", "Pay", "--data", '{"amount": 1}', "--id", "p2"], env, tmp_path).returncode == 0
    return env, settings


def test_the_library_lists_executions_by_status_and_shows_one_with_its_queued_events_and_history(ran):
    _, settings = ran
    done = executions.list_executions(settings, status="done")
    assert [(e.id, e.machine, e.state, e.pending) for e in done] == [("order-1", "order", "Delivered", 0)]
    waiting = executions.show_execution(settings, "order-2")
    assert (waiting.summary.status, waiting.summary.state) == ("RUNNING", "AwaitingPayment")
    assert [(q["kind"], q["event_id"], q["state"]) for q in waiting.queued] == [("Pay", "p2", "queued")]
    delivered = executions.show_execution(settings, "order-1")
    assert delivered.context["paid"] == 4.5 and delivered.processed_events == 4
    assert executions.show_execution(settings, "order-404") is None
    assert executions.status_counts(settings) == {"done": 1, "running": 1}
    with pytest.raises(ConfigurationError, match="--state 'finished'"):
        executions.list_executions(settings, status="finished")


def test_executions_list_and_show_render_them_and_print_json(ran, tmp_path):
    env, _ = ran
    listed = run(["executions", "list"], {**env, "COLUMNS": "200"}, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "order-1" in listed.stdout and "Delivered" in listed.stdout and "AwaitingPayment" in listed.stdout
    only = json.loads(run(["executions", "list", "--state", "running", "--json"], env, tmp_path).stdout)
    assert [e["id"] for e in only] == ["order-2"]
    assert run(["executions", "list", "--state", "failed"], env, tmp_path).stdout.strip() == "executions: none failed"
    shown = run(["executions", "show", "order-2"], {**env, "COLUMNS": "200"}, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "execution order-2 of order: running, in AwaitingPayment" in shown.stdout
    assert "queued events (1)" in shown.stdout and "p2" in shown.stdout
    detail = json.loads(run(["executions", "show", "order-1", "--json"], env, tmp_path).stdout)
    assert (detail["status"], detail["state"], detail["queued"]) == ("DONE", "Delivered", [])
    missing = run(["executions", "show", "order-404"], env, tmp_path)
    assert missing.returncode == 1 and "executions list" in missing.stderr


def test_status_counts_the_executions_by_status(ran, tmp_path):
    env, _ = ran
    shown = run(["status"], env, tmp_path)
    assert "executions: 1 done, 1 running" in shown.stdout
    assert json.loads(run(["status", "--json"], env, tmp_path).stdout)["executions"] == {"done": 1, "running": 1}
