"""What `harel-edge status` and `doctor` look at: plain functions over one `execute(sql, params)`.

Inspection never writes; local files are read through sqlite3 read-only (docs/operations.md).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from harel_edge import schema
from harel_edge.errors import (
    DamagedDatabaseError,
    DatabaseAccessError,
    ForeignDatabaseError,
    NotADatabaseError,
    SchemaError,
)
from harel_edge.schema import DB_NOW, PARKED, EdgeNames, now_table
from harel_edge.settings import EdgeSettings

Execute = Callable[..., list[tuple]]
SQLITE_HEADER = b"SQLite format 3\x00"
# Tables harel_edge or harel may own in a database harel_edge works on (besides `<prefix>_*`).
OWN_TABLE_PREFIXES = ("workflow_", "sqlite_", "libsql_", "_litestream")


# ---- the database file ---------------------------------------------------------------------


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
    version = schema.read_version(execute)
    tables = [row[0] for row in execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return DatabaseFacts(True, version, tables)


def check_usable(facts: DatabaseFacts, prefix: str, where: str, *, adopt: bool = False) -> None:
    """Refuse a database harel_edge must not touch: written by a newer version, or another
    application's (its tables and none of ours) unless `adopt` says to share it on purpose."""
    schema.refuse_newer(facts.user_version, str(where))
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
        failure: sqlite3.DatabaseError | None = None
        try:
            connection = open_read_only(str(p))
            try:
                execute = _runner(connection)
                problems = integrity(execute)
                if problems == "ok":
                    facts = database_facts(execute)
            finally:
                connection.close()
        except sqlite3.DatabaseError as exc:
            failure = exc
        if _stamp(p) == stamp:
            break  # nothing wrote to the file while it was read: what was read holds
    if failure is not None:
        raise NotADatabaseError(f"{p} is damaged: SQLite cannot read it ({failure}). {DAMAGED_FIX}") from None
    if facts is None:
        raise DamagedDatabaseError(f"{p} is damaged: {problems}. {DAMAGED_FIX}", problems)
    return facts


def _runner(connection: sqlite3.Connection) -> Execute:
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


class _SnapshotConnection(sqlite3.Connection):
    """A read-only connection to a private copy of a database, removed when it is closed."""

    snapshot_dir: str | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.snapshot_dir is not None:
                shutil.rmtree(self.snapshot_dir, ignore_errors=True)
                self.snapshot_dir = None


