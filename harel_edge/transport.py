"""LibsqlTransport: harel's per-group queue on a local file, a sqld server or a replica, every
operation one statement decided by the database's clock, ambiguous writes looked up by token.
See docs/transport.md for the design and why each operation is one statement."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.transport import Lease
from harel.spec.states import Event
from pydantic_core import from_json

from harel_edge import observability, retry, schema
from harel_edge.connection import EdgeConnection
from harel_edge.errors import SchemaError
from harel_edge.ids import refuse_nul
from harel_edge.schema import DB_NOW, PARKED, EdgeNames, now_or
from harel_edge.settings import EdgeSettings, settings_for_database

log = structlog.get_logger("harel_edge.transport")

Clock = Callable[[], float]
MAX_PRIORITY = 4
# Rows per multi-row INSERT of a batch publish: 4 parameters a row stays far below SQLite's
# 32,766 bound variables, and one statement (a few hundred KB) stays one modest HTTP request.
BATCH_ROWS = 2000

# `now` is bound as a parameter: None means the database's clock.
_NOW = now_or()


@dataclass(frozen=True)
class Message:
    """One message of a batch publish."""

    group_id: str
    event: Event
    priority: int = 0
    routing_key: str | None = None


def claim_sql(n: EdgeNames, routing_keys: int, *, many: bool = False, returning: str = "") -> str:
    """The claim in one statement: the spec's selection and its lease (`many`: up to `?` groups'
    heads). Parameters: token, now, visibility, min_priority, *routing_keys, now[, n]. Its cost
    is flat in the groups waiting (docs/transport.md, "The claim's cost")."""
    keys = [f"?{5 + i}" for i in range(routing_keys)]
    now, limit = now_or(f"?{5 + routing_keys}"), f"?{6 + routing_keys}" if many else "1"
    # INDEXED BY: a walk must never become a scan in last-claim order, whatever the statistics.
    index = n.routing_index if keys else n.free_index
    head = f"JOIN {n.messages} m ON m.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = g.group_id)"
    free = f"(m.locked_by IS NULL OR m.lock_expiry < {now})"
    order = f"ORDER BY g.last_claimed_at, g.rowid LIMIT {limit}"
    # The priorities from the floor to 4, and the keys (UNION: a key given twice counts once).
    ctes = "pr(p) AS (SELECT MAX(?4, 0) WHERE ?4 <= 4 UNION ALL SELECT p + 1 FROM pr WHERE p < 4)"
    source, of_key = "pr", ""
    if keys:
        ctes += f", ks(k) AS ({' UNION '.join(f'SELECT {key}' for key in keys)})"
        source, of_key = "pr CROSS JOIN ks", " AND g.routing_key = ks.k"
    # No LATERAL in SQLite: each (priority, key)'s walk is a correlated IN subquery.
    walks = (
        f"SELECT g.last_claimed_at AS c, g.rowid AS r, m.seq AS seq FROM {source} CROSS JOIN {n.groups} g {head}"
        f" WHERE g.rowid IN (SELECT g.rowid FROM {n.groups} g INDEXED BY {index} {head}"
        f" WHERE g.claimable_at IS NULL AND g.priority = pr.p{of_key} AND {free} {order})"
    )
    # The groups whose lease or park has ended (few: each claim frees those it finds), and
    # those of a priority above 4 (none unless harel's own publish wrote one). Two walks, not an
    # OR, which the planner may turn into a scan of every group of the key.
    others = " UNION ALL ".join(
        f"SELECT * FROM (SELECT g.last_claimed_at AS c, g.rowid AS r, m.seq AS seq"
        f" FROM {'ks CROSS JOIN ' if keys else ''}{n.groups} g INDEXED BY {index} {head}"
        f" WHERE {which}{of_key} AND g.priority >= MAX(?4, 0) AND {free} {order})"
        for which in (f"g.claimable_at < {now}", f"g.claimable_at IS NULL AND g.priority > {MAX_PRIORITY}")
    )
    claim_now = f"COALESCE(?2, {DB_NOW})"
    return (
        f"UPDATE {n.messages} SET locked_by = ?1, claimed_at = {claim_now}, lock_expiry = {claim_now} + ?3"
        f" WHERE seq IN (WITH RECURSIVE {ctes}"
        f" SELECT seq FROM ({walks} UNION ALL {others}) ORDER BY c, r LIMIT {limit})"
        f" RETURNING seq, group_id, event{returning}"
    )


def publish_statement(
    n: EdgeNames, chunk: list[tuple], now: float | None, keep_for: float, batch: str
) -> tuple[str, tuple]:
    """One multi-row INSERT into the publish view for `chunk` (rows from `message_row`); its
    trigger skips an event id the group had within `keep_for` seconds. Plain `?`s: numbered
    ones (`?12`) cost the driver 114 ms instead of 20 for 2,000 rows."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
    sql = (
        f"INSERT INTO {n.publish_once_view} (group_id, event, priority, routing_key, event_id, now, keep_for, batch)"
        f" VALUES {values}"
    )
    return sql, tuple(value for row in chunk for value in (*row, now, keep_for, batch))


