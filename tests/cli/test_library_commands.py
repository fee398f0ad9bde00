"""The commands' library functions, called directly on the local profile: plain dataclasses back."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest
from test_dead_letter import poisoned

from harel_edge import access, dead_letter, migrations
from harel_edge.doctor import Diagnosis, diagnose
from harel_edge.errors import ConfigurationError, SchemaError
from harel_edge.executor import ExecutorClosedError
from harel_edge.migration import Migration, migrate
from harel_edge.migrations import SCHEMA_VERSION
from harel_edge.publishing import Published, publish, publish_request
from harel_edge.settings import ExplicitSettings
from harel_edge.status import StatusReport, collect_status
from harel_edge.store import EdgeStore

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


@pytest.fixture
def settings(tmp_path):  # noqa: ANN001, ANN201
    return ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))


def test_migrate_returns_the_version_it_found_and_then_finds_it_up_to_date(settings):
    first = migrate(settings)
    assert first == Migration(0, SCHEMA_VERSION, f"profile local at {settings.db_path}", applied=tuple(v.number for v in migrations.VERSIONS))
    assert not first.up_to_date
    assert migrate(settings).up_to_date


def test_publish_returns_the_stored_event_and_creates_the_execution_it_starts(settings):
    migrate(settings)  # publish creates no database: a typo in the path must not make one
    request = publish_request(
        "order-1", "Start", '{"amount": 3}', priority=2, routing_key="eu", create="order", definitions=EXAMPLES
    )
    published = publish(settings, request)
    assert isinstance(published, Published)
    assert (published.group, published.kind, published.priority, published.routing_key) == (
        "order-1",
        "Start",
        2,
        "eu",
    )
    assert published.event["data"] == {"amount": 3}
    assert published.as_dict()["event"]["id"] == published.event_id
    store = EdgeStore(settings, create_schema=False)
    try:
        assert store.load("order-1").definition_id == "order"
    finally:
        store.close()


def test_a_publish_request_is_refused_before_any_setting_is_read():
    with pytest.raises(ConfigurationError, match="--data must be a JSON object"):
        publish_request("order-1", "Pay", "[1]")
    with pytest.raises(ConfigurationError, match="KIND must be Start"):
        publish_request("order-1", "Pay", create="order")


def test_collect_status_returns_a_report_whose_dict_is_the_json_output(settings):
    with pytest.raises(SchemaError, match="no database at"):
        collect_status(settings)
    migrate(settings)
    publish(settings, publish_request("g1", "Pay", priority=1))
    publish(settings, publish_request("g1", "Pay", priority=1))
    report = collect_status(settings, top=5)
    assert isinstance(report, StatusReport)
    assert (report.profile, report.schema_version, report.replica) == ("local", SCHEMA_VERSION, None)
    assert report.queue["totals"]["messages"] == 2
    assert report.dead_letters == {"messages": 0, "workflows": 0, "oldest_at": None}
    assert report.workflows == {"namespaces": [], "claimed": 0, "finished": 0, "failing": 0}
    assert report.flow == {
        "groups_waiting_for_their_head": 0,
        "next_due_in_seconds": None,
        "limits": [],
        "groups_held_by_limits": 0,
    }
    assert list(report.as_dict()) == [
        "profile",
        "where",
        "schema_version",
        "queue",
        "flow",
        "workers",
        "workflows",
        "dead_letters",
        "executions",
    ]
    assert report.workers == [], "no worker has sent a heartbeat"
    assert report.executions == {}  # the table is there, with no execution yet


def test_diagnose_returns_the_checks_and_whether_one_failed(settings):
    missing = diagnose(settings)
    assert isinstance(missing, Diagnosis)
    assert [(c.name, c.level) for c in missing.checks] == [
        ("configuration", "ok"),
        ("database file", "warn"),
        ("write access", "ok"),
    ]
    assert not missing.failed
    migrate(settings)
    healthy = diagnose(settings)
    assert healthy.as_dict()["ok"] is True
    assert healthy.checks[-1].name == "schema version"


def test_dead_letter_functions_return_dead_letters_and_what_a_purge_deleted(tmp_path):
    path = tmp_path / "dead.db"
    poisoned(path)
    settings = ExplicitSettings.load(profile="local", db_path=str(path))
    letters = dead_letter.read_dead_letters(settings)
    assert [(letter.kind, letter.target) for letter in letters] == [
        ("message", "order-7"),
        ("workflow", "refunds/wf-1"),
    ]
    assert dead_letter.read_dead_letters(settings, kind="workflow") == letters[1:]
    assert dead_letter.read_dead_letter(settings, letters[0].id) == letters[0]
    assert dead_letter.read_dead_letter(settings, 999) is None
    assert dead_letter.requeue_dead_letter(settings, letters[0].id) == letters[0]
    assert dead_letter.requeue_dead_letter(settings, letters[0].id) is None
    assert dead_letter.purge_dead_letter(settings, 999) == dead_letter.Purged(0)
    assert dead_letter.purge_dead_letters(settings) == dead_letter.Purged(1)


def test_the_access_policy_checks_without_creating_and_reads_only_a_usable_database(settings):
    access.check_writable(settings)  # a new file in a writable directory: nothing to refuse
    assert not Path(settings.db_path).exists()
    with pytest.raises(SchemaError, match="no database at"):
        access.open_for_reading(settings)
    migrate(settings)
    assert access.with_reader(settings, lambda execute: execute("SELECT 1")) == [(1,)]


def test_an_edge_store_closes_as_a_context_manager_and_then_says_so_on_every_call(settings):
    with EdgeStore(settings) as store:
        assert store.load("nobody") is None
    with pytest.raises(ExecutorClosedError, match="closed"):
        store.load("nobody")
    store.close()  # a second close is harmless


def test_an_edge_store_dropped_without_close_stops_its_thread(settings):
    def store_threads() -> int:
        return sum(t.name == "harel-edge-store" for t in threading.enumerate())

    before = store_threads()
    store = EdgeStore(settings)
    assert store_threads() == before + 1
    del store
    gc.collect()
    assert store_threads() == before


def test_an_edge_store_used_in_a_forked_child_refuses_clearly_instead_of_hanging(settings):
    store = EdgeStore(settings)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the store's loop thread did not survive the fork
            try:
                store.load("x")
            except RuntimeError as exc:
                os._exit(0 if "another process" in str(exc) else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        store.close()
