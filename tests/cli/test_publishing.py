"""`publish`: an execution it creates is the one harel's own create makes (its machine's context
defaults included), and a publish its group already had says it was a duplicate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import env_for, run

from harel_edge.errors import ConfigurationError
from harel_edge.migration import migrate
from harel_edge.publishing import publish, publish_request, read_lines
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore

COUNTER = """
event Go {}

machine counter {
  context {
    n: int = 2
    label: string = "new"
    total: float
  }
  initial Waiting
  state Waiting {}
  state Went {}
  final Done success
  from Waiting to Went on Go where context.n == 2
  from Went to Done on Go
}
"""


@pytest.fixture
def definitions(tmp_path) -> str:
    directory = tmp_path / "definitions"
    directory.mkdir()
    (directory / "counter.stm").write_text(COUNTER)
    return str(directory)


@pytest.fixture
def settings(tmp_path):
    made = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    migrate(made)  # publish creates no database: `migrate` (or a worker) does
    return made


def harels_own_create(definitions: str, path: Path):
    """The execution harel 0.9's own `create(start_on_create=False)` makes, on its own store."""
    from harel.engine.distributed import DistributedRunner
    from harel.engine.store import SqliteStore
    from harel.engine.transport import SqliteTransport
    from harel.worker import load_definitions

    runner = DistributedRunner(SqliteStore(str(path)), SqliteTransport(str(path)), load_definitions(definitions), execution="inline")
    return runner.create("counter", execution_id="c-1", start_on_create=False)


def test_an_execution_created_by_publish_has_its_machines_context_defaults_as_harels_own_create_gives_them(settings, definitions, tmp_path):
    publish(settings, publish_request("c-1", "Start", '{"total": 4.5}', create="counter", definitions=definitions))
    with EdgeStore(settings) as store:
        ours = store.load("c-1")
    theirs = harels_own_create(definitions, tmp_path / "harel.db")
    assert ours.context == theirs.context == {"n": 2, "label": "new"}
    assert (ours.definition_id, ours.status) == (theirs.definition_id, theirs.status)
    assert ours.created_at is not None, "stamped, as harel stamps what it creates"


def test_a_start_that_leaves_a_required_context_field_unset_is_refused_before_anything_is_written(tmp_path, definitions):
    with pytest.raises(ConfigurationError, match="total") as refused:
        publish_request("c-1", "Start", "{}", create="counter", definitions=definitions)
    assert "--data" in str(refused.value)
    assert not (tmp_path / "q.db").exists()


def test_a_machine_that_is_not_in_the_definitions_is_refused_naming_the_ones_there(definitions):
    with pytest.raises(ConfigurationError, match="counter"):
        publish_request("c-1", "Start", "{}", create="Counter", definitions=definitions)


def test_create_without_the_definitions_is_refused_saying_where_the_machine_comes_from(tmp_path):
    printed = run(["publish", "c-1", "Start", "--create", "counter"], env_for({"db_path": tmp_path / "q.db"}), tmp_path)
    assert printed.returncode == 2, printed.stderr
    assert "--definitions" in printed.stderr
    assert not (tmp_path / "q.db").exists()


def test_a_publish_its_group_already_had_within_the_window_says_it_was_a_duplicate(tmp_path, definitions):
    env = env_for({"db_path": tmp_path / "q.db"})
    assert run(["migrate"], env, tmp_path).returncode == 0
    args = ["publish", "c-1", "Start", "--id", "start-c-1", "--data", '{"total": 1.0}', "--create", "counter", "-D", definitions]
    first = run(args, env, tmp_path)
    again = run(args, env, tmp_path)
    as_json = json.loads(run([*args, "--json"], env, tmp_path).stdout)
    assert first.returncode == again.returncode == 0, again.stderr
    assert first.stdout.startswith("published Start start-c-1 to c-1")
    assert again.stdout.startswith("duplicate: Start start-c-1 was already published to c-1"), again.stdout
    assert "HAREL_EDGE_PUBLISH_WINDOW" in again.stdout and "nothing was queued" in again.stdout
    assert as_json["duplicate"] is True
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    with EdgeStore(settings) as store:
        assert store.execute(f"SELECT count(*) FROM {settings.prefix}_transport_messages")[0][0] == 1


def _claimable(settings) -> list[str]:
    """The groups whose head a worker could claim now."""
    from harel_edge import LibsqlTransport  # noqa: PLC0415

    with LibsqlTransport(settings=settings) as transport:
        leases = transport.claim_many("probe", 30, 100)
        for lease in leases:
            transport.nack(lease)
        return sorted(lease.group_id for lease in leases)


def test_publish_delay_and_at_from_the_command_line_hold_an_event_back_until_then(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    settings = ExplicitSettings.load(**values)
    migrate(settings)
    env = env_for(values)
    later = run(["publish", "later", "Remind", "--delay", "3600"], env, tmp_path)
    assert later.returncode == 0 and "delay 3600.0" in later.stdout, later.stdout + later.stderr
    past = run(["publish", "past", "Remind", "--at", "2001-01-01T00:00:00Z", "--limit-key", "tenant-a"], env, tmp_path)
    assert past.returncode == 0 and "limit key tenant-a" in past.stdout, past.stdout + past.stderr
    assert _claimable(settings) == ["past"], "the delayed event waits; one due in the past does not"


def test_publish_refuses_flow_control_the_queue_would_refuse_and_sends_nothing(tmp_path):
    values = {"profile": "local", "db_path": str(tmp_path / "q.db")}
    migrate(ExplicitSettings.load(**values))
    result = run(["publish", "g", "Go", "--delay", "5", "--at", "0"], env_for(values), tmp_path)
    assert result.returncode == 2 and "not both" in result.stderr.strip().splitlines()[-1], result.stderr
    result = run(["publish", "g", "Go", "--at", "next tuesday"], env_for(values), tmp_path)
    assert result.returncode == 2 and "ISO 8601" in result.stderr, result.stderr
    assert _claimable(ExplicitSettings.load(**values)) == [], "nothing was published"


def test_ndjson_lines_carry_flow_control_and_a_bad_one_is_refused_with_its_number():
    lines = [
        json.dumps({"group": "a", "kind": "Go", "delay": 60, "limit_key": "tenant"}),
        json.dumps({"group": "b", "kind": "Go", "debounce": 2, "debounce_key": "burst", "max_wait": 10}),
    ]
    first, second = read_lines(lines, "events.ndjson")
    assert first.hold == {"delay": 60, "limit_key": "tenant"}
    assert second.hold == {"debounce": 2, "debounce_key": "burst", "max_wait": 10}
    with pytest.raises(ConfigurationError, match="events.ndjson, line 2: delay must be >= 0"):
        read_lines([lines[0], json.dumps({"group": "c", "kind": "Go", "delay": -1})], "events.ndjson")
