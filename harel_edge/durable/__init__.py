"""Durable workflows on libSQL: a checkpoint store with fenced claims, a scheduler queue, their
one-commit combination, and a small runtime that runs workflows on them.

    database = connect(settings)          # one connection, shared by both stores
    await migrate(database)
    durable = LibsqlDurable(LibsqlCheckpointer(database), LibsqlScheduler(database))

See docs/durable.md for the guarantees on each profile and a worked example.
"""

from harel_edge.durable.checkpointer import (
    LibsqlCheckpointer,
    LibsqlEffect,
    SqlEffect,
    Transaction,
    new_inbox_key,
)
from harel_edge.durable.database import Database, connect, migrate
from harel_edge.durable.durable import LibsqlDurable, SeparateDatabasesError
from harel_edge.durable.scheduler import LibsqlScheduler
from harel_edge.durable.types import (
    BUSY_TIMEOUT,
    JSON,
    LEASE,
    POLL,
    CheckpointCodec,
    DatabaseClosedError,
    Delivery,
    Entry,
    FencedError,
    JsonCodec,
    Pass,
    Recorded,
    Written,
)

__all__ = [
    "BUSY_TIMEOUT",
    "JSON",
    "LEASE",
    "POLL",
    "CheckpointCodec",
    "Database",
    "DatabaseClosedError",
    "Delivery",
    "Entry",
    "FencedError",
    "JsonCodec",
    "LibsqlCheckpointer",
    "LibsqlDurable",
    "LibsqlEffect",
    "LibsqlScheduler",
    "Pass",
    "Recorded",
    "SeparateDatabasesError",
    "SqlEffect",
    "Transaction",
    "Written",
    "connect",
    "migrate",
    "new_inbox_key",
]
