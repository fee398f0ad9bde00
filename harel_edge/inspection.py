"""Is this database one harel_edge may use, and may this user write it: looks at a file (through
libsql in SQLite's read-only mode, never writing) and at a database's facts through one
`execute(sql, params)`."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harel_edge import migrations
from harel_edge.errors import (
    AuthError,
    DamagedDatabaseError,
    DatabaseAccessError,
    ForeignDatabaseError,
    NotADatabaseError,
    SchemaError,
)
from harel_edge.schema import EdgeNames

Execute = Callable[..., list[tuple]]
SQLITE_HEADER = b"SQLite format 3\x00"


# Tables harel_edge or harel may own in a database harel_edge works on (besides `<prefix>_*`).
OWN_TABLE_PREFIXES = ("workflow_", "sqlite_", "libsql_", "_litestream")


@dataclass
class DatabaseFacts:
    """What a database holds, as far as deciding whether harel_edge may use it."""

    exists: bool
    user_version: int = 0
    tables: list[str] = field(default_factory=list)

    def ours(self, prefix: str) -> list[str]:
        return [t for t in self.tables if t.startswith(f"{prefix}_") or t.startswith(OWN_TABLE_PREFIXES)]

    def foreign(self, prefix: str) -> list[str]:
        return [t for t in self.tables if t not in self.ours(prefix)]

    def has_schema(self, prefix: str) -> bool:
        return EdgeNames(prefix).messages in self.tables


def database_facts(execute: Execute) -> DatabaseFacts:
    """The schema version and the tables, with reads only.

    `pragma_user_version`, because sqld takes every PRAGMA statement for a write (docs/operations.md).
    """
    return facts_of(execute(VERSION_SQL), execute(TABLES_SQL))


VERSION_SQL = "SELECT user_version FROM pragma_user_version"
TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"


def facts_of(version_rows: list[tuple], table_rows: list[tuple]) -> DatabaseFacts:
    """The facts from the answers to VERSION_SQL and TABLES_SQL, however they were read."""
    return DatabaseFacts(True, int(version_rows[0][0]), [row[0] for row in table_rows])


def check_usable(facts: DatabaseFacts, prefix: str, where: str, *, adopt: bool = False) -> None:
    """Refuse a database harel_edge must not touch: written by a newer version, or another
    application's (its tables and none of ours) unless `adopt` says to share it on purpose."""
    migrations.refuse_newer(facts.user_version, str(where))
    foreign = facts.foreign(prefix)
    if foreign and not facts.ours(prefix) and not adopt:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise ForeignDatabaseError(
            f"{where} holds another application's tables ({shown}) and no harel_edge tables: point "
            "HAREL_EDGE_DB_PATH / HAREL_EDGE_URL at a harel_edge database or an empty one, or run "
            "`harel-edge migrate --adopt` to add harel_edge's tables beside them on purpose; nothing was changed"
        )


DAMAGED_FIX = (
    "Restore it from a backup, or for a replica move the file (and its -wal, -shm, "
    "-client_wal_index files) aside and let it re-sync; the file was left untouched"
)


# A look at a file that changed meanwhile (a checkpoint by a worker) is repeated, this often.
INSPECT_ATTEMPTS = 3


def inspect_file(path: str) -> DatabaseFacts:
    """Look at a local database file without changing it; a missing or empty file is simply new.

    Raises `NotADatabaseError`, `DamagedDatabaseError` (`quick_check`) or `DatabaseAccessError`.
    """
    p = Path(path).expanduser()
    if path == ":memory:" or not p.exists():
        return DatabaseFacts(False)
    if p.is_dir():
        raise NotADatabaseError(f"{p} is a directory: set HAREL_EDGE_DB_PATH to a file inside it")
    if not os.access(p, os.R_OK):
        raise DatabaseAccessError(
            f"{p} cannot be read by this user (uid {os.geteuid()}): run the command as the user the "
            "workers run as, or give this one read access (chmod/chown); nothing was changed"
        )
    with p.open("rb") as f:
        header = f.read(len(SQLITE_HEADER))
    if not header:
        return DatabaseFacts(False)
    if header != SQLITE_HEADER:
        raise NotADatabaseError(
            f"{p} is not a SQLite/libSQL database (it does not start with SQLite's header): point "
            "HAREL_EDGE_DB_PATH at a harel_edge database or a new file; the file was left untouched"
        )
    for _ in range(INSPECT_ATTEMPTS):
        stamp = _stamp(p)
        facts: DatabaseFacts | None = None
        failure: ValueError | None = None
        try:
            connection = open_read_only(str(p))
            try:
                execute = runner(connection)
                problems = integrity(execute)
                if problems == "ok":
                    facts = database_facts(execute)
            finally:
                connection.close()
        except ValueError as exc:  # the driver's errors are ValueErrors
            failure = exc
        if _stamp(p) == stamp:
            break  # nothing wrote to the file while it was read: what was read holds
    if failure is not None:
        raise NotADatabaseError(f"{p} is damaged: SQLite cannot read it ({failure}). {DAMAGED_FIX}") from None
    if facts is None:
        raise DamagedDatabaseError(f"{p} is damaged: {problems}. {DAMAGED_FIX}", problems)
    return facts


def runner(connection: ReadOnlyConnection) -> Execute:
    return lambda sql, params=(): connection.execute(sql, params).fetchall()


