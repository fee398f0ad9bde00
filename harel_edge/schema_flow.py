"""Schema version 7: flow control. Delayed publish, and per-key concurrency and rate limits kept
on the primary, which the claim statement reads (docs/flow-control.md).

A delayed message is written parked (harel's own `__parked__` lock) until its time, so every
claim, harel's own included, leaves it alone until then, and as its group's head it holds the
group back, which keeps FIFO within the group.
"""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge.schema import DB_NOW, DEFAULT_PREFIX, PARKED, EdgeNames


@dataclass(frozen=True)
class FlowNames:
    """The names version 7 adds under `prefix`."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        EdgeNames(self.prefix)  # validates the prefix

    @property
    def limits(self) -> str:
        """One row a limited key: its concurrency, and its rate (claims per period seconds)."""
        return f"{self.prefix}_transport_limits"

    @property
    def limit_claims(self) -> str:
        """The claims of each rate-limited key within its period: the rolling window's log."""
        return f"{self.prefix}_transport_limit_claims"

    @property
    def limit_index(self) -> str:
        return f"{self.prefix}_transport_groups_by_limit_key"

    @property
    def publish_view_v7(self) -> str:
        return f"{self.prefix}_transport_publish_once_v7"

    @property
    def publish_view(self) -> str:
        """The publish every harel_edge publish goes through (version 8's)."""
        return f"{self.prefix}_transport_publish_once_v8"

    @property
    def claim_trigger(self) -> str:
        return f"{self.prefix}_transport_on_claim_v7"


def _head(n: EdgeNames, group: str) -> str:
    return f"(SELECT MIN(seq) FROM {n.messages} WHERE group_id = {group})"


def _publish_terms(n: EdgeNames, f: FlowNames) -> tuple[str, str, str, str, str]:
    """What the publish view's trigger of versions 7 and 8 reads of the new row: whether its
    event id was seen, the primary's time, its limit key, that key while limited, its lease end."""
    seen = f"(SELECT 1 FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id)"
    key = "COALESCE(NEW.limit_key, NEW.routing_key)"
    held = f"CASE WHEN EXISTS (SELECT 1 FROM {f.limits} WHERE key = {key}) THEN {key} END"
    leased = f"CASE WHEN NEW.locked_by IS NULL OR NEW.locked_by = '{PARKED}' THEN NULL ELSE NEW.lock_expiry END"
    return seen, f"COALESCE(NEW.now, {DB_NOW})", key, held, leased