def published_sql(n: EdgeNames) -> str:
    """The batch token recorded for (group_id, event_id): after an ambiguous publish, its own
    token means it landed (the batch is atomic); anything else, try again, which the view makes
    harmless for the rows that did land before."""
    return f"SELECT batch FROM {n.published} WHERE group_id = ? AND event_id = ?"


def claim_params(
    worker_id: str, visibility: float, min_priority: int, keys: Sequence[str], now: float | None
) -> tuple[str, tuple]:
    """A fresh claim token and the claim statement's parameters; refuses bad arguments."""
    if not visibility > 0:
        raise ValueError(f"visibility must be a positive number of seconds, got {visibility!r}")
    if not worker_id or "#" in worker_id:
        raise ValueError(f"worker_id must be a non-empty name without '#', got {worker_id!r}")
    token = f"{worker_id}#{secrets.token_hex(8)}"
    return token, (token, now, visibility, min_priority, *keys, now)


class LibsqlTransport:
    """The harel `Transport` on libSQL. Not thread-safe: one caller at a time (the async twin
    serializes its calls; a threaded program gives each thread its own transport)."""

    def __init__(
        self,
        database: str | Path = ":memory:",
        clock: Clock | None = None,
        *,
        auth_token: str = "",
        sync_url: str | None = None,
        sync_interval: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        create_schema: bool = True,
        routing_keys: Sequence[str] = (),
        settings: EdgeSettings | None = None,
        connection: EdgeConnection | None = None,
    ) -> None:
        """`database` is a file (local), a server URL (sqld), or the replica's file with
        `sync_url` (replica). Or pass `settings` (see `from_settings`) or an open `connection`.
        `clock=None` uses the database's clock; inject one only in tests."""
        if connection is not None:
            settings = connection.settings
        elif settings is None:
            settings = settings_for_database(database, auth_token, sync_url, sync_interval, prefix, routing_keys)
        self.settings = settings
        self._n = EdgeNames(settings.prefix)
        self._clock = clock
        self._routing_keys = tuple(routing_keys or settings.routing_keys)
        self._conn = connection if connection is not None else EdgeConnection(settings)
        self._claim_sql: dict[int, str] = {}
        try:
            if create_schema:
                self._with_retry("migrate", lambda: schema.migrate(self._conn.execute, settings.prefix))
            else:
                self._check_schema()
        except BaseException:
            if connection is None:
                self._conn.close()
            raise

    @classmethod
    def from_settings(cls, settings: EdgeSettings | None = None, clock: Clock | None = None) -> LibsqlTransport:
        """The transport the settings describe (`EdgeSettings.load()` when none are given)."""
        return cls(settings=settings or EdgeSettings.load(), clock=clock)

    def __repr__(self) -> str:
        return f"<LibsqlTransport prefix={self.settings.prefix} {self._conn!r}>"

    @property
    def connection(self) -> EdgeConnection:
        return self._conn

    # ---- publish ---------------------------------------------------------------------------

    def publish(
        self, group_id: str, event: Event, priority: int = 0, routing_key: str | None = None
    ) -> None:
        """Append `event` to `group_id`'s FIFO. The group's first publish fixes its priority and
        routing key; later ones keep what the group has."""
        self.publish_many([Message(group_id, event, priority, routing_key)])

    def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        """Publish many events, in order, all or none (one statement up to `BATCH_ROWS`, else one
        transaction), each checked before anything is sent; an event its group had within the
        publish window is not queued again. Returns the count."""
        rows = [message_row(item) for item in messages]
        if not rows:
            return 0
        batch = secrets.token_hex(8)
        now = self._clock() if self._clock is not None else None
        stmts = [
            publish_statement(self._n, rows[i : i + BATCH_ROWS], now, self.settings.publish_window, batch)
            for i in range(0, len(rows), BATCH_ROWS)
        ]

        def attempt() -> bool:
            if len(stmts) == 1:
                self._conn.execute(*stmts[0])
            else:
                self._transaction(stmts)
            return True

        self._with_retry("publish", attempt, resolve=lambda: self._published(rows[0], batch))
        return len(rows)

    def _transaction(self, stmts: list[tuple[str, tuple]]) -> None:
        """One transaction, abandoned at the first error: through a replica, a statement after a
        failed one would run outside the (silently dropped) transaction."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in stmts:
                self._conn.execute(sql, params)
            self._conn.execute("COMMIT")
        except BaseException:
            try:
                self._conn.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def _published(self, row: tuple, batch: str) -> bool | None:
        """Whether an ambiguous publish landed (see `published_sql`)."""
        found = self._conn.execute(published_sql(self._n), (row[0], row[4]))
        return True if found and found[0][0] == batch else None

    # ---- claim -----------------------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        routing_keys: Sequence[str] | None = None,
    ) -> Lease | None:
        """Lease the head of the group that waited longest, among groups with nothing in flight,
        priority >= `min_priority` and (if any are given) one of `routing_keys`; None if none."""
        keys = tuple(self._routing_keys if routing_keys is None else routing_keys)
        sql = self._claim_sql.get(len(keys))
        if sql is None:
            sql = self._claim_sql[len(keys)] = claim_sql(self._n, len(keys))
        now = self._clock() if self._clock is not None else None
        token, params = claim_params(worker_id, visibility, min_priority, keys, now)

        def attempt() -> Lease | None:
            with self._conn.skip_fsync():
                rows = self._conn.execute(sql, params)
            return lease_from_row(rows[0], token) if rows else None

        return self._with_retry("claim", attempt, resolve=lambda: self._leased(token))

    def _leased(self, token: str) -> Lease | None:
        rows = self._conn.execute(
            f"SELECT seq, group_id, event FROM {self._n.messages} WHERE locked_by = ?", (token,)
        )
        return lease_from_row(rows[0], token) if rows else None

    # ---- ack / nack ------------------------------------------------------------------------

    def ack(self, lease: Lease) -> bool:
        """Remove the delivered message, freeing its group. False (and a log line) when the lease
        was lost: it lapsed and another worker holds the message now, which keeps it."""
        fence, params = self._fence(lease)
        deleted = self._with_retry(
            "ack",
            lambda: bool(self._conn.execute(f"DELETE FROM {self._n.messages} WHERE {fence} RETURNING seq", params)),
            resolve=lambda: self._settled(lease, done_if_gone=True),
        )
        if not deleted:
            return self._report_lost(lease, "ack")
        return True

    def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        """Give the message back: claimable at once (`delay=0`), or parked for `delay` seconds,
        during which its group stays blocked. False when the lease was already lost."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        fence, params = self._fence(lease)
        if delay > 0:
            now = self._clock() if self._clock is not None else None
            sql = f"UPDATE {self._n.messages} SET locked_by = ?, lock_expiry = {_NOW} + ? WHERE {fence} RETURNING seq"
            args: tuple = (PARKED, now, delay, *params)
        else:
            sql = f"UPDATE {self._n.messages} SET locked_by = NULL, lock_expiry = NULL WHERE {fence} RETURNING seq"
            args = tuple(params)
        done = self._with_retry(
            "nack", lambda: bool(self._conn.execute(sql, args)), resolve=lambda: self._settled(lease, done_if_gone=False)
        )
        if not done:
            return self._report_lost(lease, "nack")
        return True

    def _fence(self, lease: Lease) -> tuple[str, tuple]:
        # A lease made by this transport carries its token; one made elsewhere (harel's own
        # transport on a shared file) has only its seq to go by, as harel itself does.
        if lease.token:
            return "seq = ? AND locked_by = ?", (lease.seq, lease.token)
        return "seq = ?", (lease.seq,)

    def _settled(self, lease: Lease, *, done_if_gone: bool) -> bool | None:
        """After an ambiguous ack or nack: None if the row still carries this lease's token (try
        again), else whether the write landed (docs/transport.md, "Ambiguous writes")."""
        rows = self._conn.execute(f"SELECT locked_by FROM {self._n.messages} WHERE seq = ?", (lease.seq,))
        if not rows:
            return done_if_gone
        if lease.token and rows[0][0] == lease.token:
            return None
        return not done_if_gone

    def _report_lost(self, lease: Lease, operation: str) -> bool:
        observability.record_lost_lease(operation)
        log.warning("lost lease", operation=operation, group_id=lease.group_id, seq=lease.seq)
        return False

    # ---- inspection ------------------------------------------------------------------------

    def depth(self) -> int:
        """Messages in the queue, in flight and parked included."""
        return int(self._conn.execute(f"SELECT count(*) FROM {self._n.messages}")[0][0])

    def close(self) -> None:
        self._conn.close()

    # ---- internals -------------------------------------------------------------------------

    def _with_retry(self, operation: str, attempt: Callable[[], Any], resolve: Callable[[], Any] | None = None) -> Any:
        return retry.call_with_retry(self.settings, operation, attempt, recover=self._recover, resolve=resolve)

    def _recover(self, exc: BaseException) -> None:
        """Make the next attempt (and the look-up before it) see the primary as it is."""
        self._conn.recover(exc)

    def _check_schema(self) -> None:
        check_schema(self._conn.execute, self.settings.prefix)

    @property
    def clock(self) -> Clock | None:
        """The injected clock, or None for the database's."""
        return self._clock


