"""Settings are read when asked, accept harel's variables, and refuse every unworkable combination
with a message that names the variable and says what to set."""

from __future__ import annotations

import pytest

from harel_edge import ConfigurationError, EdgeSettings, LibsqlTransport
from harel_edge.settings import ExplicitSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    import os

    for name in list(os.environ):
        if name.startswith(("HAREL_EDGE_", "HAREL_LIBSQL_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray .env


def load(monkeypatch, **env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return EdgeSettings.load()


def test_with_nothing_set_the_profile_is_a_local_file(monkeypatch):
    s = load(monkeypatch)
    assert (s.profile, s.db_path, s.durability, s.prefix) == ("local", "harel_edge.db", "full", "harel")


def test_a_message_is_dead_lettered_after_ten_failed_deliveries_unless_told_otherwise(monkeypatch):
    assert load(monkeypatch).max_deliveries == 10
    assert load(monkeypatch, HAREL_EDGE_MAX_DELIVERIES="0").max_deliveries == 0, "0: never"


def test_a_group_remembers_the_event_ids_it_was_sent_for_an_hour_unless_told_otherwise(monkeypatch):
    assert load(monkeypatch).publish_window == 3600
    assert load(monkeypatch, HAREL_EDGE_PUBLISH_WINDOW="600").publish_window == 600


def test_settings_are_read_when_loaded_not_at_import(monkeypatch):
    monkeypatch.setenv("HAREL_EDGE_PREFIX", "first")
    assert EdgeSettings.load().prefix == "first"
    monkeypatch.setenv("HAREL_EDGE_PREFIX", "second")
    assert EdgeSettings.load().prefix == "second"


def test_harels_own_variables_select_an_embedded_replica(monkeypatch):
    s = load(
        monkeypatch,
        HAREL_LIBSQL_DB="/var/lib/edge/replica.db",
        HAREL_LIBSQL_SYNC_URL="http://127.0.0.1:8080",
        HAREL_LIBSQL_AUTH_TOKEN="not-for-your-eyes",
    )
    assert (s.profile, s.db_path, s.sync_url) == ("replica", "/var/lib/edge/replica.db", "http://127.0.0.1:8080")
    assert s.auth_token.get_secret_value() == "not-for-your-eyes"


def test_a_harel_url_in_the_database_variable_selects_the_sqld_profile(monkeypatch):
    s = load(monkeypatch, HAREL_LIBSQL_DB="libsql://db-org.turso.io")
    assert (s.profile, s.url) == ("sqld", "libsql://db-org.turso.io")


def test_a_dotenv_file_is_read(monkeypatch, tmp_path):
    (tmp_path / ".env").write_text("HAREL_EDGE_VISIBILITY=12.5\nHAREL_EDGE_ROUTING_KEYS=eu,us\n")
    s = load(monkeypatch)
    assert (s.visibility, s.routing_keys) == (12.5, ("eu", "us"))


def test_the_token_never_appears_in_repr_str_or_config_show(monkeypatch):
    s = load(monkeypatch, HAREL_EDGE_PROFILE="sqld", HAREL_EDGE_URL="http://127.0.0.1:1", HAREL_EDGE_AUTH_TOKEN="s3cr3t-t0ken")
    assert "s3cr3t-t0ken" not in repr(s)
    assert "s3cr3t-t0ken" not in str(s)
    assert "s3cr3t-t0ken" not in str(s.redacted())
    assert s.redacted()["auth_token"] == "**********"


@pytest.mark.parametrize(
    "env, variable, advice",
    [
        ({"HAREL_EDGE_PROFILE": "cloud"}, "HAREL_EDGE_PROFILE", "one of local, sqld, replica"),
        ({"HAREL_EDGE_PROFILE": "replica"}, "HAREL_EDGE_SYNC_URL", "set HAREL_EDGE_SYNC_URL"),
        ({"HAREL_EDGE_PROFILE": "sqld"}, "HAREL_EDGE_URL", "set HAREL_EDGE_URL"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "/srv/queue.db"}, "HAREL_EDGE_URL", "http://host:port"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "http//127.0.0.1:8080"}, "HAREL_EDGE_URL", "not a server URL"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "http://127.0.0.1:99999"}, "HAREL_EDGE_URL", "malformed port"),
        ({"HAREL_EDGE_PROFILE": "replica", "HAREL_EDGE_SYNC_URL": "ftp://x"}, "HAREL_EDGE_SYNC_URL", "not a server URL"),
        ({"HAREL_EDGE_PROFILE": "replica", "HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080", "HAREL_EDGE_DB_PATH": ":memory:"}, "HAREL_EDGE_DB_PATH", "must be a local file"),
        ({"HAREL_EDGE_PROFILE": "local", "HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080"}, "HAREL_EDGE_SYNC_URL", "HAREL_EDGE_PROFILE=replica"),
        ({"HAREL_EDGE_PROFILE": "local", "HAREL_EDGE_URL": "http://127.0.0.1:8080"}, "HAREL_EDGE_URL", "HAREL_EDGE_PROFILE=sqld"),
        ({"HAREL_EDGE_PROFILE": "local", "HAREL_EDGE_DB_PATH": "http://127.0.0.1:8080"}, "HAREL_EDGE_DB_PATH", "needs a file path"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "http://127.0.0.1:8080", "HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080"}, "HAREL_EDGE_SYNC_URL", "HAREL_EDGE_PROFILE=replica"),
        ({"HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080", "HAREL_EDGE_SYNC_INTERVAL": "-1"}, "HAREL_EDGE_SYNC_INTERVAL", "between 0.05 and 3600"),
        ({"HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080", "HAREL_EDGE_SYNC_INTERVAL": "0"}, "HAREL_EDGE_SYNC_INTERVAL", "between 0.05 and 3600"),
        ({"HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080", "HAREL_EDGE_SYNC_INTERVAL": "nan"}, "HAREL_EDGE_SYNC_INTERVAL", "cannot work"),
        ({"HAREL_EDGE_SYNC_URL": "http://127.0.0.1:8080", "HAREL_EDGE_SYNC_INTERVAL": "often"}, "HAREL_EDGE_SYNC_INTERVAL", "valid number"),
        ({"HAREL_EDGE_PREFIX": "1-bad"}, "HAREL_EDGE_PREFIX", "must be an identifier"),
        ({"HAREL_EDGE_PREFIX": "x" * 31}, "HAREL_EDGE_PREFIX", "at most 30 characters"),
        ({"HAREL_EDGE_PREFIX": "sqlite"}, "HAREL_EDGE_PREFIX='sqlite'", "reserves for itself"),
        ({"HAREL_EDGE_PREFIX": "sqlite_x"}, "HAREL_EDGE_PREFIX='sqlite_x'", "reserves for itself"),
        ({"HAREL_EDGE_PREFIX": "SQLITE_x"}, "HAREL_EDGE_PREFIX='SQLITE_x'", "reserves for itself"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "ws://127.0.0.1:8080"}, "HAREL_EDGE_URL='ws://127.0.0.1:8080'", "set HAREL_EDGE_URL=http://127.0.0.1:8080"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": "wss://db.example.com"}, "HAREL_EDGE_URL='wss://db.example.com'", "set HAREL_EDGE_URL=https://db.example.com"),
        ({"HAREL_EDGE_SYNC_URL": "wss://db.example.com"}, "HAREL_EDGE_SYNC_URL='wss://db.example.com'", "set HAREL_EDGE_SYNC_URL=https://db.example.com"),
        ({"HAREL_LIBSQL_SYNC_URL": "ws://127.0.0.1:8080"}, "HAREL_EDGE_SYNC_URL='ws://127.0.0.1:8080'", "WebSocket"),
        ({"HAREL_EDGE_VISIBILITY": "0"}, "HAREL_EDGE_VISIBILITY", "positive number of seconds"),
        ({"HAREL_EDGE_VISIBILITY": "-5"}, "HAREL_EDGE_VISIBILITY", "positive number of seconds"),
        ({"HAREL_EDGE_BUSY_TIMEOUT_MS": "-1"}, "HAREL_EDGE_BUSY_TIMEOUT_MS", "positive whole number"),
        ({"HAREL_EDGE_DURABILITY": "off"}, "HAREL_EDGE_DURABILITY", "'full' or 'normal'"),
        ({"HAREL_EDGE_RETRY_ATTEMPTS": "0"}, "HAREL_EDGE_RETRY_ATTEMPTS", "positive whole number"),
        ({"HAREL_EDGE_RETRY_MAX_DELAY": "0"}, "HAREL_EDGE_RETRY_MAX_DELAY", "positive number of seconds"),
        ({"HAREL_EDGE_WORKER_ID": "edge#1"}, "HAREL_EDGE_WORKER_ID", "without '#'"),
        ({"HAREL_EDGE_MAX_DELIVERIES": "-1"}, "HAREL_EDGE_MAX_DELIVERIES", "or 0 never to dead-letter"),
        ({"HAREL_EDGE_PUBLISH_WINDOW": "30"}, "HAREL_EDGE_PUBLISH_WINDOW", "set 60 to 31536000 seconds"),
        ({"HAREL_EDGE_PUBLISH_WINDOW": "nan"}, "HAREL_EDGE_PUBLISH_WINDOW", "out of range"),
        ({"HAREL_EDGE_MAX_RUN": "0"}, "HAREL_EDGE_MAX_RUN", "positive whole number"),
        ({"HAREL_EDGE_MAX_RUN": "2001"}, "HAREL_EDGE_MAX_RUN=2001", "set 1 to 2000 events"),
        ({"HAREL_EDGE_MAX_OPEN_REPLICAS": "0"}, "HAREL_EDGE_MAX_OPEN_REPLICAS", "positive whole number"),
        ({"HAREL_EDGE_REPLICA_IDLE_CLOSE": "0"}, "HAREL_EDGE_REPLICA_IDLE_CLOSE=0", "above 0"),
        ({"HAREL_EDGE_REPLICA_IDLE_CLOSE": "nan"}, "HAREL_EDGE_REPLICA_IDLE_CLOSE", "above 0"),
        (
            {"HAREL_EDGE_PUBLISH_WINDOW": "120", "HAREL_EDGE_RETRY_DEADLINE": "300"},
            "HAREL_EDGE_PUBLISH_WINDOW=120 is shorter than HAREL_EDGE_RETRY_DEADLINE=300",
            "at least as long as the deadline",
        ),
    ],
)
def test_a_wrong_setting_fails_at_start_naming_the_variable(monkeypatch, env, variable, advice):
    with pytest.raises(ConfigurationError) as caught:
        load(monkeypatch, **env)
    message = str(caught.value)
    assert variable in message
    assert advice in message