def open_read_only(path: str) -> sqlite3.Connection:
    """The standard library's sqlite3 on `path`, read-only: it changes nothing and creates nothing beside it.

    How each state of the `-wal`/`-shm` files is read: docs/operations.md ("The local file").
    """
    p = Path(path).expanduser().resolve()
    uri = p.as_uri() + "?mode=ro"
    if not Path(f"{p}-wal").exists():
        return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=5.0)
    if Path(f"{p}-shm").exists():
        return sqlite3.connect(uri, uri=True, timeout=5.0)
    directory = tempfile.mkdtemp(prefix="harel-edge-read-")
    try:
        copy = Path(directory) / p.name
        shutil.copyfile(p, copy)
        shutil.copyfile(f"{p}-wal", f"{copy}-wal")
        connection = sqlite3.connect(
            copy.as_uri() + "?mode=ro", uri=True, timeout=5.0, factory=_SnapshotConnection
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    connection.snapshot_dir = directory
    return connection


def quick_check(path: str) -> str:
    """SQLite's `PRAGMA quick_check` on a local file, read-only: 'ok' or the first problems."""
    connection = open_read_only(path)
    try:
        return integrity(_runner(connection))
    finally:
        connection.close()


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


# ---- the queue ---------------------------------------------------------------------------------


def _created_epoch(column: str) -> str:
    """A message's `created_time` (stamped by `harel-edge publish` and the demo; harel's own
    publishes leave it null) as epoch seconds, in SQL every SQLite version understands."""
    return f"((julianday(json_extract({column}, '$.created_time')) - 2440587.5) * 86400.0)"


def queue_status(execute: Execute, prefix: str, top: int = 10) -> dict[str, Any]:
    """Depth by priority and routing key, the deepest groups, in flight, parked, the oldest message."""
    n = EdgeNames(prefix)
    state = (
        f"CASE WHEN m.locked_by IS NULL OR m.lock_expiry < t.now THEN 'queued'"
        f" WHEN m.locked_by = '{PARKED}' THEN 'parked' ELSE 'in_flight' END"
    )
    clock = now_table()
    rows = execute(
        f"SELECT g.priority, g.routing_key, count(DISTINCT g.group_id), count(*),"
        f" sum(s = 'queued'), sum(s = 'in_flight'), sum(s = 'parked')"
        f" FROM (SELECT m.group_id, {state} AS s FROM {n.messages} m, {clock}) AS x"
        f" JOIN {n.groups} g ON g.group_id = x.group_id"
        f" GROUP BY g.priority, g.routing_key ORDER BY g.priority DESC, g.routing_key"
    )
    by_key = [
        {
            "priority": int(p),
            "routing_key": rk,
            "groups": int(groups),
            "messages": int(msgs),
            "queued": int(q or 0),
            "in_flight": int(f or 0),
            "parked": int(pk or 0),
        }
        for p, rk, groups, msgs, q, f, pk in rows
    ]
    groups = execute(
        f"SELECT g.group_id, g.priority, g.routing_key, count(*),"
        f" (SELECT {state} FROM {n.messages} m, {clock} WHERE m.group_id = g.group_id ORDER BY m.seq LIMIT 1)"
        f" FROM {n.groups} g JOIN {n.messages} mm ON mm.group_id = g.group_id"
        f" GROUP BY g.group_id ORDER BY count(*) DESC, g.group_id LIMIT ?",
        (top,),
    )
    deepest = [
        {"group_id": g, "priority": int(p), "routing_key": rk, "messages": int(c), "head": head}
        for g, p, rk, c, head in groups
    ]
    ((now, oldest_seq, oldest_group, stamped),) = execute(
        f"SELECT t.now, m.seq, m.group_id, (SELECT min({_created_epoch('event')}) FROM {n.messages})"
        f" FROM {clock} LEFT JOIN {n.messages} m ON m.seq = (SELECT min(seq) FROM {n.messages})"
    )
    totals = {
        k: sum(row[k] for row in by_key) for k in ("messages", "queued", "in_flight", "parked", "groups")
    }
    return {
        "database_now": now,
        "totals": totals,
        "by_priority_and_routing_key": by_key,
        "deepest_groups": deepest,
        "oldest": {
            "seq": oldest_seq,
            "group_id": oldest_group,
            # from created_time, where the publisher stamped it; None when none did
            "age_seconds": None if stamped is None else max(0.0, now - stamped),
        },
    }


def workflow_status(execute: Execute) -> dict[str, Any]:
    """Durable workflows: ready, sleeping and claimed per namespace, finished overall."""
    clock = now_table()
    live = "c.held_until > t.now AND c.alive_until > t.now"
    rows = execute(
        f"SELECT q.namespace,"
        f" sum(q.visible_at <= t.now),"
        f" sum(q.visible_at > t.now AND NOT EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = q.workflow AND {live})),"
        f" sum(EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = q.workflow AND {live})),"
        f" min(CASE WHEN q.visible_at > t.now THEN q.visible_at - t.now END)"
        f" FROM workflow_queue q, {clock} GROUP BY q.namespace ORDER BY q.namespace"
    )
    namespaces = [
        {
            "namespace": ns,
            "ready": int(ready or 0),
            "sleeping": int(sleeping or 0),
            "claimed": int(claimed or 0),
            "next_wake_in_seconds": wake,
        }
        for ns, ready, sleeping, claimed, wake in rows
    ]
    ((claimed_total, finished),) = execute(
        f"SELECT (SELECT count(*) FROM workflow_claim c, {clock} WHERE {live}),"
        " (SELECT count(*) FROM workflow_checkpoint WHERE step = '$result')"
    )
    return {"namespaces": namespaces, "claimed": int(claimed_total), "finished": int(finished)}


def dead_letter_status(execute: Execute, prefix: str) -> dict[str, Any]:
    """How many dead letters there are, of each kind: one read of a table that stays small."""
    rows = execute(
        f"SELECT sum(kind = 'message'), sum(kind = 'workflow'), min(dead_at) FROM {schema.dead_letters_table(prefix)}"
    )
    messages, workflows, oldest = rows[0] if rows else (0, 0, None)
    return {"messages": int(messages or 0), "workflows": int(workflows or 0), "oldest_at": oldest}


# ---- what `status` shows ------------------------------------------------------------------------


@dataclass
class ReplicaStatus:
    """A replica's file: when it last synced here, and what it sees locally against the primary."""

    file: str
    last_sync_at: str | None
    lag_seconds: float | None
    messages_on_primary: int = 0
    messages_seen_locally: int | None = None  # None: no file with our tables here yet

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "file": self.file,
            "last_sync_at": self.last_sync_at,
            "lag_seconds": self.lag_seconds,
        }
        if self.messages_seen_locally is not None:
            values["messages_seen_locally"] = self.messages_seen_locally
        values["messages_on_primary"] = self.messages_on_primary
        return values


