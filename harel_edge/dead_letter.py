"""Dead letters: the messages and workflows a worker moved aside, as `harel-edge dead-letter` runs them.

Each write is ONE statement through the views of `schema.dead_letters_v6` (docs/operations.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from harel_edge import doorbell, schema
from harel_edge.access import Listed, with_primary_writer, with_reader
from harel_edge.errors import SchemaError
from harel_edge.schema import EdgeNames, dead_letters_table, now_table
from harel_edge.settings import EdgeSettings

Execute = Callable[..., list[tuple]]
Kind = Literal["message", "workflow"]
KINDS: tuple[str, ...] = ("message", "workflow")

_COLUMNS = (
    "id, kind, attempts, last_error, dead_at, group_id, event, priority, routing_key, seq, namespace, workflow"
)


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as the table holds it; a message's fields or a workflow's are set."""

    id: int
    kind: str
    attempts: int  # a message's failed deliveries, or a workflow's failed passes in a row
    last_error: str | None
    dead_at: float  # unix seconds, by the database's clock
    group_id: str | None = None
    event: dict[str, Any] | None = None
    priority: int | None = None
    routing_key: str | None = None
    seq: int | None = None  # the message's place in the queue it was taken from
    namespace: str | None = None
    workflow: str | None = None

    @property
    def target(self) -> str:
        """What it belonged to: a message's group, or a workflow as namespace/workflow."""
        return (self.group_id or "") if self.kind == "message" else f"{self.namespace}/{self.workflow}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dead_letter(row: tuple) -> DeadLetter:
    id_, kind, attempts, error, dead_at, group_id, event, priority, routing_key, seq, namespace, workflow = row
    return DeadLetter(
        int(id_),
        kind,
        int(attempts),
        error,
        float(dead_at),
        group_id,
        None if event is None else json.loads(event),
        None if priority is None else int(priority),
        routing_key,
        None if seq is None else int(seq),
        namespace,
        workflow,
    )


def has_dead_letters_table(execute: Execute, prefix: str) -> bool:
    return schema.table_exists(execute, dead_letters_table(prefix))


def _require_table(execute: Execute, prefix: str) -> str:
    table = dead_letters_table(prefix)
    if not has_dead_letters_table(execute, prefix):
        raise SchemaError(
            f"this database has no dead-letter table {table}: run `harel-edge migrate` (or start a worker, "
            "which migrates at start), or set HAREL_EDGE_PREFIX to the prefix the workers use"
        )
    return table


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


def list_dead_letters(
    execute: Execute, prefix: str, *, kind: str | None = None, limit: int = 100, offset: int = 0
) -> Listed:
    """The oldest `limit` dead letters after the first `offset` (of `kind`, if given), oldest first."""
    _check_kind(kind)
    table = _require_table(execute, prefix)
    rows = execute(
        f"SELECT {_COLUMNS}, count(*) OVER () FROM {table} WHERE ?1 IS NULL OR kind = ?1 ORDER BY id LIMIT ?2 OFFSET ?3",
        (kind, limit, offset),
    )
    return Listed(rows, _dead_letter)


def get_dead_letter(execute: Execute, prefix: str, dead_letter_id: int) -> DeadLetter | None:
    table = _require_table(execute, prefix)
    rows = execute(f"SELECT {_COLUMNS} FROM {table} WHERE id = ?", (dead_letter_id,))
    return _dead_letter(rows[0]) if rows else None


def requeue(execute: Execute, prefix: str, dead_letter_id: int, *, now: float | None = None) -> DeadLetter | None:
    """Put a dead letter back, its count reset, and remove it, in one statement: a message at
    its group's tail (its group made again if it is gone), a workflow in its scheduler queue,
    ready now. Returns what was requeued, or None when there is no such dead letter."""
    found = get_dead_letter(execute, prefix, dead_letter_id)
    if found is None:
        return None
    p = EdgeNames(prefix).prefix
    rows = execute(
        f"INSERT INTO {p}_dead_letter_requeue (id, at, found)"
        f" SELECT ?1, t.now, EXISTS(SELECT 1 FROM {dead_letters_table(prefix)} WHERE id = ?1)"
        f" FROM {now_table('?2')} RETURNING found",
        (dead_letter_id, now),
    )
    return found if rows and rows[0][0] else None


def purge(execute: Execute, prefix: str, dead_letter_id: int) -> bool:
    """Delete one dead letter for good; False when there is no such dead letter."""
    table = _require_table(execute, prefix)
    return bool(execute(f"DELETE FROM {table} WHERE id = ? RETURNING id", (dead_letter_id,)))


def purge_all(execute: Execute, prefix: str, *, kind: str | None = None) -> int:
    """Delete every dead letter (of `kind`, if given); returns how many there were."""
    _check_kind(kind)
    table = _require_table(execute, prefix)
    return len(execute(f"DELETE FROM {table} WHERE ?1 IS NULL OR kind = ?1 RETURNING id", (kind,)))


# ---- on the settings' database, as the commands reach it -------------------------------------------


@dataclass(frozen=True)
class Purged:
    """How many dead letters a purge deleted (0: there was no such dead letter)."""

    count: int


def read_dead_letters(
    settings: EdgeSettings, *, kind: str | None = None, limit: int = 100, offset: int = 0
) -> Listed:
    """`list_dead_letters` with reads only: a read-only token is enough."""
    return with_reader(
        settings, lambda execute: list_dead_letters(execute, settings.prefix, kind=kind, limit=limit, offset=offset)
    )


def read_dead_letter(settings: EdgeSettings, dead_letter_id: int) -> DeadLetter | None:
    """`get_dead_letter` with reads only: a read-only token is enough."""
    return with_reader(settings, lambda execute: get_dead_letter(execute, settings.prefix, dead_letter_id))


def requeue_dead_letter(settings: EdgeSettings, dead_letter_id: int) -> DeadLetter | None:
    """`requeue` on the primary itself, after `check_writable`, then the deployment's doorbell
    rung for its database; None when there is no such dead letter."""
    found = with_primary_writer(settings, lambda execute: requeue(execute, settings.prefix, dead_letter_id))
    if found is not None:
        doorbell.ring_for(settings)
    return found


def purge_dead_letter(settings: EdgeSettings, dead_letter_id: int) -> Purged:
    """`purge` on the primary itself, after `check_writable`."""
    found = with_primary_writer(settings, lambda execute: purge(execute, settings.prefix, dead_letter_id))
    return Purged(int(found))


def purge_dead_letters(settings: EdgeSettings, *, kind: str | None = None) -> Purged:
    """`purge_all` on the primary itself, after `check_writable`."""
    return Purged(
        with_primary_writer(settings, lambda execute: purge_all(execute, settings.prefix, kind=kind))
    )
