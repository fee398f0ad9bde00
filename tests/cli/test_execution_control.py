"""Suspend, resume, cancel, terminate and retry an execution (harel's control plane over the
store), with a real worker running the demo's order machine: the library, then the command."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import env_for, run
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.errors import ConfigurationError
from harel_edge.execution_control import control_execution
from harel_edge.executions import show_execution
from harel_edge.migration import prepare_database
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions, run_worker

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


def worker_until(settings, done: Callable[[], bool]) -> None:
    """Run a worker in this process until `done()` holds (polled; 60 s guard against a hang)."""

    async def main() -> None:
        stop = asyncio.Event()
        options = WorkerOptions(definitions_dir=EXAMPLES, idle_sleep=0.01, sample_every=3600)
        worker = asyncio.create_task(run_worker(settings, options, stop))
        try:
            for _ in range(600):
                if await asyncio.to_thread(done) or worker.done():
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)
        assert await asyncio.to_thread(done), "the worker got there"

    asyncio.run(main())


def detail(settings, execution_id: str):
    return show_execution(settings, execution_id)


@pytest.fixture
def settings(tmp_path):
    """A local database with order-1 started and waiting for its payment."""
    values = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    prepare_database(values)
    with EdgeStore(values, create_schema=False) as store, LibsqlTransport(settings=values, create_schema=False) as t:
        store.save(Execution(id="order-1", definition_id="order"))
        t.publish("order-1", Event(kind="Start"))
    worker_until(values, lambda: detail(values, "order-1").summary.status == "RUNNING")
    return values


def publish(settings, kind: str, data: dict | None = None) -> None:
    with LibsqlTransport(settings=settings, create_schema=False) as t:
        t.publish("order-1", Event(kind=kind, data=data or {}))


def test_a_suspended_execution_keeps_its_events_until_it_is_resumed(settings):
    outcome = control_execution(settings, "order-1", "suspend")
    assert (outcome.before, outcome.after, outcome.changed) == ("running", "suspended", True)
    publish(settings, "Pay", {"amount": 3.0})
    # The worker gives the event back, parked: it is neither applied nor dead-lettered.
    worker_until(settings, lambda: detail(settings, "order-1").queued[0]["state"] == "parked")
    held = detail(settings, "order-1")
    assert (held.summary.status, held.summary.state, held.context.get("paid", 0.0)) == ("SUSPENDED", "AwaitingPayment", 0.0)
    assert held.queued[0]["deliveries"] == 0, "a give-back while suspended is not a failed delivery"
    assert control_execution(settings, "order-1", "resume").after == "running"
    worker_until(settings, lambda: detail(settings, "order-1").summary.state == "Paid")
    assert detail(settings, "order-1").context["paid"] == 3.0, "the held event applied once resumed"


def test_cancel_runs_the_machines_own_cancel_transition_where_it_models_one(settings):
    outcome = control_execution(settings, "order-1", "cancel", definitions_dir=EXAMPLES)
    assert (outcome.before, outcome.after) == ("running", "cancelling")
    worker_until(settings, lambda: detail(settings, "order-1").summary.state == "Cancelled")


def test_cancel_where_the_machine_has_no_cancel_transition_terminates_it_at_once(settings):
    publish(settings, "Pay", {"amount": 1.0})
    worker_until(settings, lambda: detail(settings, "order-1").summary.state == "Paid")
    outcome = control_execution(settings, "order-1", "cancel", definitions_dir=EXAMPLES)
    assert (outcome.before, outcome.after, outcome.state) == ("running", "cancelled", "Paid")


def test_a_failed_execution_retried_at_a_state_runs_again_from_there(settings):
    publish(settings, "Pay")  # no amount: the transition's `set` fails and the execution with it
    worker_until(settings, lambda: detail(settings, "order-1").summary.status == "FAILED")
    assert "amount" in detail(settings, "order-1").summary.error
    outcome = control_execution(settings, "order-1", "retry", definitions_dir=EXAMPLES, to_state="AwaitingPayment")
    assert (outcome.before, outcome.after, outcome.state) == ("failed", "running", "AwaitingPayment")
    publish(settings, "Pay", {"amount": 2.0})
    worker_until(settings, lambda: detail(settings, "order-1").summary.state == "Paid")


def test_a_command_that_does_not_apply_changes_nothing_and_says_so(settings):
    assert control_execution(settings, "order-1", "resume").changed is False, "it was not suspended"
    assert control_execution(settings, "order-1", "terminate").after == "cancelled"
    again = control_execution(settings, "order-1", "suspend")
    assert (again.before, again.after, again.changed) == ("cancelled", "cancelled", False)


@pytest.mark.parametrize(
    "command, options, words",
    [
        ("retry", {"definitions_dir": EXAMPLES}, "needs --to STATE"),
        ("retry", {"to_state": "Paid"}, "needs the machine's definition"),
        ("cancel", {}, "needs the machine's definition"),
        ("pause", {}, "unknown command 'pause'"),
    ],
)
def test_a_command_missing_what_it_needs_is_refused_before_anything_is_written(settings, command, options, words):
    with pytest.raises(ConfigurationError, match=words):
        control_execution(settings, "order-1", command, **options)
    assert detail(settings, "order-1").summary.status == "RUNNING"


def test_retry_to_a_state_that_is_not_a_leaf_says_harels_reason(settings):
    publish(settings, "Pay")
    worker_until(settings, lambda: detail(settings, "order-1").summary.status == "FAILED")
    with pytest.raises(ConfigurationError, match="leaf state"):
        control_execution(settings, "order-1", "retry", definitions_dir=EXAMPLES, to_state="Nowhere")
    assert detail(settings, "order-1").summary.status == "FAILED"


def test_the_commands_suspend_and_resume_and_say_what_changed(settings, tmp_path):
    env = env_for({"profile": "local", "db_path": settings.db_path})
    suspended = run(["executions", "suspend", "order-1"], env, tmp_path)
    assert suspended.returncode == 0, suspended.stderr
    assert "order-1: running -> suspended (in AwaitingPayment)" in suspended.stdout
    again = run(["executions", "suspend", "order-1", "--json"], env, tmp_path)
    assert json.loads(again.stdout)["changed"] is False
    missing = run(["executions", "resume", "order-9"], env, tmp_path)
    assert missing.returncode == 1 and "no execution 'order-9'" in missing.stderr