@dataclass
class StatusReport:
    """Everything `harel-edge status` shows; the sections are the dicts of the functions above."""

    profile: str
    where: str
    schema_version: int
    queue: dict[str, Any]
    workflows: dict[str, Any] | None = None  # None: no durable workflow tables
    dead_letters: dict[str, Any] | None = None  # None: no dead-letter table
    replica: ReplicaStatus | None = None

    def as_dict(self) -> dict[str, Any]:
        """The --json output: absent sections are left out, not null."""
        values: dict[str, Any] = {
            "profile": self.profile,
            "where": self.where,
            "schema_version": self.schema_version,
            "queue": self.queue,
        }
        if self.workflows is not None:
            values["workflows"] = self.workflows
        if self.dead_letters is not None:
            values["dead_letters"] = self.dead_letters
        if self.replica is not None:
            values["replica"] = self.replica.as_dict()
        return values


def collect_status(settings: EdgeSettings, top: int = 10) -> StatusReport:
    """The queue, workflows, dead letters and a replica's lag, with reads only (a read-only
    token is enough); raises SchemaError when there are no harel_edge tables to report on."""
    from harel_edge.access import open_for_reading  # noqa: PLC0415 - access builds on this module

    replica: ReplicaStatus | None = None
    if settings.profile == "replica":
        last = last_sync_of_replica_file(settings.db_path)
        replica = ReplicaStatus(
            settings.db_path,
            None if last is None else datetime.fromtimestamp(last, UTC).isoformat(),
            None if last is None else max(0.0, time.time() - last),
        )
        local = inspect_file(settings.db_path)
        if local.exists and local.has_schema(settings.prefix):
            connection = open_read_only(settings.db_path)
            try:
                local_queue = queue_status(_runner(connection), settings.prefix, top=0)
                replica.messages_seen_locally = local_queue["totals"]["messages"]
            finally:
                connection.close()
    reader = open_for_reading(settings)
    try:
        facts = database_facts(reader.execute)
        check_usable(facts, settings.prefix, reader.where)
        if not facts.has_schema(settings.prefix):
            raise SchemaError(
                f"{reader.where} has no harel_edge tables with prefix {settings.prefix!r}: run `harel-edge migrate` "
                "or start a worker (or set HAREL_EDGE_PREFIX to the prefix the workers use)"
            )
        report = StatusReport(
            settings.profile,
            settings.server or settings.db_path,
            facts.user_version,
            queue_status(reader.execute, settings.prefix, top=top),
        )
        if "workflow_queue" in facts.tables:
            report.workflows = workflow_status(reader.execute)
        if schema.dead_letters_table(settings.prefix) in facts.tables:
            report.dead_letters = dead_letter_status(reader.execute, settings.prefix)
    finally:
        reader.close()
    if replica is not None:
        replica.messages_on_primary = report.queue["totals"]["messages"]
        report.replica = replica
    return report


