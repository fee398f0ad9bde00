"""Every table harel_edge creates, the schema version, and the upgrade from older files.

harel's transport tables plus what makes each operation one statement (docs/transport.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harel.engine.schema import DEFAULT_PREFIX, Names

from harel_edge.errors import SchemaTooNewError

# What each version added: docs/operations.md ("Upgrades").
SCHEMA_VERSION = 6

# A new row's first bump starts at a random number below 2**52, so a delivery from before a
# delete cannot match the row made again (docs/durable.md, "Receipts cannot collide").
QUEUE_BUMP = "CASE generation WHEN 0 THEN (random() & 4503599627370495) + 1 ELSE generation + 1 END"

PARKED = "__parked__"  # harel's sentinel `locked_by` for a message parked by nack(delay > 0)

# The database's clock in epoch seconds, rounded to SQLite's millisecond; why not unixepoch():
# docs/consistency.md ("Whose clock").
DB_NOW = "(round((julianday('now') - 2440587.5) * 86400000.0) / 1000.0)"


def now_or(param: str = "?") -> str:
    """The injected time bound at `param`, or the database's own clock when it is NULL."""
    return f"COALESCE({param}, {DB_NOW})"


def now_table(param: str | None = None) -> str:
    """`(SELECT ... AS now) AS t`: one "now" for the whole statement (see `now_or`)."""
    return f"(SELECT {now_or(param) if param else DB_NOW} AS now) AS t"


@dataclass(frozen=True)
class EdgeNames:
    """The names of what harel_edge creates under `prefix`, on top of harel's own `Names`."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        Names(self.prefix)  # validates the prefix, with harel's message

    @property
    def messages(self) -> str:
        return Names(self.prefix).messages

    @property
    def groups(self) -> str:
        return Names(self.prefix).groups

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


def transport_tables(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The two tables and their indexes as the spec (and harel 0.9) create them."""
    n = EdgeNames(prefix)
    return [
        f"CREATE TABLE IF NOT EXISTS {n.messages} ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " group_id TEXT NOT NULL,"
        " event TEXT NOT NULL,"
        " locked_by TEXT,"
        " lock_expiry REAL)",
        f"CREATE TABLE IF NOT EXISTS {n.groups} ("
        " group_id TEXT PRIMARY KEY,"
        " last_claimed_at REAL NOT NULL DEFAULT 0.0,"
        " priority INT NOT NULL DEFAULT 0,"
        " routing_key TEXT)",
        f"CREATE INDEX IF NOT EXISTS {n.groups}_by_last_claimed ON {n.groups} (last_claimed_at)",
        f"CREATE INDEX IF NOT EXISTS {n.messages}_by_group ON {n.messages} (group_id, seq)",
    ]


def routing_upgrade(prefix: str = DEFAULT_PREFIX) -> str:
    """The one statement that upgrades harel 0.9's groups table: for a migration tool to run once."""
    return f"ALTER TABLE {EdgeNames(prefix).groups} ADD COLUMN routing_key TEXT"


def claim_time_columns(prefix: str = DEFAULT_PREFIX) -> list[tuple[str, str, str]]:
    """(table, column, ALTER) for the two columns schema 6 adds to the transport tables: when a
    group's head is next claimable (NULL: now), and a message's last claim time, which carries
    the claim's clock to the trigger that stamps the group's `last_claimed_at`."""
    n = EdgeNames(prefix)
    return [
        (n.groups, "claimable_at", f"ALTER TABLE {n.groups} ADD COLUMN claimable_at REAL"),
        (n.messages, "claimed_at", f"ALTER TABLE {n.messages} ADD COLUMN claimed_at REAL"),
    ]


def claimable_backfill(prefix: str = DEFAULT_PREFIX) -> str:
    """Once, when `claimable_at` is added to a queue in use: each group's from its head's lock."""
    n = EdgeNames(prefix)
    return (
        f"UPDATE {n.groups} SET claimable_at = (SELECT m.lock_expiry FROM {n.messages} m"
        f" WHERE m.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = {n.groups}.group_id)"
        f" AND m.locked_by IS NOT NULL)"
    )


