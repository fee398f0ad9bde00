"""Open a libsql connection for a profile, configured for what the profile can promise.

One place decides how each profile talks to its data (docs/profiles.md); retrying is `retry.py`'s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The driver's Rust tracing prints INFO lines to stdout and reads RUST_LOG once, at import: quiet it
# unless the user asked for something.
os.environ.setdefault("RUST_LOG", "error")

import libsql  # noqa: E402

from harel_edge import retry
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    DamagedDatabaseError,
    DatabaseAccessError,
    NotADatabaseError,
    PrimaryUnavailableError,
)
from harel_edge.executor.base import Stmt
from harel_edge.loop_thread import LoopThread
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

Rows = list[tuple]



class EdgeConnection:
    """One libsql connection to a file on this machine: a local database or an embedded replica.

    A primary is reached over Hrana (the executors), never through the driver's own remote client.
    Not thread-safe: a transaction belongs to the connection, so sharers serialize their callers.
    """

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings.one_database()
        if not settings.has_file:
            raise ConfigurationError(
                "EdgeConnection opens a local file or an embedded replica's file; a sqld or Turso primary is "
                "reached over Hrana: use LibsqlTransport, EdgeStore, or harel_edge.sync_sql.Statements"
            )
        self.profile: str = settings.profile
        self.last_sync_at: float | None = None
        self.last_sync_error: str | None = None
        self._raw: Any = None
        self._closed = False
        self._replica_file = _claim_replica_file(settings) if settings.syncs else None
        # A replica cannot even be opened while its primary is down, and a
        # worker usually starts with its primary: open under the retry policy, so both may start
        # in any order. Refused credentials and bad paths are permanent and fail at once.
        try:
            retry.call_with_retry(settings, "connect", self._start)
        except BaseException:
            self._release_replica_file()
            raise

    _wal_of: Any = None  # the driver connection `_wal` was read on
    _wal = False

    def _start(self) -> None:
        if self._raw is None:
            self._raw = _open(self.settings)
        if self.settings.syncs:
            self._first_sync()

    def _first_sync(self) -> None:
        """Sync at start; on failure, ask the primary once whether the token was refused, since a replica's
        sync reports a bad token like an unreachable primary (docs/operations.md, "The token is refused").
        """
        try:
            self.sync()
        except Exception as exc:
            raise _probe_primary(self.settings) or exc from None

    def __repr__(self) -> str:  # never the token
        where = self.settings.server or self.settings.db_path
        return f"<EdgeConnection profile={self.profile} at {where}>"

    @property
    def raw(self) -> Any:
        """The driver's connection, for code that needs a driver feature this class lacks."""
        return self._raw

    @property
    def is_remote(self) -> bool:
        """True for an embedded replica, whose writes would travel to its primary."""
        return self.settings.syncs

    def execute(self, sql: str, params: tuple | list = ()) -> Rows:
        """Run one statement and return every row it produced (RETURNING rows included)."""
        if self._raw is None:
            self._reconnect()
        cursor = self._raw.execute(sql, tuple(params))
        return cursor.fetchall() if cursor.description else []

    @property
    def in_transaction(self) -> bool:
        return bool(self._raw is not None and self._raw.in_transaction)

    @contextmanager
    def skip_fsync(self) -> Iterator[None]:
        """For commits that only a power cut may undo, harmlessly (a lease dies with every process
        that could hold it): on a local file at full durability they skip their fsync; a crash
        of the process still loses nothing (docs/transport.md, "Leases and fsync")."""
        if self.settings.has_primary or self.settings.durability != "full" or self._raw is None or self.in_transaction:
            yield
            return
        # Outside WAL (a file or VFS where WAL could not be enabled), NORMAL risks more than the lease.
        # Asked once a connection: nobody can take a file out of WAL while a connection has it open.
        if self._wal_of is not self._raw:
            self._wal = self._raw.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
            self._wal_of = self._raw
        if not self._wal:
            yield
            return
        try:  # an interrupt just after NORMAL is set still restores FULL
            self._raw.execute("PRAGMA synchronous=NORMAL")
            yield
        finally:
            self._restore_fsync()

    def _restore_fsync(self) -> None:
        """Back to full durability, whatever the commit left behind; a connection that cannot be
        set back is replaced (a new one starts at full)."""
        if self._raw is None:
            return
        try:
            if self._raw.in_transaction:  # a failed commit that could not roll back
                self._raw.execute("ROLLBACK")
            self._raw.execute("PRAGMA synchronous=FULL")
        except Exception:  # noqa: BLE001 - never left at NORMAL: a fresh connection instead
            self.reopen()

    def sync(self) -> None:
        """Pull the primary's changes into the embedded replica; nothing to do elsewhere."""
        if not self.settings.syncs:
            return
        if self._raw is None:
            self._reconnect()
            return  # opening a replica syncs it
        try:
            self._raw.sync()
        except Exception as exc:
            self.last_sync_error = str(exc)
            raise
        self.last_sync_at = time.time()
        self.last_sync_error = None

    def recover(self, error: BaseException) -> None:
        """Make the connection usable again after a transient `error`, before anything else is
        sent: a dead link is replaced, a transaction left open rolled back, a replica synced."""
        if self._raw is None or retry.needs_reopen(error):
            self.reopen()
            return
        if self._raw.in_transaction:
            try:
                self._raw.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - a connection that cannot roll back is replaced
                self.reopen()
                return
        self.sync()

    def reopen(self) -> None:
        """Replace a connection left unusable by a broken link (libsql does not recover one)."""
        old, self._raw = self._raw, None
        if old is not None:
            try:
                old.close()
            except Exception:  # noqa: BLE001 - the old one is broken; closing it is a courtesy
                pass
        self._reconnect()

    def _reconnect(self) -> None:
        """Open a new driver connection. If that fails (the primary is still away), the next
        `execute` or `sync` tries again, so a retry loop can outlast an outage."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        self._raw = _open(self.settings)
        if self.settings.syncs:
            self.sync()

    def close(self) -> None:
        self._closed = True
        raw, self._raw = self._raw, None  # dropped even if its close fails: only that stops a replica's syncs
        try:
            if raw is not None:
                raw.close()
        finally:
            self._release_replica_file()

    def _release_replica_file(self) -> None:
        if self._replica_file is not None:
            with _REPLICA_FILES_LOCK:
                _REPLICA_FILES.discard(self._replica_file)
            self._replica_file = None


# The embedded replica files this process has open: two replicas of one file in one process
# corrupt it ("database disk image is malformed"), so a second is refused before it is opened.
_REPLICA_FILES: set[str] = set()
_REPLICA_FILES_LOCK = threading.Lock()


def _claim_replica_file(settings: EdgeSettings) -> str:
    path = os.path.realpath(Path(settings.db_path).expanduser())
    with _REPLICA_FILES_LOCK:
        if path in _REPLICA_FILES:
            raise ConfigurationError(
                f"{settings.db_path} is already open as an embedded replica in this process, and two replicas "
                "of one file corrupt it: share that EdgeConnection, or give this one its own HAREL_EDGE_DB_PATH "
                "(LibsqlTransport and EdgeStore never open the file: they speak to the primary)"
            )
        _REPLICA_FILES.add(path)
    return path


def connect(settings: EdgeSettings | None = None, **overrides: Any) -> EdgeConnection:
    """Open the profile's connection: `connect()` reads the environment; keywords override it."""
    if settings is None:
        settings = EdgeSettings.load(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    return EdgeConnection(settings)


def local_pragmas(settings: EdgeSettings) -> list[str]:
    """What makes a local file durable rather than merely persistent (see the module doc)."""
    return [
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={settings.durability.upper()}",
        f"PRAGMA busy_timeout={settings.busy_timeout_ms}",
    ]


def _open(settings: EdgeSettings) -> Any:
    token = settings.auth_token.get_secret_value() if settings.auth_token else ""
    base: dict[str, Any] = {"isolation_level": None, "_check_same_thread": False}
    try:
        if settings.syncs:
            Path(settings.db_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs = dict(base, sync_url=settings.sync_url, auth_token=token)
            if settings.sync_interval is not None:
                kwargs["sync_interval"] = settings.sync_interval
            return libsql.connect(str(Path(settings.db_path).expanduser()), **kwargs)
        path = settings.db_path
        if path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            path = str(Path(path).expanduser())
        conn = libsql.connect(path, timeout=settings.busy_timeout_ms / 1000, **base)
        for pragma in local_pragmas(settings):
            conn.execute(pragma).fetchall()
        return conn
    except Exception as exc:
        raise explain_connect_error(settings, exc) from None


async def primary_answers(settings: EdgeSettings) -> None:
    """Ask a replica's primary a `SELECT 1` over Hrana, off the driver (which holds the GIL while it
    waits): `AuthError` when it refuses the token, `PrimaryUnavailableError` when it cannot be reached."""
    from harel_edge.executor.remote import HranaExecutor  # noqa: PLC0415 - aiohttp, for replicas only

    primary = HranaExecutor(settings.model_copy(update={"profile": "sqld", "url": settings.sync_url, "sync_url": None}))
    try:
        await primary.execute(Stmt("SELECT 1"))
    finally:
        await primary.aclose()


def _probe_primary(settings: EdgeSettings) -> Exception | None:
    """Why a replica could not sync, asked of its primary: an `AuthError` or a
    `PrimaryUnavailableError` (`primary_answers`), None when it answers."""
    bridge = LoopThread("harel-edge-probe")
    try:
        bridge.call(primary_answers(settings))
    except (AuthError, PrimaryUnavailableError) as exc:
        return exc
    except Exception:  # noqa: BLE001 - the primary answered: the sync's own error is the one to report
        return None
    finally:
        bridge.stop()
    return None


def explain_connect_error(settings: EdgeSettings, exc: BaseException) -> Exception:
    """Turn the driver's terse message into one that says what to do, without the token."""
    text = str(exc)
    lowered = text.lower()
    where = settings.server or settings.db_path
    # The file on this machine, not the primary's answer to a delegated write or a Hrana request.
    local = settings.has_file and not any(w in lowered for w in ("delegation", "hrana", "status:"))
    if "malformed" in lowered and "not a database" not in lowered and not local:
        return NotADatabaseError(
            f"the primary at {where} reports its database damaged ({scrub(text, settings.auth_token)}): restore "
            "the primary's database from a backup"
        )
    if "malformed" in lowered and "not a database" not in lowered:
        return DamagedDatabaseError(
            f"{settings.db_path} is damaged ({text}): run `harel-edge doctor` to see where, and restore "
            "it from a backup (a replica's file: move it and its -wal, -shm, -client_wal_index files "
            "aside and let it re-sync)",
            text,
        )
    if local and (isinstance(exc, PermissionError) or "readonly database" in lowered):
        return DatabaseAccessError(
            f"{settings.db_path} cannot be written by this user ({text}): make the file and its "
            "directory writable for the user the workers run as (chmod u+w, or chown them to that "
            "user), or set HAREL_EDGE_DB_PATH to a writable place"
        )
    if local and (
        isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError))
        or "unable to open" in lowered
    ):
        return DatabaseAccessError(
            f"cannot open {settings.db_path} ({text}): check that HAREL_EDGE_DB_PATH names a file in "
            "an existing directory that the user the workers run as may write"
        )
    if "file is not a database" in lowered or "not a database" in lowered:
        return NotADatabaseError(
            f"{settings.db_path} is not a SQLite/libSQL database ({text}): point HAREL_EDGE_DB_PATH "
            "at a harel_edge database or a new file; the file was left untouched"
        )
    if any(word in lowered for word in ("401", "403", "unauthorized", "forbidden", "jwt", "auth")):
        return AuthError(
            f"the primary at {where} refused the credentials ({scrub(text, settings.auth_token)}): set "
            "HAREL_EDGE_AUTH_TOKEN to a valid read-write token for this database"
        )
    if any(
        word in lowered
        for word in (
            "connection refused",
            "connect error",
            "dns",
            "timed out",
            "error trying to connect",
            "tcp connect",
            "hyper",
            "no route",
            "unreachable",
            "sync error",
            "connection reset",
        )
    ):
        return PrimaryUnavailableError(
            f"cannot reach the primary at {where} ({scrub(text, settings.auth_token)}): check that it runs and "
            "that HAREL_EDGE_URL / HAREL_EDGE_SYNC_URL is its HTTP address"
        )
    return exc if isinstance(exc, Exception) else RuntimeError(text)
