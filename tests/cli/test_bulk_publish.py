"""`publish --from FILE`: NDJSON events checked in full, then sent 2,000 to a unit of work, in
order, idempotent by event id; a bad line is refused with its number before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import env_for, run

from harel_edge.errors import ConfigurationError
from harel_edge.publishing import publish_bulk, read_lines
from harel_edge.queue import LibsqlTransport

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


def _lines(count: int, groups: int = 7) -> list[str]:
    return [
        json.dumps({"group": f"g-{i % groups}", "kind": "Work", "data": {"i": i}, "priority": i % 5, "id": f"e-{i}"})
        for i in range(count)
    ]


def _queued(settings) -> list[tuple]:
    with LibsqlTransport(settings=settings) as transport:
        return transport.execute(
            f"SELECT group_id, json_extract(event, '$.data.i') FROM {settings.prefix}_transport_messages ORDER BY seq"
        )


def test_publish_from_a_file_queues_every_line_in_order_and_running_it_again_says_nothing_was_queued(place, tmp_path):
    source = tmp_path / "events.ndjson"
    source.write_text("\n".join(_lines(4500)) + "\n\n")
    env = env_for(place.values())
    assert run(["migrate"], env, tmp_path).returncode == 0
    first = run(["publish", "--from", str(source)], env, tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "queued 4500 of 4500 events in 3 batches" in first.stdout and "already there" not in first.stdout
    again = run(["publish", "--from", str(source), "--json"], env, tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"events": 4500, "queued": 0, "already_queued": 4500, "batches": 3, "created": 0}
    source.write_text("\n".join(_lines(4501)) + "\n")  # one line more: only it is new
    third = run(["publish", "--from", str(source)], env, tmp_path, timeout=120)
    assert "queued 1 of 4501 events in 3 batches; 4500 events already there, not queued again" in third.stdout, third.stdout
    queued = _queued(place.settings(**({"db_path": env["HAREL_EDGE_DB_PATH"]} if "HAREL_EDGE_DB_PATH" in env else {})))
    assert len(queued) == 4501  # the later runs' known ids: nothing queued twice
    for g in range(7):
        assert [i for group, i in queued if group == f"g-{g}"] == list(range(g, 4501, 7))  # FIFO per group


def test_publish_from_stdin_reads_the_events_from_the_pipe(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    done = run(["publish", "--from", "-"], env, tmp_path, input="\n".join(_lines(3)))
    assert done.returncode == 0, done.stderr
    assert "queued 3 of 3 events in 1 batch" in done.stdout


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "a line must be a JSON object"),
        ('{"group": "g", "kind": "Work", "priority": 9}', '"priority" must be an integer from 0 to 4'),
        ('{"group": "", "kind": "Work"}', '"group" must be a non-empty string'),
        ('{"group": "g", "kind": "Work", "data": [1]}', '"data" must be a JSON object'),
        ('{"group": "g", "kind": "Work", "colour": "red"}', "unknown field 'colour'"),
        ('{"group": "g", "kind": "Pay", "create": "order"}', '"create" starts an execution: kind must be Start'),
        ('{"group": "g", "kind": "Work", "data": {"x": NaN}}', "NaN is not a number JSON can hold"),
        ('{"group": "g", "kind": "Work", "data": {"x": [1e400]}}', "data.x[0] holds inf, which JSON cannot hold"),
        ('{"group": "g", "kind": "Work", "data": {"x": ' + "[" * 300 + "]" * 300 + "}}", "its data cannot be stored as JSON"),
        ('{"group": "g", "kind": "Work", "data": {"x": ' + "[" * 3000 + "]" * 3000 + "}}", "nested too deep to read"),
    ],
    ids=["not json", "a list", "priority", "empty group", "data a list", "unknown field", "create without Start",
         "NaN", "1e400", "nested 300 deep", "nested 3000 deep"],
)
def test_a_bad_line_is_refused_with_its_number_before_anything_is_sent(tmp_path, bad, says):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    source = tmp_path / "events.ndjson"
    source.write_text("\n".join([*_lines(2), "", bad, *_lines(2)]) + "\n")
    done = run(["publish", "--from", str(source)], env, tmp_path)
    assert done.returncode == 2
    assert f"events.ndjson, line 4: {says}" in done.stderr
    assert "nothing was sent" in done.stderr
    status = run(["status", "--json"], env, tmp_path)
    assert json.loads(status.stdout)["queue"]["totals"]["messages"] == 0


def test_publish_from_a_missing_file_says_so_and_how_to_read_stdin(tmp_path):
    done = run(["publish", "--from", "nope.ndjson"], env_for({"db_path": str(tmp_path / "q.db")}), tmp_path)
    assert done.returncode == 2
    assert "no such file" in done.stderr and "- to read stdin" in done.stderr


def test_lines_that_create_start_executions_of_the_named_machine(tmp_path):
    from harel_edge.migration import migrate
    from harel_edge.settings import ExplicitSettings
    from harel_edge.store import EdgeStore

    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    migrate(settings)
    lines = [
        json.dumps({"group": f"order-{n}", "kind": "Start", "create": "order", "id": f"start-{n}"}) for n in range(3)
    ] + [json.dumps({"group": "order-1", "kind": "Pay", "data": {"amount": 3.5}})]
    requests = read_lines(lines, "orders.ndjson", definitions=EXAMPLES)
    done = publish_bulk(settings, requests)
    assert (done.events, done.queued, done.batches, done.created) == (4, 4, 1, 3)
    with EdgeStore(settings) as store:
        assert [store.load(f"order-{n}").definition_id for n in range(3)] == ["order"] * 3
    again = publish_bulk(settings, requests)
    assert (again.created, again.queued, again.already_queued) == (0, 1, 3), "the Pay without an id is new again"
    with pytest.raises(ConfigurationError, match=r"orders.ndjson, line 1: .*--definitions DIR"):
        read_lines(lines, "orders.ndjson")


def test_a_line_that_is_not_utf8_is_refused_with_its_number_before_anything_is_sent(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    source = tmp_path / "events.ndjson"
    source.write_bytes("\n".join(_lines(3)).encode() + b'\n{"group": "g", "kind": "\xff"}\n')
    done = run(["publish", "--from", str(source)], env, tmp_path)
    assert done.returncode == 2
    assert "events.ndjson, line 4: not UTF-8 text; nothing was sent" in done.stderr


def test_a_bad_line_after_the_first_batches_queues_nothing_on_every_profile(place, tmp_path):
    """Batches go out 2,000 lines at a time: a line past the second that cannot be stored (nested
    300 deep) is found before the first is sent."""
    source = tmp_path / "events.ndjson"
    deep = json.dumps({"group": "g", "kind": "Work"})[:-1] + ', "data": {"x": ' + "[" * 300 + "]" * 300 + "}}"
    source.write_text("\n".join([*_lines(4100), deep]) + "\n")
    env = env_for(place.values())
    assert run(["migrate"], env, tmp_path).returncode == 0
    done = run(["publish", "--from", str(source)], env, tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "events.ndjson, line 4101:" in done.stderr and "nothing was sent" in done.stderr
    assert _queued(place.settings()) == []