def transport_additions(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """What harel_edge adds to the transport tables; needs `routing_key` and
    `claim_time_columns` to exist."""
    n = EdgeNames(prefix)
    seen = f"(SELECT 1 FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id)"
    at = f"COALESCE(NEW.now, {DB_NOW})"
    return [
        # The claim walks free groups (claimable_at IS NULL) of one priority (and one key) in
        # round-robin order, and groups whose lease or park has ended by claimable_at.
        f"CREATE INDEX IF NOT EXISTS {n.free_index} ON {n.groups} (claimable_at, priority, last_claimed_at)",
        f"CREATE INDEX IF NOT EXISTS {n.routing_index} ON {n.groups}"
        " (routing_key, claimable_at, priority, last_claimed_at)",
        f"DROP INDEX IF EXISTS {n.prefix}_transport_groups_by_routing_key",  # version 5's
        # Never returns rows: it exists to be inserted into. Its columns are a publish's inputs.
        f"CREATE VIEW IF NOT EXISTS {n.publish_view} AS"
        f" SELECT m.group_id, m.event, g.priority, g.routing_key"
        f" FROM {n.messages} m JOIN {n.groups} g ON g.group_id = m.group_id WHERE 0",
        # The group row first: a message is only claimable through its group, so a message
        # whose group row were missing would be stranded. Both happen in the one statement.
        f"CREATE TRIGGER IF NOT EXISTS {n.publish_view} INSTEAD OF INSERT ON {n.publish_view} BEGIN"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key)"
        f" VALUES (NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key);"
        f" INSERT INTO {n.messages} (group_id, event) VALUES (NEW.group_id, NEW.event);"
        f" END",
        # The event ids each group was sent, kept until `expires_at` (the publish's window).
        f"CREATE TABLE IF NOT EXISTS {n.published} ("
        " group_id TEXT NOT NULL,"
        " event_id TEXT NOT NULL,"
        " published_at REAL NOT NULL,"
        " expires_at REAL NOT NULL,"
        " batch TEXT,"  # the publish call's token: how a retry tells its own landed publish
        " PRIMARY KEY (group_id, event_id)) WITHOUT ROWID",
        f"CREATE INDEX IF NOT EXISTS {n.published}_by_expiry ON {n.published} (expires_at)",
        f"CREATE VIEW IF NOT EXISTS {n.publish_once_view}"
        " (group_id, event, priority, routing_key, event_id, now, keep_for, batch)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        # A publish whose event id its group had within the window writes nothing, so a retry
        # of an ambiguous publish cannot queue the event again, even after it was consumed.
        # An expired record of the id is forgotten first, and two more expired ones pruned.
        f"CREATE TRIGGER IF NOT EXISTS {n.publish_once_view} INSTEAD OF INSERT ON {n.publish_once_view} BEGIN"
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
        # A claim (only harel_edge's sets claimed_at) stamps its group with the claim time, as
        # the spec's round-robin says, and with its lease's end; and frees (claimable_at NULL)
        # the groups whose lease or park has ended since, each once, so that the claim's walk of
        # those stays short.
        f"DROP TRIGGER IF EXISTS {n.prefix}_transport_on_claim",  # version 5's: stamped the deadline
        f"CREATE TRIGGER IF NOT EXISTS {n.claim_trigger} AFTER UPDATE OF claimed_at ON {n.messages}"
        f" WHEN NEW.claimed_at IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET last_claimed_at = NEW.claimed_at, claimable_at = NEW.lock_expiry"
        f" WHERE group_id = NEW.group_id;"
        f" UPDATE {n.groups} SET claimable_at = NULL WHERE claimable_at < NEW.claimed_at;"
        f" END",
        # Any other lock change (a park, a give-back, harel's own claim, which stamps
        # last_claimed_at itself) moves only claimable_at; a park leaves the last claim as it was.
        f"CREATE TRIGGER IF NOT EXISTS {n.lock_trigger} AFTER UPDATE OF locked_by, lock_expiry ON {n.messages}"
        f" WHEN NEW.claimed_at IS OLD.claimed_at BEGIN"
        f" UPDATE {n.groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN NULL ELSE NEW.lock_expiry END"
        f" WHERE group_id = NEW.group_id;"
        f" END",
        # A held head deleted (an ack): the group's next head is free.
        f"CREATE TRIGGER IF NOT EXISTS {n.settle_trigger} AFTER DELETE ON {n.messages}"
        f" WHEN OLD.locked_by IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET claimable_at = NULL WHERE group_id = OLD.group_id;"
        f" END",
        f"CREATE TRIGGER IF NOT EXISTS {n.drain_trigger} AFTER DELETE ON {n.messages} BEGIN"
        f" DELETE FROM {n.groups} WHERE group_id = OLD.group_id"
        f" AND NOT EXISTS (SELECT 1 FROM {n.messages} WHERE group_id = OLD.group_id);"
        f" END",
    ]


