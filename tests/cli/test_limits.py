"""`harel-edge limits set / list / clear`, run as a user runs them, on every profile."""

from __future__ import annotations

import json

import pytest
from cli_helpers import env_for, run
from harel.spec.states import Event

from harel_edge import LibsqlTransport, limits


@pytest.fixture
def queued(place):
    """Settings whose database has four groups of tenant 'acme' waiting, and the environment for them."""
    settings = place.settings()
    transport = LibsqlTransport(settings=settings)
    try:
        transport.publish_many((f"g{i}", Event(kind="e"), 0, None, "acme") for i in range(4))
        lease = transport.claim("w", 600)
        assert lease is not None
    finally:
        transport.close()
    return settings, env_for(settings.model_dump())


def test_limits_set_then_list_shows_each_limit_with_what_is_in_flight_and_waiting(queued, tmp_path):
    settings, env = queued
    done = run(["limits", "set", "acme", "--concurrency", "1", "--rate", "100/1m"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "acme: concurrency 1, rate 100/1m"
    listed = run(["limits", "list", "--json"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    (acme,) = json.loads(listed.stdout)
    assert (acme["key"], acme["concurrency"], acme["rate"], acme["period"]) == ("acme", 1, 100, 60.0)
    assert (acme["in_flight"], acme["waiting"]) == (1, 3), "one leased, three held back by the limit"
    table = run(["limits", "list"], env, tmp_path)
    assert "acme" in table.stdout and "100/1m" in table.stdout


def test_limits_clear_lifts_the_limits_and_says_when_a_key_had_none(queued, tmp_path):
    settings, env = queued
    assert run(["limits", "set", "acme", "--concurrency", "1"], env, tmp_path).returncode == 0
    cleared = run(["limits", "clear", "acme"], env, tmp_path)
    assert (cleared.returncode, cleared.stdout.strip()) == (0, "acme: limits lifted")
    again = run(["limits", "clear", "acme"], env, tmp_path)
    assert again.returncode == 1
    assert "has no limits: `harel-edge limits list`" in again.stderr
    assert limits.read_limits(settings) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["limits", "set", "acme"], "give a limit to set: --concurrency N, --rate N/PERIOD"),
        (["limits", "set", "acme", "--rate", "100"], "write N/PERIOD"),
        (["limits", "set", "acme", "--rate", "100/0s"], "the period must be more than 0 seconds"),
    ],
    ids=["no limit given", "a rate without its period", "a period of zero"],
)
def test_limits_set_refuses_what_is_not_a_limit_and_says_what_to_write(args, says, tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    refused = run(args, env, tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert says in refused.stderr


def test_a_rate_is_read_as_n_per_period_in_seconds_minutes_hours_or_days():
    assert [limits.parse_rate(text) for text in ("100/60s", "100/1m", "50/s", "10/2.5", "1000/h", "5/2d")] == [
        (100, 60.0), (100, 60.0), (50, 1.0), (10, 2.5), (1000, 3600.0), (5, 172800.0)
    ]


def test_status_shows_what_holds_work_back_a_waiting_head_and_a_key_at_its_limit(queued, tmp_path):
    settings, env = queued
    with LibsqlTransport(settings=settings) as transport:
        transport.publish("reminder", Event(kind="Remind"), delay=3600)
    limits.set_key_limit(settings, "acme", concurrency=1)
    shown = run(["status", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    flow = json.loads(shown.stdout)["flow"]
    assert flow["groups_waiting_for_their_head"] == 1 and 3000 < flow["next_due_in_seconds"] <= 3600
    assert flow["groups_held_by_limits"] == 3, "one acme group leased, three held back by its limit"
    (acme,) = flow["limits"]
    assert (acme["key"], acme["in_flight"], acme["concurrency"], acme["waiting"]) == ("acme", 1, 1, 3)
    text = run(["status"], env, tmp_path).stdout
    assert "held back: 1 group behind a delayed, debounced or parked head" in text
    assert "limit acme: 1 of 1 in flight, 3 groups waiting for room" in text
