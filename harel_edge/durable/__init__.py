"""Durable workflows on libSQL: fenced checkpoints, a scheduler queue, and a runtime over both.

Guarantees and a worked example: docs/durable.md; why it is built this way: docs/durable-design.md.
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