def durable_tables() -> list[str]:
    """The durable stores' tables (checkpoints, claims, the scheduler queue), as the spec names them."""
    return [
        "CREATE TABLE IF NOT EXISTS workflow_checkpoint ("
        " seq INTEGER PRIMARY KEY,"
        " workflow TEXT NOT NULL,"
        " step TEXT NOT NULL,"
        " value TEXT NOT NULL,"
        f" written_at REAL NOT NULL DEFAULT ({DB_NOW}),"
        " UNIQUE (workflow, step))",
        "CREATE TABLE IF NOT EXISTS workflow_claim ("
        " workflow TEXT PRIMARY KEY,"
        " token INTEGER NOT NULL,"
        " held_until REAL NOT NULL,"
        " alive_until REAL NOT NULL,"
        " alive_for REAL NOT NULL"
        ") WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS workflow_queue ("
        " namespace TEXT NOT NULL,"
        " workflow TEXT NOT NULL,"
        " visible_at REAL NOT NULL,"
        " generation INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (namespace, workflow)"
        ") WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS workflow_queue_visible_at ON workflow_queue (namespace, visible_at)",
        *durable_writes(),
    ]


def durable_writes() -> list[str]:
    """Views whose INSTEAD OF triggers make each multi-table write of the durable stores ONE statement,
    with RETURNING handing back what the INSERT's own SELECT found (docs/durable.md, "Decisions").
    """
    return [
        # A holder's write: fenced on (token, budget), first write of a key wins, and a sign of
        # life for the claim. `held` and `existed` are computed before the trigger runs.
        "CREATE VIEW IF NOT EXISTS workflow_record"
        " (workflow, step, value, written_at, token, held, existed)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        "CREATE TRIGGER IF NOT EXISTS workflow_record_insert INSTEAD OF INSERT ON workflow_record"
        " WHEN NEW.held BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " UPDATE workflow_claim SET alive_until = MIN(NEW.written_at + alive_for, held_until)"
        " WHERE workflow = NEW.workflow AND token = NEW.token;"
        " END",
        # A write from outside the workflow (supply, append, arrive, deliver): first write of a
        # key wins; with a namespace, the workflow is also made ready (never later than it was).
        "CREATE VIEW IF NOT EXISTS workflow_arrival"
        " (workflow, step, value, written_at, namespace, visible_at)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        # `_v6`: version 5's trigger did not bump the generation; a new name replaces it.
        "DROP TRIGGER IF EXISTS workflow_arrival_insert",
        "CREATE TRIGGER IF NOT EXISTS workflow_arrival_insert_v6 INSTEAD OF INSERT ON workflow_arrival BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        " SELECT NEW.namespace, NEW.workflow, NEW.visible_at WHERE NEW.namespace IS NOT NULL"
        " ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP};"
        " END",
        # Forget a workflow's records and raise its fence (and, with a namespace, drop its
        # queue row). The claim row stays behind, released, carrying the raised number.
        "CREATE VIEW IF NOT EXISTS workflow_discard (workflow, namespace, at, records)"
        " AS SELECT NULL, NULL, NULL, NULL WHERE 0",
        "CREATE TRIGGER IF NOT EXISTS workflow_discard_insert INSTEAD OF INSERT ON workflow_discard BEGIN"
        " DELETE FROM workflow_checkpoint WHERE workflow = NEW.workflow;"
        " INSERT INTO workflow_claim (workflow, token, held_until, alive_until, alive_for)"
        " VALUES (NEW.workflow, 1, NEW.at, NEW.at, 0)"
        " ON CONFLICT (workflow) DO UPDATE SET token = token + 1,"
        " held_until = MIN(held_until, excluded.held_until), alive_until = MIN(alive_until, excluded.alive_until);"
        " DELETE FROM workflow_queue WHERE namespace = NEW.namespace AND workflow = NEW.workflow;"
        " END",
    ]


# ---- dead letters ------------------------------------------------------------------------------


def dead_letters_table(prefix: str = DEFAULT_PREFIX) -> str:
    """The table of messages and workflows taken out of the way after failing too often."""
    return f"{EdgeNames(prefix).prefix}_dead_letters"