# ---- doctor's checks ---------------------------------------------------------------------------

Level = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    """One of doctor's findings: what was checked, what was found, and what to do about it."""

    name: str
    level: Level
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


# Beyond these a skew is worth a warning / a failure. Leases are decided by the primary's clock,
# but harel's worker fires statechart timers and a workflow measures its sleeps by this one.
SKEW_WARN = 0.5
SKEW_FAIL = 5.0


def clock_skew(execute: Execute) -> tuple[float, float]:
    """(primary's clock minus this machine's, the round trip), both in seconds.

    This machine's time is the round trip's midpoint, so the error is at most half the round trip.
    """
    before = time.time()
    ((primary,),) = execute(f"SELECT {DB_NOW}")
    after = time.time()
    return float(primary) - (before + after) / 2, after - before


def skew_check(skew: float, rtt: float) -> Check:
    detail = f"the primary's clock is {skew:+.3f} s from this machine's (round trip {rtt * 1000:.1f} ms)"
    fix = (
        "synchronize this machine's clock (chrony, systemd-timesyncd or ntpd) with the primary's time source"
    )
    if abs(skew) > SKEW_FAIL:
        return Check("clock skew", "fail", detail, fix)
    if abs(skew) > SKEW_WARN:
        return Check("clock skew", "warn", detail, fix)
    return Check("clock skew", "ok", detail)


def schema_check(facts: DatabaseFacts, prefix: str) -> Check:
    found, wanted = facts.user_version, schema.SCHEMA_VERSION
    if found > wanted:
        return Check(
            "schema version",
            "fail",
            f"version {found}, newer than this harel_edge's {wanted}",
            "upgrade harel_edge on this machine; never point an older version at a newer database",
        )
    if not facts.has_schema(prefix):
        return Check(
            "schema version",
            "warn",
            f"no harel_edge tables with prefix {prefix!r} yet",
            "run `harel-edge migrate` (or start a worker, which migrates at start)",
        )
    if found < wanted:
        return Check(
            "schema version",
            "warn",
            f"version {found}, this harel_edge uses {wanted}",
            "run `harel-edge migrate` (idempotent, safe while workers run)",
        )
    return Check("schema version", "ok", f"version {found}")


def settings_summary(settings: EdgeSettings) -> str:
    where = settings.server or settings.db_path
    return f"profile {settings.profile} at {where}"


def write_access(execute: Execute, facts: DatabaseFacts, prefix: str) -> bool | None:
    """Whether the credentials may write, found with a write that changes nothing; None when no table to aim at.

    Raises what is not an authorization failure; after a refusal a remote caller must reopen (docs/operations.md).
    """
    if not facts.has_schema(prefix):
        return None
    try:
        execute(f"DELETE FROM {EdgeNames(prefix).messages} WHERE 0")
    except ValueError as exc:
        text = str(exc).lower()
        if "403" in text or "forbidden" in text or "permissiondenied" in text.replace(" ", ""):
            return False
        raise
    return True


def tidy(text: str) -> str:
    """A driver message without the gRPC metadata dump a replica's errors carry."""
    for marker in (", details: [", " details: [", ", metadata: MetadataMap"):
        cut = text.find(marker)
        if cut != -1:
            text = text[:cut] + "`"
    return text


def raise_missing(path: str) -> None:
    raise SchemaError(
        f"no database at {path}: start a worker or run `harel-edge migrate` to create it "
        "(or set HAREL_EDGE_DB_PATH to the file the workers use)"
    )
