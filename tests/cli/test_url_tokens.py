"""A token written into the primary's URL (libsql's `?authToken=` form) would be shown wherever
the URL is (status, migrate, the dashboard's header, errors): the settings refuse it, saying to
give the token as HAREL_EDGE_AUTH_TOKEN, and nothing prints the token."""

from __future__ import annotations

import pytest
from cli_helpers import env_for, run

from harel_edge.errors import ConfigurationError
from harel_edge.settings import ExplicitSettings

TOKEN = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJzZWNyZXQtdXJsLXRva2VuIn0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": f"http://127.0.0.1:8080?authToken={TOKEN}"},
         "set HAREL_EDGE_URL=http://127.0.0.1:8080 and give the token as HAREL_EDGE_AUTH_TOKEN"),
        ({"HAREL_EDGE_PROFILE": "replica", "HAREL_EDGE_SYNC_URL": f"libsql://db.example.io?tls=1&authToken={TOKEN}"},
         "set HAREL_EDGE_SYNC_URL=libsql://db.example.io?tls=1 and give the token as HAREL_EDGE_AUTH_TOKEN"),
        ({"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": f"http://user:{TOKEN}@127.0.0.1:8080"},
         "set HAREL_EDGE_URL=http://127.0.0.1:8080 and give the token as HAREL_EDGE_AUTH_TOKEN"),
    ],
    ids=["sqld with authToken", "replica with authToken", "a password in the URL"],
)
@pytest.mark.parametrize("command", [["migrate"], ["status"], ["config", "show"]], ids=" ".join)
def test_a_token_in_the_primarys_url_is_refused_and_never_printed(tmp_path, variables, says, command):
    env = env_for(None, HAREL_EDGE_DB_PATH=str(tmp_path / "replica.db"), **variables)
    done = run(command, env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert TOKEN not in done.stdout + done.stderr


def test_the_librarys_settings_refuse_a_token_in_the_url_without_showing_it():
    with pytest.raises(ConfigurationError) as refused:
        ExplicitSettings.load(profile="sqld", url=f"http://127.0.0.1:8080/?authToken={TOKEN}")
    assert "HAREL_EDGE_AUTH_TOKEN" in str(refused.value) and TOKEN not in str(refused.value)
