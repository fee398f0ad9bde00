"""What harel_edge creates in a database, version by version, and the reads that look at it.

The order and the once-only application are migrations.py's; why each object exists: docs/transport.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harel_edge.schema_harel import DEFAULT_PREFIX, check_prefix

# A new row's first bump starts at a random number below 2**52, so a delivery from before a
# delete cannot match the row made again (docs/durable.md, "Receipts cannot collide").
QUEUE_BUMP = "CASE generation WHEN 0 THEN (random() & 4503599627370495) + 1 ELSE generation + 1 END"

PARKED = "__parked__"  # harel's sentinel `locked_by` for a message parked by nack(delay > 0)

# The database's clock in epoch seconds, rounded to SQLite's millisecond; why not unixepoch():
# docs/consistency.md ("Whose clock").
DB_NOW = "(round((julianday('now') - 2440587.5) * 86400000.0) / 1000.0)"


def is_free(m: str, now: str) -> str:
    """SQL: message `m` (an alias) may be claimed at `now`: never leased, or its lease (or a
    delayed or parked message's wait) ran out."""
    return f"({m}.locked_by IS NULL OR {m}.lock_expiry < {now})"


def lease_state(m: str, now: str) -> str:
    """SQL, the one rule for where message `m` stands at `now`: 'queued' (free to claim),
    'parked' (held until its time: delayed, debounced or given back with a delay) or 'in_flight'."""
    return f"(CASE WHEN {is_free(m, now)} THEN 'queued' WHEN {m}.locked_by = '{PARKED}' THEN 'parked' ELSE 'in_flight' END)"


def now_or(param: str = "?") -> str:
    """The injected time bound at `param`, or the database's own clock when it is NULL."""
    return f"COALESCE({param}, {DB_NOW})"


def now_table(param: str | None = None) -> str:
    """`(SELECT ... AS now) AS t`: one "now" for the whole statement (see `now_or`)."""
    return f"(SELECT {now_or(param) if param else DB_NOW} AS now) AS t"


@dataclass(frozen=True)
class EdgeNames:
    """The names of what harel_edge creates under `prefix`, harel's own tables among them."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def messages(self) -> str:
        return f"{self.prefix}_transport_messages"

    @property
    def groups(self) -> str:
        return f"{self.prefix}_transport_groups"

    @property
    def publish_view(self) -> str:
        return f"{self.prefix}_transport_publish"

    @property
    def publish_once_view(self) -> str:
        return f"{self.prefix}_transport_publish_once"

    @property
    def published(self) -> str:
        return f"{self.prefix}_transport_published"

    @property
    def workers(self) -> str:
        return f"{self.prefix}_transport_workers"

    @property
    def doorbell(self) -> str:
        return f"{self.prefix}_doorbell"

    @property
    def claim_trigger(self) -> str:
        return f"{self.prefix}_transport_on_claim_v6"

    @property
    def lock_trigger(self) -> str:
        return f"{self.prefix}_transport_on_lock"

    @property
    def settle_trigger(self) -> str:
        return f"{self.prefix}_transport_on_settle"

    @property
    def drain_trigger(self) -> str:
        return f"{self.prefix}_transport_on_drain"

    @property
    def free_index(self) -> str:
        return f"{self.prefix}_transport_groups_by_claimable"

    @property
    def routing_index(self) -> str:
        return f"{self.prefix}_transport_groups_by_key_claimable"


def dead_letters_table(prefix: str = DEFAULT_PREFIX) -> str:
    """The table of messages and workflows taken out of the way after failing too often."""
    return f"{EdgeNames(prefix).prefix}_dead_letters"


# ---- version 5 ---------------------------------------------------------------------------------


def routing_v5(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Routing keys, and the triggers that make publish and ack one statement each."""
    n = EdgeNames(prefix)
    return [
        f"ALTER TABLE {n.groups} ADD COLUMN routing_key TEXT",
        f"CREATE INDEX {n.prefix}_transport_groups_by_routing_key ON {n.groups} (routing_key, last_claimed_at)",
        # Never returns rows: it exists to be inserted into. Its columns are a publish's inputs.
        f"CREATE VIEW {n.publish_view} AS"
        f" SELECT m.group_id, m.event, g.priority, g.routing_key"
        f" FROM {n.messages} m JOIN {n.groups} g ON g.group_id = m.group_id WHERE 0",
        # The group row first: a message is only claimable through its group, so a message
        # whose group row were missing would be stranded. Both happen in the one statement.
        f"CREATE TRIGGER {n.publish_view} INSTEAD OF INSERT ON {n.publish_view} BEGIN"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key)"
        f" VALUES (NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key);"
        f" INSERT INTO {n.messages} (group_id, event) VALUES (NEW.group_id, NEW.event);"
        f" END",
        # Version 6 replaces it: it stamped a claimed group with its lease's deadline.
        f"CREATE TRIGGER {n.prefix}_transport_on_claim AFTER UPDATE OF locked_by ON {n.messages}"
        f" WHEN NEW.locked_by IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET last_claimed_at = NEW.lock_expiry WHERE group_id = NEW.group_id;"
        f" END",
        f"CREATE TRIGGER {n.drain_trigger} AFTER DELETE ON {n.messages} BEGIN"
        f" DELETE FROM {n.groups} WHERE group_id = OLD.group_id"
        f" AND NOT EXISTS (SELECT 1 FROM {n.messages} WHERE group_id = OLD.group_id);"
        f" END",
    ]


