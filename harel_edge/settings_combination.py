"""The checks of the settings taken together, each refusal naming the variables to change: the
publish window against the retries, `{database}` filled in, and the profile against its addresses."""

from __future__ import annotations

from typing import Any

from harel_edge import database_names
from harel_edge.server_url import check_server_url, is_url
from harel_edge.settings_variables import variable_for


def check(settings: Any) -> bool:
    """Every check, in order: the profile is inferred and checked once `{database}` is filled in.
    Returns whether requests name the database by header (a namespace of a sqld at one address)."""
    window_outlasts_retries(settings)
    if settings.databases_file is not None:
        if settings.databases and settings.database is None:
            raise ValueError("HAREL_EDGE_DATABASES and HAREL_EDGE_DATABASES_FILE are both set: keep one")
        settings.databases = database_names.read_names_file(settings.databases_file)
        if not settings.databases:
            raise ValueError(f"HAREL_EDGE_DATABASES_FILE={settings.databases_file!r} names no database: add one a line")
    if settings.doorbell is not None and not settings.databases:
        raise ValueError(
            f"HAREL_EDGE_DOORBELL={settings.doorbell!r} rings for a deployment's databases, but "
            "HAREL_EDGE_DATABASES is not set: list the databases, or unset the doorbell"
        )
    templated = [f for f in ("db_path", "url", "sync_url") if database_names.TEMPLATE in (getattr(settings, f) or "")]
    database_filled_in(settings, templated)
    coherent_profile(settings)
    one_address_each(settings, templated)
    return settings.database is not None and "url" not in templated and "sync_url" not in templated


def window_outlasts_retries(settings: Any) -> None:
    if settings.publish_window < settings.retry_deadline:
        raise ValueError(
            f"HAREL_EDGE_PUBLISH_WINDOW={settings.publish_window:g} is shorter than "
            f"HAREL_EDGE_RETRY_DEADLINE={settings.retry_deadline:g}: a publish retried after the window "
            "could be queued twice; set the window at least as long as the deadline"
        )


def database_filled_in(settings: Any, templated: list[str]) -> None:
    """Every `{database}` filled in with the database named; left for a deployment's settings."""
    if settings.database is None:
        if templated and not settings.databases:
            raise ValueError(
                f"{variable_for(templated[0])} has {database_names.TEMPLATE} in it: say which database with "
                "HAREL_EDGE_DATABASE (or --database NAME), or list them in HAREL_EDGE_DATABASES"
            )
        return
    for name in templated:
        setattr(settings, name, database_names.render(getattr(settings, name), settings.database))


def coherent_profile(settings: Any) -> None:
    if settings.profile is None:
        # Inferred the way a harel user's HAREL_LIBSQL_* variables mean it.
        if settings.sync_url:
            settings.profile = "replica"
        elif settings.url or is_url(settings.db_path):
            settings.profile = "sqld"
        else:
            settings.profile = "local"
    if settings.profile == "sqld" and settings.url is None and is_url(settings.db_path):
        settings.url = settings.db_path  # HAREL_LIBSQL_DB may name the server itself
    if settings.profile == "local":
        if settings.sync_url:
            raise ValueError(
                "HAREL_EDGE_SYNC_URL is set but HAREL_EDGE_PROFILE=local: set HAREL_EDGE_PROFILE=replica "
                "to sync with that primary, or unset HAREL_EDGE_SYNC_URL"
            )
        if settings.url:
            raise ValueError(
                "HAREL_EDGE_URL is set but HAREL_EDGE_PROFILE=local: set HAREL_EDGE_PROFILE=sqld "
                "to use that server, or unset HAREL_EDGE_URL"
            )
        if is_url(settings.db_path):
            raise ValueError(
                f"HAREL_EDGE_DB_PATH={settings.db_path!r} is a URL but the local profile needs a file path: "
                "set HAREL_EDGE_PROFILE=sqld and HAREL_EDGE_URL to use a server"
            )
    elif settings.profile == "sqld":
        if not settings.url:
            raise ValueError(
                "HAREL_EDGE_PROFILE=sqld needs the server: set HAREL_EDGE_URL=http://host:8080 "
                "(settings-hosted sqld) or libsql://<db>.turso.io"
            )
        check_server_url("HAREL_EDGE_URL", settings.url)
        if settings.sync_url:
            raise ValueError(
                "HAREL_EDGE_SYNC_URL is set but HAREL_EDGE_PROFILE=sqld talks to the server directly: "
                "set HAREL_EDGE_PROFILE=replica for an embedded replica, or unset HAREL_EDGE_SYNC_URL"
            )
    else:  # replica
        if not settings.sync_url:
            raise ValueError(
                "HAREL_EDGE_PROFILE=replica needs its primary: set HAREL_EDGE_SYNC_URL="
                "http://host:8080 (the primary's HTTP address, not its gRPC one)"
            )
        check_server_url("HAREL_EDGE_SYNC_URL", settings.sync_url)
        if is_url(settings.db_path) or settings.db_path == ":memory:":
            raise ValueError(
                f"HAREL_EDGE_DB_PATH={settings.db_path!r} must be a local file for the replica profile: "
                "set it to the path of the replica's file, e.g. /var/lib/harel-edge/replica.db"
            )
        if settings.url:
            raise ValueError(
                "HAREL_EDGE_URL is set but the replica profile syncs from HAREL_EDGE_SYNC_URL: unset one"
            )


def one_address_each(settings: Any, templated: list[str]) -> None:
    """Each database of a deployment has a file of its own, and a replica syncs the one it names."""
    many = len(settings.databases) > 1
    if many and settings.profile in ("local", "replica") and "db_path" not in templated:
        raise ValueError(
            f"HAREL_EDGE_DATABASES names several databases but HAREL_EDGE_DB_PATH={settings.db_path!r} is one file: "
            f"put {database_names.TEMPLATE} in it, e.g. HAREL_EDGE_DB_PATH=/var/lib/harel-edge/{database_names.TEMPLATE}.db"
        )
    if settings.profile == "replica" and settings.database is not None and "sync_url" not in templated:
        # libsql's replica asks sqld for the namespace its sync URL's host name starts with.
        raise ValueError(
            "an embedded replica syncs the database its HAREL_EDGE_SYNC_URL's host name starts with: put "
            f"{database_names.TEMPLATE} in it, e.g. HAREL_EDGE_SYNC_URL=http://{database_names.TEMPLATE}.primary.internal:8080 "
            f"(a name that resolves to the primary), or libsql://{database_names.TEMPLATE}-ORG.turso.io on Turso"
        )