def check_schema(execute: schema.Execute, prefix: str) -> None:
    """Refuse a database whose transport schema is newer than this code, or not yet upgraded."""
    schema.refuse_newer(schema.read_version(execute))
    if not schema.has_routing_key(execute, prefix):
        raise SchemaError(
            f"{EdgeNames(prefix).groups} is missing or predates routing keys, and create_schema=False: run "
            "`harel-edge migrate` (or `harel-edge migrate --print-sql` for your migration tool)"
        )


def message_row(item: Message | tuple) -> tuple:
    message = item if isinstance(item, Message) else Message(*item)
    priority = message.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be a whole number from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not isinstance(message.group_id, str) or not message.group_id:
        raise ValueError(f"group_id must be a non-empty string, got {message.group_id!r}")
    refuse_nul(message.group_id, "group_id")
    refuse_nul(message.routing_key, "routing_key")
    if not isinstance(message.event, Event):
        raise TypeError(f"event must be a harel Event, got {type(message.event).__name__}")
    return (message.group_id, message.event.model_dump_json(), priority, message.routing_key, str(message.event.id))


def lease_from_row(row: tuple, token: str) -> Lease:
    seq, group_id, event = row
    # Not model_validate_json: it caches the strings it parses, and every event id is new, so a
    # long-running worker's heap would grow with that cache. from_json without it is as fast.
    return Lease(int(seq), group_id, Event.model_validate(from_json(event, cache_strings=False)), token=token)