def claim_times_v6(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Round-robin by claim time, and a claim flat in the groups in flight: when a group's head
    is next claimable (NULL: now), filled in from each head's lock, and a message's claim time."""
    n = EdgeNames(prefix)
    return [
        f"ALTER TABLE {n.groups} ADD COLUMN claimable_at REAL",
        f"ALTER TABLE {n.messages} ADD COLUMN claimed_at REAL",
        f"UPDATE {n.groups} SET claimable_at = (SELECT m.lock_expiry FROM {n.messages} m"
        f" WHERE m.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = {n.groups}.group_id)"
        f" AND m.locked_by IS NOT NULL)",
        # The claim walks free groups (claimable_at IS NULL) of one priority (and one key) in
        # round-robin order, and groups whose lease or park has ended by claimable_at.
        f"CREATE INDEX {n.free_index} ON {n.groups} (claimable_at, priority, last_claimed_at)",
        f"CREATE INDEX {n.routing_index} ON {n.groups} (routing_key, claimable_at, priority, last_claimed_at)",
        f"DROP INDEX {n.prefix}_transport_groups_by_routing_key",
        # A claim (only harel_edge's sets claimed_at) stamps its group with the claim time, as
        # the spec's round-robin says, and with its lease's end; and frees (claimable_at NULL)
        # the groups whose lease or park has ended since, each once, so that the claim's walk of
        # those stays short.
        f"DROP TRIGGER {n.prefix}_transport_on_claim",
        f"CREATE TRIGGER {n.claim_trigger} AFTER UPDATE OF claimed_at ON {n.messages}"
        f" WHEN NEW.claimed_at IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET last_claimed_at = NEW.claimed_at, claimable_at = NEW.lock_expiry"
        f" WHERE group_id = NEW.group_id;"
        f" UPDATE {n.groups} SET claimable_at = NULL WHERE claimable_at < NEW.claimed_at;"
        f" END",
        # Any other lock change (a park, a give-back, harel's own claim, which stamps
        # last_claimed_at itself) moves only claimable_at; a park leaves the last claim as it was.
        f"CREATE TRIGGER {n.lock_trigger} AFTER UPDATE OF locked_by, lock_expiry ON {n.messages}"
        f" WHEN NEW.claimed_at IS OLD.claimed_at BEGIN"
        f" UPDATE {n.groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN NULL ELSE NEW.lock_expiry END"
        f" WHERE group_id = NEW.group_id;"
        f" END",
        # A held head deleted (an ack): the group's next head is free.
        f"CREATE TRIGGER {n.settle_trigger} AFTER DELETE ON {n.messages}"
        f" WHEN OLD.locked_by IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET claimable_at = NULL WHERE group_id = OLD.group_id;"
        f" END",
    ]


def publish_once_v6(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """A publish idempotent on (group, event id) within the publish window."""
    n = EdgeNames(prefix)
    seen = f"(SELECT 1 FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id)"
    at = f"COALESCE(NEW.now, {DB_NOW})"
    return [
        # The event ids each group was sent, kept until `expires_at` (the publish's window).
        f"CREATE TABLE {n.published} ("
        " group_id TEXT NOT NULL,"
        " event_id TEXT NOT NULL,"
        " published_at REAL NOT NULL,"
        " expires_at REAL NOT NULL,"
        " batch TEXT,"  # the publish call's token: how a retry tells its own landed publish
        " PRIMARY KEY (group_id, event_id)) WITHOUT ROWID",
        f"CREATE INDEX {n.published}_by_expiry ON {n.published} (expires_at)",
        f"CREATE VIEW {n.publish_once_view}"
        " (group_id, event, priority, routing_key, event_id, now, keep_for, batch)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        # A publish whose event id its group had within the window writes nothing, so a retry
        # of an ambiguous publish cannot queue the event again, even after it was consumed.
        # An expired record of the id is forgotten first, and two more expired ones pruned.
        f"CREATE TRIGGER {n.publish_once_view} INSTEAD OF INSERT ON {n.publish_once_view} BEGIN"
        f" DELETE FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id"
        f" AND expires_at <= {at};"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key)"
        f" SELECT NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key WHERE NOT EXISTS {seen};"
        f" INSERT INTO {n.messages} (group_id, event) SELECT NEW.group_id, NEW.event WHERE NOT EXISTS {seen};"
        f" INSERT OR IGNORE INTO {n.published} (group_id, event_id, published_at, expires_at, batch)"
        f" VALUES (NEW.group_id, NEW.event_id, {at}, {at} + NEW.keep_for, NEW.batch);"
        f" DELETE FROM {n.published} WHERE (group_id, event_id) IN (SELECT group_id, event_id"
        f" FROM {n.published} WHERE expires_at <= {at} ORDER BY expires_at LIMIT 2);"
        f" END",
    ]


def workers_v9(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """One row a worker (its heartbeat): when the primary last heard from it and what it reported then."""
    return [
        f"CREATE TABLE {EdgeNames(prefix).workers} ("
        " worker_id TEXT PRIMARY KEY, profile TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,"
        " started_at REAL NOT NULL, seen_at REAL NOT NULL, every REAL NOT NULL, stopped_at REAL,"
        " settled INTEGER NOT NULL DEFAULT 0, in_flight_target INTEGER, latency REAL, replica_lag REAL)"
    ]


def doorbell_v11(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """One row a database of a deployment that a publisher rang for: `rung` numbers the rings of
    every database in one sequence, so a worker reads those since the last it saw (harel_edge/doorbell.py)."""
    n = EdgeNames(prefix)
    return [
        f"CREATE TABLE {n.doorbell} (database TEXT PRIMARY KEY, rung INTEGER NOT NULL)",
        f"CREATE INDEX {n.doorbell}_by_rung ON {n.doorbell} (rung)",
    ]


def dead_letters_v6(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """A message's delivery count and last error, the dead-letter table, and views that move into
    and out of it in ONE statement each (docs/operations.md, "Dead letters")."""
    n = EdgeNames(prefix)
    dl = dead_letters_table(prefix)
    p = n.prefix
    held = "namespace = NEW.namespace AND workflow = NEW.workflow AND visible_at = NEW.visible_at AND generation = NEW.generation"
    return [
        f"ALTER TABLE {n.messages} ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {n.messages} ADD COLUMN last_error TEXT",
        # AUTOINCREMENT: an id an operator saw is never given to another dead letter after a purge.
        f"CREATE TABLE {dl} ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " kind TEXT NOT NULL,"  # 'message' or 'workflow'
        " group_id TEXT, event TEXT, priority INT, routing_key TEXT, seq INTEGER,"  # a message's
        " namespace TEXT, workflow TEXT,"  # a workflow's
        " attempts INTEGER NOT NULL,"  # deliveries that failed, or failed passes
        " last_error TEXT,"
        " dead_at REAL NOT NULL)",
        f"CREATE INDEX {dl}_by_seq ON {dl} (seq)",
        f"CREATE TRIGGER {p}_transport_on_delivery AFTER UPDATE OF locked_by ON {n.messages}"
        f" WHEN NEW.locked_by IS NOT NULL AND NEW.locked_by <> '{PARKED}' BEGIN"
        f" UPDATE {n.messages} SET deliveries = deliveries + 1 WHERE seq = NEW.seq;"
        f" END",
        # A message over the limit, moved while its claim's token still holds it. `attempts`:
        # the deliveries before the one that found it over the limit.
        f"CREATE VIEW {p}_transport_bury (seq, token, at, held)"
        " AS SELECT NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {p}_transport_bury INSTEAD OF INSERT ON {p}_transport_bury BEGIN"
        f" INSERT INTO {dl} (kind, group_id, event, priority, routing_key, seq, attempts, last_error, dead_at)"
        f" SELECT 'message', m.group_id, m.event, COALESCE(g.priority, 0), g.routing_key, m.seq,"
        f" MAX(m.deliveries - 1, 0), m.last_error, NEW.at"
        f" FROM {n.messages} m LEFT JOIN {n.groups} g ON g.group_id = m.group_id"
        f" WHERE m.seq = NEW.seq AND m.locked_by = NEW.token;"
        f" DELETE FROM {n.messages} WHERE seq = NEW.seq AND locked_by = NEW.token;"
        f" END",
        # A failed pass, fenced on its delivery's receipt: counted, and at the limit (`dead`,
        # computed by the INSERT's SELECT) moved out of the scheduler's queue.
        f"CREATE VIEW {p}_workflow_failure"
        " (namespace, workflow, visible_at, generation, error, at, failures, dead)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {p}_workflow_failure INSTEAD OF INSERT ON {p}_workflow_failure BEGIN"
        f" INSERT INTO {dl} (kind, namespace, workflow, attempts, last_error, dead_at)"
        f" SELECT 'workflow', NEW.namespace, NEW.workflow, NEW.failures, NEW.error, NEW.at WHERE NEW.dead;"
        f" DELETE FROM workflow_queue WHERE {held} AND NEW.dead;"
        f" UPDATE workflow_queue SET failures = NEW.failures, last_error = NEW.error, generation = {QUEUE_BUMP}"
        f" WHERE {held};"
        f" END",
        # Back where it came from, its count reset: a message at its group's tail (the publish
        # view makes the group row if it is gone), a workflow in the scheduler's queue, now.
        f"CREATE VIEW {p}_dead_letter_requeue (id, at, found)"
        " AS SELECT NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {p}_dead_letter_requeue INSTEAD OF INSERT ON {p}_dead_letter_requeue BEGIN"
        f" INSERT INTO {n.publish_view} (group_id, event, priority, routing_key)"
        f" SELECT group_id, event, priority, routing_key FROM {dl} WHERE id = NEW.id AND kind = 'message';"
        f" INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        f" SELECT namespace, workflow, NEW.at FROM {dl} WHERE id = NEW.id AND kind = 'workflow'"
        f" ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP}, failures = 0, last_error = NULL;"
        f" DELETE FROM {dl} WHERE id = NEW.id;"
        f" END",
    ]


# ---- reads -------------------------------------------------------------------------------------

Execute = Callable[..., list[tuple]]


def read_version(execute: Execute) -> int:
    """The file's schema version, through the table-valued `pragma_user_version`: sqld takes a
    PRAGMA statement for a write, which a read-only token may not make."""
    return int(execute("SELECT user_version FROM pragma_user_version")[0][0])


def has_routing_key(execute: Execute, prefix: str = DEFAULT_PREFIX) -> bool:
    columns = execute(f"SELECT cid, name FROM pragma_table_info('{EdgeNames(prefix).groups}')")
    return any(row[1] == "routing_key" for row in columns)


def table_exists(execute: Execute, name: str) -> bool:
    rows = execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return bool(rows[0][0])
