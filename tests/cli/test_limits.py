"""`harel-edge limits set / list / clear`, run as a user runs them, on every profile."""

from __future__ import annotations

import json

import pytest
from cli_helpers import env_for, run
from harel.spec.states import Event

from harel_edge import LibsqlTransport, limits
from harel_edge.errors import ConfigurationError


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
        (["limits", "set", "acme", "--rate", "100/0s"], "the period must be from 1 ms to 365 days"),
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


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--concurrency", "99999999999999999999"], "concurrency (--concurrency) must be a whole number from 0 to 1,000,000"),
        (["--concurrency", "999999999999999999999"], "concurrency (--concurrency) must be a whole number from 0 to 1,000,000"),
        (["--concurrency", "1000001"], "concurrency (--concurrency) must be a whole number from 0 to 1,000,000"),
        (["--rate", "99999999999999999999/s"], "--rate 99999999999999999999/s: the claims a period must be a whole number from 0 to 1,000,000"),
        (["--rate", "5/.s"], "rate '5/.s': write N/PERIOD"),
        (["--rate", "5/0.0001s"], "--rate 5/0.0001s: the period must be from 1 ms to 365 days"),
        (["--rate", "5/400d"], "--rate 5/400d: the period must be from 1 ms to 365 days"),
    ],
    ids=["a count of 20 digits", "a count of 21 digits", "a count over the bound", "a rate over the bound",
         "a period without a number", "a period under a millisecond", "a period over a year"],
)
def test_limits_set_refuses_a_limit_out_of_range_naming_the_option_and_every_limit_stays_as_it_was(
    queued, tmp_path, args, says
):
    settings, env = queued
    assert run(["limits", "set", "acme", "--concurrency", "2", "--rate", "10/1m"], env, tmp_path).returncode == 0
    before = limits.read_limits(settings)
    refused = run(["limits", "set", "acme", *args], env, tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert says in refused.stderr and "Traceback" not in refused.stderr
    assert limits.read_limits(settings) == before, "the refused command changed no limit"


@pytest.mark.parametrize(
    "limit",
    [{"concurrency": 10**30}, {"concurrency": 1_000_001}, {"rate": 10**30, "period": 1.0}, {"rate": 5, "period": 1e-4},
     {"rate": 5, "period": 366 * 86400.0}, {"rate": 5, "period": float("inf")}],
    ids=["concurrency 10**30", "concurrency over the bound", "rate 10**30", "a period under 1 ms", "a period over a year",
         "an infinite period"],
)
def test_the_librarys_set_key_limit_refuses_a_limit_out_of_range_and_changes_nothing(queued, limit):
    settings, _env = queued
    limits.set_key_limit(settings, "acme", concurrency=2)
    before = limits.read_limits(settings)
    with pytest.raises(ConfigurationError, match="from"):
        limits.set_key_limit(settings, "acme", **limit)
    assert limits.read_limits(settings) == before


def test_limits_list_shows_keys_holding_markup_as_they_were_typed(queued, tmp_path):
    settings, env = queued
    for key in ("[/bold]", "[bold]x[/bold]"):
        limits.set_key_limit(settings, key, concurrency=1)
    listed = run(["limits", "list"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "[/bold]" in listed.stdout and "[bold]x[/bold]" in listed.stdout