def flow_control_v7(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """A group's limit key (by default its routing key), the same key in `held_key` while it has
    a limit (so that unlimited groups cost a claim nothing more), when its lease ends
    (`leased_until`: what counts a key's messages in flight), and whether it was ever given a
    delayed message; the limits and the rate log, and the triggers that keep them."""
    n, f = EdgeNames(prefix), FlowNames(prefix)
    seen, at, key, held, leased = _publish_terms(n, f)
    until = f"COALESCE(NEW.at, {at} + NEW.delay)"  # NULL: claimable at once
    next_lock = (
        f"(SELECT m.lock_expiry FROM {n.messages} m WHERE m.seq = {_head(n, 'OLD.group_id')} AND m.locked_by IS NOT NULL)"
    )
    return [
        f"ALTER TABLE {n.groups} ADD COLUMN limit_key TEXT",
        f"ALTER TABLE {n.groups} ADD COLUMN held_key TEXT",
        f"ALTER TABLE {n.groups} ADD COLUMN leased_until REAL",
        f"ALTER TABLE {n.groups} ADD COLUMN delayed INTEGER",
        f"UPDATE {n.groups} SET limit_key = routing_key, leased_until = (SELECT m.lock_expiry FROM {n.messages} m"
        f" WHERE m.seq = {_head(n, f'{n.groups}.group_id')} AND m.locked_by IS NOT NULL AND m.locked_by <> '{PARKED}')",
        # Counts a limited key's groups in flight: those whose lease has not ended.
        f"CREATE INDEX {f.limit_index} ON {n.groups} (held_key, leased_until) WHERE held_key IS NOT NULL",
        f"CREATE TABLE {f.limits} ("
        " key TEXT PRIMARY KEY,"
        " concurrency INTEGER CHECK (concurrency IS NULL OR concurrency >= 0),"
        " rate INTEGER CHECK (rate IS NULL OR rate >= 0),"
        " period REAL CHECK (period IS NULL OR period > 0),"
        " CHECK ((rate IS NULL) = (period IS NULL))) WITHOUT ROWID",
        f"CREATE TABLE {f.limit_claims} (key TEXT NOT NULL, at REAL NOT NULL)",
        f"CREATE INDEX {f.limit_claims}_by_key ON {f.limit_claims} (key, at)",
        # A key given a limit holds its groups from the next claim on; one lifted lets them go
        # and forgets its rate log.
        f"CREATE TRIGGER {f.limits}_on_set AFTER INSERT ON {f.limits} BEGIN"
        f" UPDATE {n.groups} SET held_key = NEW.key WHERE limit_key = NEW.key;"
        f" END",
        f"CREATE TRIGGER {f.limits}_on_clear AFTER DELETE ON {f.limits} BEGIN"
        f" UPDATE {n.groups} SET held_key = NULL WHERE held_key = OLD.key;"
        f" DELETE FROM {f.limit_claims} WHERE key = OLD.key;"
        f" END",
        # The claim copies a limited group's key onto the message it leases, and the trigger that
        # counts a delivery logs a claim of a key with a rate limit and forgets the key's claims
        # older than its period (here, not in triggers of their own: each would cost every claim,
        # limited or not, its set-up).
        f"ALTER TABLE {n.messages} ADD COLUMN held_key TEXT",
        f"CREATE TRIGGER {f.limit_claims}_on_claim AFTER UPDATE OF held_key ON {n.messages}"
        f" WHEN NEW.held_key IS NOT NULL BEGIN"
        f" INSERT INTO {f.limit_claims} (key, at) SELECT key, NEW.claimed_at FROM {f.limits}"
        f" WHERE key = NEW.held_key AND rate IS NOT NULL;"
        f" DELETE FROM {f.limit_claims} WHERE key = NEW.held_key"
        f" AND at <= NEW.claimed_at - (SELECT period FROM {f.limits} WHERE key = NEW.held_key);"
        f" END",
        # A claim stamps its group as version 6's did, and with its lease's end. Made after the
        # delivery trigger, so that it runs first: measured, the other order costs a claim more.
        f"DROP TRIGGER {n.claim_trigger}",
        f"CREATE TRIGGER {f.claim_trigger} AFTER UPDATE OF claimed_at ON {n.messages}"
        f" WHEN NEW.claimed_at IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET last_claimed_at = NEW.claimed_at, claimable_at = NEW.lock_expiry,"
        f" leased_until = NEW.lock_expiry WHERE group_id = NEW.group_id;"
        f" UPDATE {n.groups} SET claimable_at = NULL WHERE claimable_at < NEW.claimed_at;"
        f" END",
        f"DROP TRIGGER {n.lock_trigger}",
        f"CREATE TRIGGER {n.lock_trigger}_v7 AFTER UPDATE OF locked_by, lock_expiry ON {n.messages}"
        f" WHEN NEW.claimed_at IS OLD.claimed_at BEGIN"
        f" UPDATE {n.groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN NULL ELSE NEW.lock_expiry END,"
        f" leased_until = {leased} WHERE group_id = NEW.group_id;"
        f" END",
        # A held head deleted (an ack): the group's next head is claimable at once, or, in a
        # group that was given a delayed message, when its lock (the delay) ends.
        f"DROP TRIGGER {n.settle_trigger}",
        f"CREATE TRIGGER {n.settle_trigger}_v7 AFTER DELETE ON {n.messages}"
        f" WHEN OLD.locked_by IS NOT NULL BEGIN"
        f" UPDATE {n.groups} SET leased_until = NULL,"
        f" claimable_at = CASE WHEN delayed IS NULL THEN NULL ELSE {next_lock} END"
        f" WHERE group_id = OLD.group_id;"
        f" END",
        # The plain publish (a dead letter's requeue goes through it) keys its groups too.
        f"DROP TRIGGER {n.publish_view}",
        f"CREATE TRIGGER {n.publish_view}_v7 INSTEAD OF INSERT ON {n.publish_view} BEGIN"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key, limit_key, held_key)"
        f" SELECT NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key, NEW.routing_key,"
        f" CASE WHEN EXISTS (SELECT 1 FROM {f.limits} WHERE key = NEW.routing_key) THEN NEW.routing_key END;"
        f" INSERT INTO {n.messages} (group_id, event) VALUES (NEW.group_id, NEW.event);"
        f" END",
        # Version 6's idempotent publish, with a limit key and a time before which the message
        # stays parked (a new group's row says so, so the claim's walk of free groups skips it).
        f"CREATE VIEW {f.publish_view_v7}"
        " (group_id, event, priority, routing_key, event_id, limit_key, delay, at, now, keep_for, batch)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {f.publish_view_v7} INSTEAD OF INSERT ON {f.publish_view_v7} BEGIN"
        f" DELETE FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id"
        f" AND expires_at <= {at};"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key, limit_key, held_key, claimable_at)"
        f" SELECT NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key, {key}, {held}, {until}"
        f" WHERE NOT EXISTS {seen};"
        f" UPDATE {n.groups} SET delayed = 1 WHERE {until} IS NOT NULL AND group_id = NEW.group_id"
        f" AND NOT EXISTS {seen};"
        f" INSERT INTO {n.messages} (group_id, event, locked_by, lock_expiry)"
        f" SELECT NEW.group_id, NEW.event, CASE WHEN {until} IS NULL THEN NULL ELSE '{PARKED}' END, {until}"
        f" WHERE NOT EXISTS {seen};"
        f" INSERT OR IGNORE INTO {n.published} (group_id, event_id, published_at, expires_at, batch)"
        f" VALUES (NEW.group_id, NEW.event_id, {at}, {at} + NEW.keep_for, NEW.batch);"
        f" DELETE FROM {n.published} WHERE (group_id, event_id) IN (SELECT group_id, event_id"
        f" FROM {n.published} WHERE expires_at <= {at} ORDER BY expires_at LIMIT 2);"
        f" END",
        f"DROP TRIGGER {n.publish_once_view}",
        f"DROP VIEW {n.publish_once_view}",
    ]