def _stamp(p: Path) -> tuple:
    """What changes when anything writes to the database: the file's and its -wal's identity,
    size and modification time."""
    stamps = []
    for file in (p, Path(f"{p}-wal")):
        try:
            st = file.stat()
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def integrity(execute: Execute) -> str:
    """SQLite's `PRAGMA quick_check`: 'ok', or the first problems on one line."""
    lines = [line for (row,) in execute("PRAGMA quick_check(5)") for line in str(row).splitlines()]
    return "; ".join(line for line in lines if line.strip() and not line.startswith("*** in database"))


class ReadOnlyConnection:
    """libsql on a file in SQLite's read-only mode; on a private copy of it, removed at close.

    libsql, not the standard library's sqlite3: two SQLite libraries on one file in one process
    release each other's locks (docs/operations.md, "One SQLite library a process")."""

    def __init__(self, uri: str, snapshot_dir: str | None = None) -> None:
        from harel_edge.connection import libsql  # noqa: PLC0415 - with its RUST_LOG default

        self.snapshot_dir = snapshot_dir
        self._raw = libsql.connect(uri, timeout=5.0, _uri=True)

    def execute(self, sql: str, params: tuple | list = ()) -> Any:
        return self._raw.execute(sql, tuple(params))

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            if self.snapshot_dir is not None:
                shutil.rmtree(self.snapshot_dir, ignore_errors=True)
                self.snapshot_dir = None


def open_read_only(path: str) -> ReadOnlyConnection:
    """`path`, read-only: it changes nothing and creates nothing beside it.

    How each state of the `-wal`/`-shm` files is read: docs/operations.md ("The local file").
    """
    p = Path(path).expanduser().resolve()
    uri = p.as_uri() + "?mode=ro"
    attempts = 0
    while True:
        attempts += 1
        if not Path(f"{p}-wal").exists():
            return ReadOnlyConnection(uri + "&immutable=1")
        if Path(f"{p}-shm").exists():
            return ReadOnlyConnection(uri)
        directory = tempfile.mkdtemp(prefix="harel-edge-read-")
        try:
            copy = Path(directory) / p.name
            shutil.copyfile(p, copy)
            shutil.copyfile(f"{p}-wal", f"{copy}-wal")
            return ReadOnlyConnection(copy.as_uri() + "?mode=ro", snapshot_dir=directory)
        except FileNotFoundError:
            shutil.rmtree(directory, ignore_errors=True)
            if attempts == 3 or not p.exists():
                raise
            # The writer checkpointed and removed its WAL while it was copied: look at the files again.
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise


# ---- may this user write it -------------------------------------------------------------------

READ_ONLY_FIX = (
    "make it writable for the user the workers run as (chmod u+w, or chown it to that user), or set "
    "HAREL_EDGE_DB_PATH to a file in a directory that user may write; status and doctor can still "
    "read it"
)


def write_problem(path: str) -> str | None:
    """Why this user could not write the database at `path` (file or directory), or None when it could.

    Decided with `os.access`, which answers for the user the command runs as, root included.
    """
    if path == ":memory:":
        return None
    p = Path(path).expanduser().absolute()
    who = f"this user (uid {os.geteuid()})"
    if p.exists():
        for file in (p, Path(f"{p}-wal"), Path(f"{p}-shm")):
            if file.exists() and not os.access(file, os.R_OK | os.W_OK):
                return f"{file} is read-only for {who}{_read_only_mount(file)}"
        if not os.access(p.parent, os.W_OK | os.X_OK):
            return (
                f"{p.parent} is not writable for {who}{_read_only_mount(p.parent)}, and SQLite creates "
                f"{p.name}-wal and {p.name}-shm beside the database there"
            )
        return None
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create {p}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {p}: {ancestor} is not writable for {who}{_read_only_mount(ancestor)}"
    return None


def _read_only_mount(path: Path) -> str:
    try:
        return " (its filesystem is mounted read-only)" if os.statvfs(path).f_flag & os.ST_RDONLY else ""
    except OSError:
        return ""


def check_can_write(path: str) -> None:
    """Refuse, before anything is created, a database this user could not write."""
    problem = write_problem(path)
    if problem is not None:
        raise DatabaseAccessError(f"{problem}: {READ_ONLY_FIX}; nothing was changed")


def last_sync_of_replica_file(path: str) -> float | None:
    """When this machine's embedded replica file last synced, as unix time (None: never here): the mtime
    of `<file>-client_wal_index`, which libsql 0.1.8 rewrites on every successful sync.
    """
    index = Path(f"{Path(path).expanduser()}-client_wal_index")
    try:
        return index.stat().st_mtime
    except OSError:
        return None


def write_access(execute: Execute, facts: DatabaseFacts, prefix: str) -> bool | None:
    """Whether the credentials may write, found with a write that changes nothing; None when no table to aim at.

    Raises what is not an authorization failure; after a refusal a remote caller must reopen (docs/operations.md).
    """
    if not facts.has_schema(prefix):
        return None
    try:
        execute(f"DELETE FROM {EdgeNames(prefix).messages} WHERE 0")
    except AuthError:
        return False
    except ValueError as exc:
        text = str(exc).lower()
        if "403" in text or "forbidden" in text or "permissiondenied" in text.replace(" ", ""):
            return False
        raise
    return True


def raise_missing(path: str) -> None:
    raise SchemaError(
        f"no database at {path}: start a worker or run `harel-edge migrate` to create it "
        "(or set HAREL_EDGE_DB_PATH to the file the workers use)"
    )