def test_a_token_is_never_echoed_by_a_configuration_error(monkeypatch):
    with pytest.raises(ConfigurationError) as caught:
        load(monkeypatch, HAREL_EDGE_PROFILE="replica", HAREL_EDGE_AUTH_TOKEN="s3cr3t-t0ken")
    assert "s3cr3t-t0ken" not in str(caught.value)


def test_the_transport_is_built_from_the_settings_in_one_call(monkeypatch, tmp_path):
    monkeypatch.setenv("HAREL_EDGE_DB_PATH", str(tmp_path / "q.db"))
    monkeypatch.setenv("HAREL_EDGE_PREFIX", "edge")
    t = LibsqlTransport.from_settings()
    try:
        assert t.settings.prefix == "edge"
        assert (tmp_path / "q.db").exists()
    finally:
        t.close()


def test_an_explicit_transport_ignores_a_contradicting_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HAREL_EDGE_PROFILE", "sqld")
    monkeypatch.setenv("HAREL_EDGE_URL", "http://127.0.0.1:1")
    t = LibsqlTransport(str(tmp_path / "explicit.db"))
    try:
        assert t.settings.profile == "local"
    finally:
        t.close()
    assert ExplicitSettings.load().profile == "local"


# ---- the token as shells and files give it ---------------------------------------------------------