def dead_letter_columns(prefix: str = DEFAULT_PREFIX) -> list[tuple[str, str, str]]:
    """(table, column, ALTER) for each column dead-lettering adds to an existing table: a
    message's count of deliveries and its last handling error, and the same for a workflow's
    failed passes (the scheduler's row, so a finished or cancelled workflow forgets them)."""
    messages = EdgeNames(prefix).messages
    return [
        (messages, "deliveries", f"ALTER TABLE {messages} ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0"),
        (messages, "last_error", f"ALTER TABLE {messages} ADD COLUMN last_error TEXT"),
        ("workflow_queue", "failures", "ALTER TABLE workflow_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0"),
        ("workflow_queue", "last_error", "ALTER TABLE workflow_queue ADD COLUMN last_error TEXT"),
    ]


def dead_letter_tables(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The dead-letter table, the delivery count's trigger, and views that move into and out of it in
    ONE statement each (needs `dead_letter_columns`; docs/operations.md, "Dead letters").
    """
    n = EdgeNames(prefix)
    dl = dead_letters_table(prefix)
    p = n.prefix
    held = "namespace = NEW.namespace AND workflow = NEW.workflow AND visible_at = NEW.visible_at AND generation = NEW.generation"
    return [
        # AUTOINCREMENT: an id an operator saw is never given to another dead letter after a purge.
        f"CREATE TABLE IF NOT EXISTS {dl} ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " kind TEXT NOT NULL,"  # 'message' or 'workflow'
        " group_id TEXT, event TEXT, priority INT, routing_key TEXT, seq INTEGER,"  # a message's
        " namespace TEXT, workflow TEXT,"  # a workflow's
        " attempts INTEGER NOT NULL,"  # deliveries that failed, or failed passes
        " last_error TEXT,"
        " dead_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {dl}_by_seq ON {dl} (seq)",
        f"CREATE TRIGGER IF NOT EXISTS {p}_transport_on_delivery AFTER UPDATE OF locked_by ON {n.messages}"
        f" WHEN NEW.locked_by IS NOT NULL AND NEW.locked_by <> '{PARKED}' BEGIN"
        f" UPDATE {n.messages} SET deliveries = deliveries + 1 WHERE seq = NEW.seq;"
        f" END",
        # A message over the limit, moved while its claim's token still holds it. `attempts`:
        # the deliveries before the one that found it over the limit.
        f"CREATE VIEW IF NOT EXISTS {p}_transport_bury (seq, token, at, held)"
        " AS SELECT NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER IF NOT EXISTS {p}_transport_bury INSTEAD OF INSERT ON {p}_transport_bury BEGIN"
        f" INSERT INTO {dl} (kind, group_id, event, priority, routing_key, seq, attempts, last_error, dead_at)"
        f" SELECT 'message', m.group_id, m.event, COALESCE(g.priority, 0), g.routing_key, m.seq,"
        f" MAX(m.deliveries - 1, 0), m.last_error, NEW.at"
        f" FROM {n.messages} m LEFT JOIN {n.groups} g ON g.group_id = m.group_id"
        f" WHERE m.seq = NEW.seq AND m.locked_by = NEW.token;"
        f" DELETE FROM {n.messages} WHERE seq = NEW.seq AND locked_by = NEW.token;"
        f" END",
        # A failed pass, fenced on its delivery's receipt: counted, and at the limit (`dead`,
        # computed by the INSERT's SELECT) moved out of the scheduler's queue.
        f"CREATE VIEW IF NOT EXISTS {p}_workflow_failure"
        " (namespace, workflow, visible_at, generation, error, at, failures, dead)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER IF NOT EXISTS {p}_workflow_failure INSTEAD OF INSERT ON {p}_workflow_failure BEGIN"
        f" INSERT INTO {dl} (kind, namespace, workflow, attempts, last_error, dead_at)"
        f" SELECT 'workflow', NEW.namespace, NEW.workflow, NEW.failures, NEW.error, NEW.at WHERE NEW.dead;"
        f" DELETE FROM workflow_queue WHERE {held} AND NEW.dead;"
        f" UPDATE workflow_queue SET failures = NEW.failures, last_error = NEW.error, generation = {QUEUE_BUMP}"
        f" WHERE {held};"
        f" END",
        # Back where it came from, its count reset: a message at its group's tail (the publish
        # view makes the group row if it is gone), a workflow in the scheduler's queue, now.
        f"CREATE VIEW IF NOT EXISTS {p}_dead_letter_requeue (id, at, found)"
        " AS SELECT NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER IF NOT EXISTS {p}_dead_letter_requeue INSTEAD OF INSERT ON {p}_dead_letter_requeue BEGIN"
        f" INSERT INTO {n.publish_view} (group_id, event, priority, routing_key)"
        f" SELECT group_id, event, priority, routing_key FROM {dl} WHERE id = NEW.id AND kind = 'message';"
        f" INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        f" SELECT namespace, workflow, NEW.at FROM {dl} WHERE id = NEW.id AND kind = 'workflow'"
        f" ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP}, failures = 0, last_error = NULL;"
        f" DELETE FROM {dl} WHERE id = NEW.id;"
        f" END",
    ]


def _add_dead_letters(execute: Execute, prefix: str) -> None:
    for table, column, alter in dead_letter_columns(prefix):
        _add_column(execute, table, column, alter)
    for statement in dead_letter_tables(prefix):
        execute(statement)


def migration_sql(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The whole schema as a migration tool should run it on a NEW database, in order.

    Older databases need the upgrades first (docs/operations.md, "Upgrades"); `migrate --print-sql` prints this.
    """
    return [
        *transport_tables(prefix),
        *(alter for _table, _column, alter in claim_time_columns(prefix)),
        *transport_additions(prefix),
        *durable_tables(),
        *(alter for _table, _column, alter in dead_letter_columns(prefix)),
        *dead_letter_tables(prefix),
        f"PRAGMA user_version = {SCHEMA_VERSION}",
    ]


Execute = Callable[[str], list[tuple]]


def refuse_newer(found: int, where: str = "this database") -> None:
    """The one check that a database was not written by a newer harel_edge (which this one must
    not touch), with the one message that says what to do."""
    if found > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"{where} has schema version {found}, newer than {SCHEMA_VERSION} which this harel_edge "
            "understands: upgrade harel_edge here (never downgrade a database); nothing was changed"
        )