def debounce_v8(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Debounced publish: a message with a debounce key waits, parked, until `debounce` seconds
    pass without another publish of that key to its group; each one meanwhile replaces its event
    and pushes its time back, no later than `max_wait` after the burst's first publish."""
    n, f = EdgeNames(prefix), FlowNames(prefix)
    seen, at, key, held, leased = _publish_terms(n, f)
    until = f"COALESCE(NEW.at, {at} + NEW.delay, {at} + NEW.debounce)"  # NULL: claimable at once
    # The burst's message waiting: published with this key, parked, never claimed.
    pending = (
        f"NEW.debounce_key IS NOT NULL AND group_id = NEW.group_id AND debounce_key = NEW.debounce_key"
        f" AND locked_by = '{PARKED}' AND claimed_at IS NULL"
    )
    return [
        f"ALTER TABLE {n.messages} ADD COLUMN debounce_key TEXT",
        f"ALTER TABLE {n.messages} ADD COLUMN first_at REAL",
        f"CREATE INDEX {n.prefix}_transport_messages_by_debounce ON {n.messages} (group_id, debounce_key)"
        " WHERE debounce_key IS NOT NULL",
        # A lock moved on a message that is not its group's head (a debounced one pushed back)
        # leaves the group as it is.
        f"DROP TRIGGER {n.lock_trigger}_v7",
        f"CREATE TRIGGER {n.lock_trigger}_v8 AFTER UPDATE OF locked_by, lock_expiry ON {n.messages}"
        f" WHEN NEW.claimed_at IS OLD.claimed_at"
        f" AND NEW.seq = (SELECT MIN(seq) FROM {n.messages} WHERE group_id = NEW.group_id) BEGIN"
        f" UPDATE {n.groups} SET claimable_at = CASE WHEN NEW.locked_by IS NULL THEN NULL ELSE NEW.lock_expiry END,"
        f" leased_until = {leased} WHERE group_id = NEW.group_id;"
        f" END",
        f"DROP TRIGGER {f.publish_view_v7}",
        f"DROP VIEW {f.publish_view_v7}",
        f"CREATE VIEW {f.publish_view}"
        " (group_id, event, priority, routing_key, event_id, limit_key, delay, at, debounce_key, debounce,"
        " max_wait, now, keep_for, batch)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {f.publish_view} INSTEAD OF INSERT ON {f.publish_view} BEGIN"
        f" DELETE FROM {n.published} WHERE group_id = NEW.group_id AND event_id = NEW.event_id"
        f" AND expires_at <= {at};"
        f" UPDATE {n.messages} SET event = NEW.event, lock_expiry = MIN({at} + NEW.debounce,"
        f" COALESCE(first_at + NEW.max_wait, {at} + NEW.debounce)) WHERE {pending} AND NOT EXISTS {seen};"
        f" INSERT OR IGNORE INTO {n.groups} (group_id, priority, routing_key, limit_key, held_key, claimable_at)"
        f" SELECT NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key, {key}, {held}, {until}"
        f" WHERE NOT EXISTS {seen};"
        f" UPDATE {n.groups} SET delayed = 1 WHERE {until} IS NOT NULL AND group_id = NEW.group_id"
        f" AND NOT EXISTS {seen};"
        f" INSERT INTO {n.messages} (group_id, event, locked_by, lock_expiry, debounce_key, first_at)"
        f" SELECT NEW.group_id, NEW.event, CASE WHEN {until} IS NULL THEN NULL ELSE '{PARKED}' END,"
        f" CASE WHEN NEW.max_wait IS NULL THEN {until} ELSE MIN({until}, {at} + NEW.max_wait) END,"
        f" NEW.debounce_key, CASE WHEN NEW.debounce_key IS NULL THEN NULL ELSE {at} END"
        f" WHERE NOT EXISTS {seen} AND NOT EXISTS (SELECT 1 FROM {n.messages} WHERE {pending});"
        f" INSERT OR IGNORE INTO {n.published} (group_id, event_id, published_at, expires_at, batch)"
        f" VALUES (NEW.group_id, NEW.event_id, {at}, {at} + NEW.keep_for, NEW.batch);"
        f" DELETE FROM {n.published} WHERE (group_id, event_id) IN (SELECT group_id, event_id"
        f" FROM {n.published} WHERE expires_at <= {at} ORDER BY expires_at LIMIT 2);"
        f" END",
    ]