@pytest.mark.parametrize("variable", ["HAREL_EDGE_AUTH_TOKEN", "HAREL_LIBSQL_AUTH_TOKEN"])
@pytest.mark.parametrize("raw", ["tok.en.sig\n", "tok.en.sig\r\n", "  tok.en.sig\t "], ids=["lf", "crlf", "blanks"])
def test_a_token_is_read_without_the_whitespace_around_it(monkeypatch, variable, raw):
    s = load(monkeypatch, HAREL_EDGE_URL="http://127.0.0.1:1", **{variable: raw})
    assert s.auth_token.get_secret_value() == "tok.en.sig"


def test_a_token_from_an_env_file_is_read_without_the_whitespace_around_it(monkeypatch, tmp_path):
    (tmp_path / ".env").write_text('HAREL_EDGE_URL=http://127.0.0.1:1\nHAREL_EDGE_AUTH_TOKEN="tok.en.sig\n"\n')
    assert load(monkeypatch).auth_token.get_secret_value() == "tok.en.sig"


def test_a_token_of_only_whitespace_counts_as_no_token(monkeypatch):
    assert load(monkeypatch, HAREL_EDGE_URL="http://127.0.0.1:1", HAREL_EDGE_AUTH_TOKEN=" \n").auth_token is None


@pytest.mark.parametrize("inside", ["\n", " ", "\t", "\x7f", "é"], ids=["newline", "space", "tab", "delete", "non-ascii"])
def test_a_token_with_whitespace_or_an_invisible_character_inside_is_refused_without_echoing_it(monkeypatch, inside):
    with pytest.raises(ConfigurationError) as caught:
        load(monkeypatch, HAREL_EDGE_URL="http://127.0.0.1:1", HAREL_EDGE_AUTH_TOKEN=f"s3cr3t{inside}t0ken")
    message = str(caught.value)
    assert "HAREL_EDGE_AUTH_TOKEN" in message and "set it to the token alone" in message
    assert "s3cr3t" not in message and "t0ken" not in message


