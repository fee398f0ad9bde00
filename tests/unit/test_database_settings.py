"""Settings of many databases: which one a setting addresses, `{database}` filled in, sqld's
namespace header, and every combination that cannot work refused with what to change."""

from __future__ import annotations

import base64

import pytest

from harel_edge.errors import ConfigurationError
from harel_edge.executor import open_executor
from harel_edge.settings import ExplicitSettings


def test_a_deployments_database_on_sqld_at_one_address_is_named_by_the_namespace_header():
    deployment = ExplicitSettings.load(profile="sqld", url="http://127.0.0.1:8080", databases="acme,globex")
    assert deployment.is_deployment and deployment.database_header == {}
    acme = deployment.for_database("acme")
    assert acme.url == "http://127.0.0.1:8080" and not acme.is_deployment
    (header, value), = acme.database_header.items()
    assert header == "x-namespace-bin"
    assert base64.b64decode(value + "=" * (-len(value) % 4)) == b"acme"


def test_database_in_an_address_is_filled_in_and_then_no_header_is_sent():
    turso = ExplicitSettings.load(profile="sqld", url="libsql://{database}-myorg.turso.io", databases="acme,globex")
    globex = turso.for_database("globex")
    assert globex.url == "libsql://globex-myorg.turso.io" and globex.database_header == {}
    files = ExplicitSettings.load(db_path="/data/{database}.db", databases="acme,globex")
    assert files.profile == "local" and files.for_database("acme").db_path == "/data/acme.db"
    one = ExplicitSettings.load(db_path="/data/{database}.db", database="initech")
    assert one.db_path == "/data/initech.db" and not one.is_deployment


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"database": "Acme.Corp"}, "HAREL_EDGE_DATABASE='Acme.Corp' is not a database name"),
        ({"databases": "acme,-x"}, "HAREL_EDGE_DATABASES='-x' is not a database name"),
        ({"databases": "acme,globex,acme"}, "names acme more than once"),
        ({"db_path": "{database}.db"}, "say which database with HAREL_EDGE_DATABASE"),
        ({"db_path": "one.db", "databases": "acme,globex"}, "put {database} in it"),
        (
            {"profile": "replica", "sync_url": "http://127.0.0.1:8080", "db_path": "r.db", "database": "acme"},
            "syncs the database its HAREL_EDGE_SYNC_URL's host name starts with",
        ),
    ],
)
def test_settings_that_cannot_address_their_databases_are_refused_with_what_to_change(values, says):
    with pytest.raises(ConfigurationError) as refused:
        ExplicitSettings.load(**values)
    assert says in str(refused.value)


def test_a_deployments_settings_open_no_database_until_one_is_named():
    deployment = ExplicitSettings.load(db_path="/data/{database}.db", databases="acme,globex")
    with pytest.raises(ConfigurationError) as refused:
        open_executor(deployment)
    assert "say which one with --database NAME" in str(refused.value)
    with pytest.raises(ConfigurationError):
        deployment.for_database("acme").for_database("globex")


def test_the_admin_key_is_never_shown():
    settings = ExplicitSettings.load(
        profile="sqld", url="http://127.0.0.1:8080", admin_url="http://127.0.0.1:9090", admin_key="very-secret-key"
    )
    assert settings.admin_key.get_secret_value() == "very-secret-key"
    assert "very-secret-key" not in repr(settings) and "very-secret-key" not in str(settings.redacted())


def test_a_databases_file_names_the_deployment_and_one_that_names_none_or_beside_the_list_is_refused(tmp_path):
    names = tmp_path / "databases"
    names.write_text("acme  # the first tenant\n\nglobex\n")
    settings = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases_file=str(names))
    assert settings.databases == ("acme", "globex") and settings.is_deployment
    with pytest.raises(ConfigurationError) as both:
        ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases_file=str(names), databases="acme")
    assert "keep one" in str(both.value)
    names.write_text("# nobody yet\n")
    with pytest.raises(ConfigurationError) as empty:
        ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases_file=str(names))
    assert "names no database" in str(empty.value)
    with pytest.raises(ConfigurationError) as missing:
        ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases_file=str(tmp_path / "nope"))
    assert "cannot be read" in str(missing.value)

