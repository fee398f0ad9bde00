"""The durable stores' tables (schema versions 5 and 6): checkpoints, claims and the scheduler's
queue, and the views whose INSTEAD OF triggers make each multi-table write one statement
(docs/durable.md, "Decisions")."""

from __future__ import annotations

from harel_edge.schema import DB_NOW, QUEUE_BUMP

# A trigger's statement that raises workflow NEW.workflow's fence at NEW.at: every pass before
# it is refused from then on, and the claim row stays behind, released, carrying the number.
RAISE_FENCE = (
    "INSERT INTO workflow_claim (workflow, token, held_until, alive_until, alive_for)"
    " VALUES (NEW.workflow, 1, NEW.at, NEW.at, 0)"
    " ON CONFLICT (workflow) DO UPDATE SET token = token + 1,"
    " held_until = MIN(held_until, excluded.held_until), alive_until = MIN(alive_until, excluded.alive_until);"
)
# Forget a workflow's records and raise its fence; with a namespace, drop its queue row.
DISCARD_BODY = (
    "DELETE FROM workflow_checkpoint WHERE workflow = NEW.workflow;"
    f" {RAISE_FENCE}"
    " DELETE FROM workflow_queue WHERE namespace = NEW.namespace AND workflow = NEW.workflow;"
)


def durable_v5() -> list[str]:
    """The durable stores' tables, and views whose INSTEAD OF triggers make each of their multi-table
    writes ONE statement, RETURNING what the INSERT's own SELECT found (docs/durable.md, "Decisions")."""
    return [
        "CREATE TABLE workflow_checkpoint ("
        " seq INTEGER PRIMARY KEY,"
        " workflow TEXT NOT NULL,"
        " step TEXT NOT NULL,"
        " value TEXT NOT NULL,"
        f" written_at REAL NOT NULL DEFAULT ({DB_NOW}),"
        " UNIQUE (workflow, step))",
        "CREATE TABLE workflow_claim ("
        " workflow TEXT PRIMARY KEY,"
        " token INTEGER NOT NULL,"
        " held_until REAL NOT NULL,"
        " alive_until REAL NOT NULL,"
        " alive_for REAL NOT NULL"
        ") WITHOUT ROWID",
        "CREATE TABLE workflow_queue ("
        " namespace TEXT NOT NULL,"
        " workflow TEXT NOT NULL,"
        " visible_at REAL NOT NULL,"
        " PRIMARY KEY (namespace, workflow)"
        ") WITHOUT ROWID",
        "CREATE INDEX workflow_queue_visible_at ON workflow_queue (namespace, visible_at)",
        # A holder's write: fenced on (token, budget), first write of a key wins, and a sign of
        # life for the claim. `held` and `existed` are computed before the trigger runs.
        "CREATE VIEW workflow_record"
        " (workflow, step, value, written_at, token, held, existed)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        "CREATE TRIGGER workflow_record_insert INSTEAD OF INSERT ON workflow_record"
        " WHEN NEW.held BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " UPDATE workflow_claim SET alive_until = MIN(NEW.written_at + alive_for, held_until)"
        " WHERE workflow = NEW.workflow AND token = NEW.token;"
        " END",
        # A write from outside the workflow (supply, append, arrive, deliver): first write of a
        # key wins; with a namespace, the workflow is also made ready (never later than it was).
        "CREATE VIEW workflow_arrival"
        " (workflow, step, value, written_at, namespace, visible_at)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        # Version 6 replaces it with one that also bumps the row's generation.
        "CREATE TRIGGER workflow_arrival_insert INSTEAD OF INSERT ON workflow_arrival BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        " SELECT NEW.namespace, NEW.workflow, NEW.visible_at WHERE NEW.namespace IS NOT NULL"
        " ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at);"
        " END",
        # Forget a workflow's records and raise its fence (and, with a namespace, drop its
        # queue row). The claim row stays behind, released, carrying the raised number.
        "CREATE VIEW workflow_discard (workflow, namespace, at, records)"
        " AS SELECT NULL, NULL, NULL, NULL WHERE 0",
        "CREATE TRIGGER workflow_discard_insert INSTEAD OF INSERT ON workflow_discard BEGIN"
        f" {DISCARD_BODY}"
        " END",
    ]


# ---- version 6 ---------------------------------------------------------------------------------


def durable_v6() -> list[str]:
    """Scheduler rows get a generation (a delivery's receipt) that an arrival bumps, and count
    their failed passes for dead-lettering."""
    return [
        "ALTER TABLE workflow_queue ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        "DROP TRIGGER workflow_arrival_insert",
        "CREATE TRIGGER workflow_arrival_insert_v6 INSTEAD OF INSERT ON workflow_arrival BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        " SELECT NEW.namespace, NEW.workflow, NEW.visible_at WHERE NEW.namespace IS NOT NULL"
        " ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP};"
        " END",
        "ALTER TABLE workflow_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workflow_queue ADD COLUMN last_error TEXT",
    ]