# ---- variables that are no setting ---------------------------------------------------------------------


@pytest.fixture
def warnings_log(caplog, monkeypatch):
    from harel_edge import settings_variables

    monkeypatch.setattr(settings_variables, "_warned", set())
    caplog.set_level("WARNING", logger="harel_edge.settings")
    return caplog


def test_a_misspelled_variable_is_warned_about_once_naming_the_setting_it_resembles(monkeypatch, warnings_log):
    s = load(monkeypatch, HAREL_EDGE_PROFLE="sqld")
    EdgeSettings.load()
    assert s.profile == "local"
    messages = [r.getMessage() for r in warnings_log.records]
    assert len(messages) == 1, messages
    assert "HAREL_EDGE_PROFLE" in messages[0] and "did you mean HAREL_EDGE_PROFILE?" in messages[0]


def test_a_variable_like_no_setting_is_warned_about_without_a_guess(monkeypatch, warnings_log):
    load(monkeypatch, HAREL_EDGE_ZEBRA_CROSSING="1")
    (message,) = [r.getMessage() for r in warnings_log.records]
    assert "HAREL_EDGE_ZEBRA_CROSSING is not a harel_edge setting" in message and "did you mean" not in message


def test_the_variables_harel_edge_reads_are_not_warned_about(monkeypatch, warnings_log):
    load(
        monkeypatch,
        HAREL_EDGE_VISIBILITY="12",
        HAREL_EDGE_SQLD_BACKEND="binary",
        HAREL_EDGE_KEYS_DIR="/keys",
        HAREL_LIBSQL_DB="q.db",
    )
    assert warnings_log.records == []


def test_settings_given_in_code_warn_about_no_variable(monkeypatch, warnings_log):
    monkeypatch.setenv("HAREL_EDGE_PROFLE", "sqld")
    ExplicitSettings.load(db_path="q.db")
    assert warnings_log.records == []


@pytest.mark.parametrize("prefix", ["sqlite", "sqlite_x", "SQLITE_x", "Sqlite_", "sqlitex", "x_sqlite", "_sqlite", "_", "a" * 30])
def test_a_prefix_the_settings_accept_is_one_the_database_accepts(tmp_path, prefix):
    from harel_edge.migration import migrate

    try:
        settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"), prefix=prefix)
    except ConfigurationError as exc:
        assert "HAREL_EDGE_PREFIX" in str(exc)
        return
    migrate(settings)  # creates every table under the prefix, on a real file


def test_the_docs_state_the_publish_windows_default_as_the_settings_have_it():
    import re
    from pathlib import Path

    assert EdgeSettings.model_fields["publish_window"].default == 3600
    docs = Path(__file__).resolve().parents[2] / "docs"
    stated = [
        (page.name, said)
        for page in docs.glob("*.md")
        for said in re.findall(r"HAREL_EDGE_PUBLISH_WINDOW`?(?: seconds)?\s*\(default\s+([^;)]*)", page.read_text())
    ]
    assert len(stated) >= 2, f"the docs state the default in transport.md's table and text: {stated}"
    assert all(said.startswith(("an hour", "3600", "3,600")) for _, said in stated), stated


def test_the_longest_run_the_settings_accept_is_acked_in_one_statement_the_queue_can_send():
    from harel_edge.queue.statements import ACK_ROWS  # noqa: PLC0415
    from harel_edge.settings import MAX_RUN_BOUND  # noqa: PLC0415

    assert MAX_RUN_BOUND <= ACK_ROWS
    assert load_max_run(MAX_RUN_BOUND) == MAX_RUN_BOUND


def load_max_run(value: int) -> int:
    return ExplicitSettings.load(max_run=value).max_run
