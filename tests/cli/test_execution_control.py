"""Suspend, resume, cancel, terminate and retry an execution (harel's control plane over the
store), with a real worker running the demo's order machine: the library, then the command."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import env_for, run
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.errors import ConfigurationError
from harel_edge.execution_control import control_execution
from harel_edge.executions import list_executions, show_execution
from harel_edge.migration import migrate
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions, run_worker

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


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
    migrate(values)
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


def test_retry_to_a_state_that_is_not_there_is_refused_naming_the_leaf_states(settings):
    publish(settings, "Pay")
    worker_until(settings, lambda: detail(settings, "order-1").summary.status == "FAILED")
    with pytest.raises(ConfigurationError, match="has no state 'Nowhere'; give --to one of its leaf states"):
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


# ---- two callers at once, on the local file and on sqld ---------------------------------------------


@pytest.fixture(params=["local", pytest.param("sqld", marks=pytest.mark.sqld)])
def running(request, tmp_path) -> dict[str, str]:
    """The settings (as a user's variables) of a database holding order-1, running in AwaitingPayment."""
    if request.param == "local":
        values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    else:
        server = request.getfixturevalue("fresh_sqld_primary")
        values = {"profile": "sqld", "url": server.http_url, "auth_token": server.rw_token}
    settings = ExplicitSettings.load(**values)
    migrate(settings)
    with EdgeStore(settings, create_schema=False) as store:
        store.save(Execution(id="order-1", definition_id="order", status=Status.RUNNING, active_path="AwaitingPayment"))
    return values


def at_once(monkeypatch, calls: list[Callable[[], object]], status: Status) -> list:
    """Each of `calls` in a thread of its own, in step: each read of the execution that finds it in
    `status` waits until every call has made the same read, so all decide on what they saw before
    any wrote, and all write on the same version (the barrier's timeout only guards against a hang)."""
    barrier, load = threading.Barrier(len(calls)), EdgeStore.load

    def load_together(self, execution_id):  # noqa: ANN001, ANN202
        found = load(self, execution_id)
        if found is not None and found.status is status:
            barrier.wait(timeout=60)
        return found

    results: list = [None] * len(calls)

    def call(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            results[i] = exc
            barrier.abort()

    with monkeypatch.context() as patched:
        patched.setattr(EdgeStore, "load", load_together)
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_two_suspends_then_two_resumes_at_once_each_change_it_once(running, monkeypatch):
    settings = ExplicitSettings.load(**running)
    for command, before, after in (("suspend", "running", "suspended"), ("resume", "suspended", "running")):
        calls = [lambda command=command: control_execution(settings, "order-1", command)] * 2
        outcomes = at_once(monkeypatch, calls, Status(before.upper()))
        assert sorted(o.changed for o in outcomes) == [False, True], outcomes
        assert {(o.before, o.after) for o in outcomes} == {(before, after), (after, after)}, outcomes
    with EdgeStore(settings, create_schema=False) as store:
        assert store.load("order-1").version == 3, "saved, suspended once, resumed once: no second write"


def test_two_suspend_commands_at_once_one_says_it_changed_it_the_other_that_it_changed_nothing(
    running, monkeypatch, capsys, tmp_path
):
    from typer.main import get_command

    from harel_edge.cli import app

    monkeypatch.chdir(tmp_path)
    for key, value in running.items():
        monkeypatch.setenv(f"HAREL_EDGE_{key.upper()}", value)
    command = get_command(app)
    for verb, before in (("suspend", Status.RUNNING), ("resume", Status.SUSPENDED)):
        capsys.readouterr()
        args = ["executions", verb, "order-1", "--json"]
        codes = at_once(monkeypatch, [lambda args=args: command.main(args, "harel-edge", standalone_mode=False)] * 2, before)
        assert codes == [None, None], codes  # both ended well
        printed, outcomes = capsys.readouterr().out.strip(), []
        while printed:  # the two JSON objects, one after the other
            outcome, end = json.JSONDecoder().raw_decode(printed)
            outcomes.append(outcome)
            printed = printed[end:].strip()
        assert sorted(o["changed"] for o in outcomes) == [False, True], outcomes


def test_retry_to_a_state_the_machine_does_not_have_says_so_and_lists_its_leaf_states(running, tmp_path):
    settings = ExplicitSettings.load(**running)
    with EdgeStore(settings, create_schema=False) as store:
        store.save(Execution(id="order-2", definition_id="order", status=Status.FAILED, active_path="Paid", error="boom"))
    said = (
        "retry refused: machine 'order' has no state 'NoSuchState'; give --to one of its leaf states: "
        "AwaitingPayment, Cancelled, Delivered, Paid, Shipped"
    )
    with pytest.raises(ConfigurationError) as refused:
        control_execution(settings, "order-2", "retry", definitions_dir=EXAMPLES, to_state="NoSuchState")
    assert str(refused.value) == said
    result = run(["executions", "retry", "order-2", "--to", "NoSuchState", "-D", EXAMPLES], env_for(running), tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    after = detail(settings, "order-2")
    assert (after.summary.status, after.summary.state, after.summary.error) == ("FAILED", "Paid", "boom")


def test_a_cancel_the_machine_models_ends_done_with_its_outcome_as_the_docs_say_and_outcome_lists_it(running, tmp_path):
    settings, env = ExplicitSettings.load(**running), env_for(running)
    cancelled = run(["executions", "cancel", "order-1", "-D", EXAMPLES], env, tmp_path)
    assert "order-1: running -> cancelling (in AwaitingPayment): its Cancel transition ends it" in cancelled.stdout
    worker_until(settings, lambda: detail(settings, "order-1").summary.status == "DONE")
    ended = [(e.id, e.status, e.outcome, e.state) for e in list_executions(settings, outcome="cancelled")]
    assert ended == [("order-1", "DONE", "cancelled", "Cancelled")]
    assert list_executions(settings, status="done", outcome="success") == []
    listed = run(["executions", "list", "--outcome", "cancelled"], {**env, "COLUMNS": "200"}, tmp_path)
    assert listed.returncode == 0 and "order-1" in listed.stdout and " cancelled " in listed.stdout, listed.stdout
    assert "executions: none" in run(["executions", "list", "--outcome", "success"], env, tmp_path).stdout
    show = run(["executions", "show", "order-1"], env, tmp_path)
    assert "execution order-1 of order: done (outcome cancelled), in Cancelled" in show.stdout, show.stdout
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| `executions cancel "))
    assert row.split(" | ")[2].startswith("cancelling, then done, with the outcome"), row
