"""Schema version 4: harel 0.9's own tables, as harel 0.9 creates them, and its rule for a prefix.

Kept here rather than asked of harel: version 4 must stay what harel 0.9 made whatever a later harel
makes, and reading a schema then needs no import of harel (a fifth of a second at every command).
Two tests compare both with the harel installed.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "harel"

# harel 0.9's rule for a prefix (`harel.engine.schema.Names`).
PREFIX_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,29}")


def check_prefix(prefix: str) -> str:
    """`prefix`, or a ValueError with harel's own message when it cannot name tables."""
    if not isinstance(prefix, str) or not PREFIX_RULE.fullmatch(prefix):
        raise ValueError(
            "prefix must be an identifier (a letter or _, then letters, digits or _; at most 30 characters), "
            f"got {prefix!r}"
        )
    return prefix


# harel 0.9's execution store and transport for SQLite, as `harel.engine.schema.sql_schema("sqlite",
# prefix)` creates them: version 4 is what harel 0.9 made, whatever a later harel makes (a test
# compares this with the harel installed).
HAREL_09_TABLES = (
    "CREATE TABLE IF NOT EXISTS {p}_executions (id TEXT PRIMARY KEY, definition_id TEXT NOT NULL, data TEXT NOT NULL,"
    " version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {p}_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, target_id TEXT, event TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {p}_processed_events (execution_id TEXT NOT NULL, event_id TEXT NOT NULL,"
    " PRIMARY KEY (execution_id, event_id))",
    "CREATE TABLE IF NOT EXISTS {p}_timers (execution_id TEXT NOT NULL, path TEXT NOT NULL, fire_at REAL NOT NULL,"
    " PRIMARY KEY (execution_id, path))",
    "CREATE TABLE IF NOT EXISTS {p}_spawns (seq INTEGER PRIMARY KEY AUTOINCREMENT, parent_id TEXT NOT NULL,"
    " child_id TEXT NOT NULL, root_path TEXT NOT NULL, context TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {p}_trace (execution_id TEXT NOT NULL, idx INTEGER NOT NULL, entry TEXT NOT NULL,"
    " PRIMARY KEY (execution_id, idx))",
    "CREATE TABLE IF NOT EXISTS {p}_transport_messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,"
    " event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)",
    "CREATE TABLE IF NOT EXISTS {p}_transport_groups (group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0.0,"
    " priority INT NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS {p}_transport_groups_by_last_claimed ON {p}_transport_groups (last_claimed_at)",
    "CREATE INDEX IF NOT EXISTS {p}_transport_messages_by_group ON {p}_transport_messages (group_id, seq)",
)


def harel_tables(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """harel 0.9's execution store and transport for SQLite, as harel 0.9 creates them."""
    return [statement.format(p=check_prefix(prefix)) for statement in HAREL_09_TABLES]


def harel_names(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The tables and indexes `harel_tables` creates."""
    return [m.group(1) for s in harel_tables(prefix) if (m := re.search(r"IF NOT EXISTS (\w+)", s))]
