"""How commands reach the database: read-only to look, and checked before anything is written
(`check_writable` refuses what must not be written to).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harel_edge.errors import AuthError
from harel_edge.inspection import (
    Execute,
    check_can_write,
    check_usable,
    database_facts,
    inspect_file,
    open_read_only,
    raise_missing,
    write_access,
)
from harel_edge.settings import EdgeSettings
from harel_edge.sync_sql import Statements

READ_ONLY_FILE_FIX = (
    "workers, publish and migrate write the database and create its -wal and -shm beside it: make "
    "the file and its directory writable for the user they run as (chmod u+w, or chown them to that "
    "user), or set HAREL_EDGE_DB_PATH to a writable place (status and doctor only read)"
)
READ_ONLY_TOKEN = (
    "the primary at {where} accepts this token for reading only: set HAREL_EDGE_AUTH_TOKEN to a "
    "read-write token (publish, migrate and workers write; status and doctor only read); nothing was changed"
)


class Listed(list):
    """One page of a listing, and how many rows match in all, so a capped list can say "200 of
    456". Its query's last column is `count(*) OVER ()`: one read gives both."""

    def __init__(self, rows: list[tuple], make: Callable[[tuple], Any]) -> None:
        super().__init__(make(row[:-1]) for row in rows)
        self.total = int(rows[0][-1]) if rows else 0


def primary_settings(settings: EdgeSettings) -> EdgeSettings:
    """The sqld-profile settings that talk to a replica's primary directly."""
    if not settings.syncs:
        return settings
    return settings.model_copy(update={"profile": "sqld", "url": settings.sync_url, "sync_url": None})


def probe(settings: EdgeSettings) -> Statements:
    """The primary itself (sqld, or a replica's primary) over Hrana, asked once at open: an
    `AuthError` tells a refused token from an unreachable primary, which a replica's sync cannot."""
    primary = Statements(primary_settings(settings))
    try:
        primary.execute_once("SELECT 1")
    except BaseException:
        primary.close()
        raise
    return primary


def check_writable(settings: EdgeSettings, *, adopt: bool = False) -> None:
    """Refuse, before anything is written, what must not be written to: a file that is not a
    database, is damaged or is another application's, a newer schema, a file or directory this
    user cannot write, and a read-only token."""
    if settings.has_file:
        check_usable(inspect_file(settings.db_path), settings.prefix, settings.db_path, adopt=adopt)
        check_can_write(settings.db_path)
    if not settings.has_primary:
        return
    primary = probe(settings)
    try:
        facts = database_facts(primary.execute)
        check_usable(facts, settings.prefix, settings.server or "", adopt=adopt)
        allowed = write_access(primary.execute, facts, settings.prefix)
        if allowed is None:
            # No harel_edge table to aim a no-op write at: the command is about to create the
            # schema, so a write of the version the file already has is no change worth avoiding.
            try:
                primary.execute(f"PRAGMA user_version = {int(facts.user_version)}")
                allowed = True
            except AuthError:
                allowed = False
        if not allowed:
            raise AuthError(READ_ONLY_TOKEN.format(where=settings.server))
    finally:
        primary.close()


def open_for_writing(settings: EdgeSettings, *, adopt: bool = False) -> Statements:
    """The profile's executor for sync code, after `check_writable` (a replica's writes go to
    its primary over Hrana, as every remote write does)."""
    check_writable(settings, adopt=adopt)
    return Statements(settings)


@dataclass
class Reader:
    """Read-only access: the primary's data (or the local file's), and on a replica its own file."""

    execute: Execute
    close: Callable[[], None]
    where: str


def open_for_reading(settings: EdgeSettings) -> Reader:
    """A local file through SQLite's read-only mode; otherwise the primary itself, sent reads only."""
    if not settings.has_primary:
        if not inspect_file(settings.db_path).exists:
            raise_missing(settings.db_path)
        connection = open_read_only(settings.db_path)
        return Reader(
            lambda sql, params=(): connection.execute(sql, params).fetchall(),
            connection.close,
            settings.db_path,
        )
    primary = probe(settings)
    return Reader(primary.execute, primary.close, settings.server or "")


def with_reader(settings: EdgeSettings, work: Callable[[Execute], Any]) -> Any:
    """Run `work` on a read-only view of a database harel_edge may use."""
    reader = open_for_reading(settings)
    try:
        check_usable(database_facts(reader.execute), settings.prefix, reader.where)
        return work(reader.execute)
    finally:
        reader.close()


def with_primary_writer(settings: EdgeSettings, work: Callable[[Execute], Any]) -> Any:
    """Run `work` on the primary itself (on a replica too: what it writes must be decided
    there, and read back from there), after `check_writable`."""
    check_writable(settings)
    primary = Statements(primary_settings(settings))
    try:
        return work(primary.execute)
    finally:
        primary.close()