def table_exists(execute: Callable[..., list[tuple]], name: str) -> bool:
    rows = execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return bool(rows[0][0])


def migrate(execute: Execute, prefix: str = DEFAULT_PREFIX) -> int:
    """Bring the file up to `SCHEMA_VERSION` through `execute` (one statement, returns rows).

    Returns the version the file had before. Safe to run from every process at every start.
    """
    found = read_version(execute)
    refuse_newer(found)
    for statement in transport_tables(prefix):
        execute(statement)
    _add_routing_key(execute, prefix)
    _add_claim_time(execute, prefix)
    for statement in transport_additions(prefix):
        execute(statement)
    durable = durable_tables()
    for statement in durable[:3]:  # the three tables
        execute(statement)
    _add_column(execute, "workflow_queue", "generation", queue_generation_upgrade())
    for statement in durable[3:]:
        execute(statement)
    _add_dead_letters(execute, prefix)
    if found < SCHEMA_VERSION:
        execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return found


def read_version(execute: Execute) -> int:
    """The file's schema version. Read through the table-valued `pragma_user_version`: sqld
    treats a PRAGMA statement as a write, so with a read-only token `PRAGMA user_version`
    fails with a broken response instead of answering."""
    return int(execute("SELECT user_version FROM pragma_user_version")[0][0])


def has_routing_key(execute: Execute, prefix: str = DEFAULT_PREFIX) -> bool:
    columns = execute(f"SELECT cid, name FROM pragma_table_info('{EdgeNames(prefix).groups}')")
    return any(row[1] == "routing_key" for row in columns)


def queue_generation_upgrade() -> str:
    """The statement that upgrades a version-5 scheduler queue: for a migration tool to run once."""
    return "ALTER TABLE workflow_queue ADD COLUMN generation INTEGER NOT NULL DEFAULT 0"


def _add_routing_key(execute: Execute, prefix: str) -> None:
    _add_column(execute, EdgeNames(prefix).groups, "routing_key", routing_upgrade(prefix))


def _add_claim_time(execute: Execute, prefix: str) -> None:
    """The claim-time columns; the process that adds `claimable_at` fills it in for the groups
    already in flight (otherwise the claim would step over them until they settle)."""
    added = [_add_column(execute, table, column, alter) for table, column, alter in claim_time_columns(prefix)]
    if added[0]:
        execute(claimable_backfill(prefix))


def _add_column(execute: Execute, table: str, column: str, alter: str) -> bool:
    """SQLite has no ADD COLUMN IF NOT EXISTS: look, add, and accept losing a race to add it.
    True when this call added it."""
    columns = execute(f"SELECT cid, name FROM pragma_table_info('{table}')")
    if any(row[1] == column for row in columns):
        return False
    try:
        execute(alter)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the race we expect
        if "duplicate column" not in str(exc).lower():
            raise
        return False
    return True
