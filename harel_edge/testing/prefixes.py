"""Dropping what a test made on a primary other tests share: sqld reads the whole schema for every
stream it opens, so a shared primary that kept every test's tables would answer each test slower
than the one before it (measured: 117 s of sqld CPU for 106 tests that kept theirs; 8 s once each
test's tables were dropped after it; docs/testing.md)."""

from __future__ import annotations

from typing import Any

from harel_edge.settings import ExplicitSettings
from harel_edge.sync_sql import Statements

# What every prefix shares (the durable stores' tables) and SQLite's own: never dropped, since a
# database's `user_version` says they are there.
KEPT = ("workflow_", "sqlite_")
ORDER = {"trigger": 0, "view": 1, "table": 2}


def _statements(server: Any) -> Statements:
    return Statements(ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token))


def object_names(server: Any) -> set[str]:
    """The names of the tables, views and triggers on `server` now."""
    db = _statements(server)
    try:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type != 'index'")}
    finally:
        db.close()


def drop_new_objects(server: Any, before: set[str]) -> int:
    """Drop the tables, views and triggers not in `before` (except the shared ones), in one
    transaction; return how many."""
    db = _statements(server)
    try:
        rows = db.execute("SELECT type, name FROM sqlite_master WHERE type != 'index'")
        new = [(kind, name) for kind, name in rows if name not in before and not name.startswith(KEPT)]
        drops = [(f'DROP {kind.upper()} IF EXISTS "{name}"', ()) for kind, name in sorted(new, key=lambda r: ORDER[r[0]])]
        if drops:
            db.transaction(drops)
        return len(drops)
    finally:
        db.close()
