"""Schema version 10: durable workflows under the operator's hand. A workflow's own row (its
namespace, kept after it finishes; whether it is cancelled; what it was forked from), and the
views whose triggers cancel, resume and fork a workflow in ONE statement each (docs/durable.md,
"A workflow's states and the operator's commands").
"""

from __future__ import annotations

from dataclasses import dataclass

from harel_edge.schema import DEFAULT_PREFIX, QUEUE_BUMP, EdgeNames, dead_letters_table
from harel_edge.schema_durable import DISCARD_BODY, RAISE_FENCE

RESULT = "$result"  # the record of a finished workflow's return value (the runtime writes it)
# A workflow's states, in the order a person reads them (`workflow_state` decides between them).
STATES = ("ready", "sleeping", "running", "waiting", "finished", "dead", "cancelled")
CANCELLED = "EXISTS (SELECT 1 FROM workflow_info x WHERE x.workflow = {w} AND x.cancelled_at IS NOT NULL)"


def workflow_state(w: str, now: str, dead_letters: str | None) -> str:
    """The one rule for where workflow `w` (an SQL expression) stands at `now`, as SQL: one of
    STATES, or NULL for a workflow the database knows nothing of. `dead_letters`: the prefix's
    dead-letter table, or None where it does not exist."""
    dead = (
        f" WHEN EXISTS (SELECT 1 FROM {dead_letters} d WHERE d.kind = 'workflow' AND d.workflow = {w}) THEN 'dead'"
        if dead_letters
        else ""
    )
    return (
        f"(CASE WHEN {CANCELLED.format(w=w)} THEN 'cancelled'"
        f" WHEN EXISTS (SELECT 1 FROM workflow_checkpoint r WHERE r.workflow = {w} AND r.step = '{RESULT}') THEN 'finished'"
        f" WHEN EXISTS (SELECT 1 FROM workflow_claim c WHERE c.workflow = {w} AND c.held_until > {now}"
        f" AND c.alive_until > {now}) THEN 'running'"
        f" WHEN EXISTS (SELECT 1 FROM workflow_queue q WHERE q.workflow = {w} AND q.visible_at > {now}) THEN 'sleeping'"
        f" WHEN EXISTS (SELECT 1 FROM workflow_queue q WHERE q.workflow = {w}) THEN 'ready'"
        f"{dead}"
        f" WHEN EXISTS (SELECT 1 FROM workflow_checkpoint r WHERE r.workflow = {w})"
        f" OR EXISTS (SELECT 1 FROM workflow_info x WHERE x.workflow = {w}) THEN 'waiting'"
        f" END)"
    )


def known_namespace(w: str, dead_letters: str) -> str:
    """The namespace workflow `w` was last queued in, from its own row or its newest dead letter."""
    return (
        f"COALESCE((SELECT namespace FROM workflow_info WHERE workflow = {w}),"
        f" (SELECT namespace FROM workflow_queue WHERE workflow = {w} LIMIT 1),"
        f" (SELECT namespace FROM {dead_letters} WHERE kind = 'workflow' AND workflow = {w} ORDER BY id DESC LIMIT 1))"
    )


@dataclass(frozen=True)
class ControlNames:
    """The views version 10 adds under `prefix`."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        EdgeNames(self.prefix)  # validates the prefix

    @property
    def cancel(self) -> str:
        return f"{self.prefix}_workflow_cancel"

    @property
    def resume(self) -> str:
        return f"{self.prefix}_workflow_resume"

    @property
    def fork(self) -> str:
        return f"{self.prefix}_workflow_fork"


def workflow_info_v10() -> list[str]:
    """The workflow's own row, filled from the scheduler's queue as rows are made; an arrival for
    a cancelled workflow is recorded but wakes nothing; `delete` forgets the row too."""
    not_cancelled = CANCELLED.format(w="NEW.workflow")
    return [
        "CREATE TABLE workflow_info ("
        " workflow TEXT PRIMARY KEY,"
        " namespace TEXT,"  # the scheduler's namespace it was last queued in
        " cancelled_at REAL,"  # set by a cancel, cleared by a resume
        " forked_from TEXT, forked_step TEXT"
        ") WITHOUT ROWID",
        "INSERT INTO workflow_info (workflow, namespace) SELECT workflow, max(namespace) FROM workflow_queue GROUP BY workflow",
        "CREATE TRIGGER workflow_queue_namespace AFTER INSERT ON workflow_queue BEGIN"
        " INSERT INTO workflow_info (workflow, namespace) VALUES (NEW.workflow, NEW.namespace)"
        " ON CONFLICT (workflow) DO UPDATE SET namespace = excluded.namespace;"
        " END",
        "DROP TRIGGER workflow_arrival_insert_v6",
        "CREATE TRIGGER workflow_arrival_insert_v10 INSTEAD OF INSERT ON workflow_arrival BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at)"
        " ON CONFLICT (workflow, step) DO NOTHING;"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        f" SELECT NEW.namespace, NEW.workflow, NEW.visible_at WHERE NEW.namespace IS NOT NULL AND NOT {not_cancelled}"
        " ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP};"
        " UPDATE workflow_info SET namespace = NEW.namespace"
        " WHERE workflow = NEW.workflow AND cancelled_at IS NOT NULL AND NEW.namespace IS NOT NULL;"
        " END",
        "DROP TRIGGER workflow_discard_insert",
        "CREATE TRIGGER workflow_discard_insert_v10 INSTEAD OF INSERT ON workflow_discard BEGIN"
        f" {DISCARD_BODY}"
        " DELETE FROM workflow_info WHERE workflow = NEW.workflow AND NEW.namespace IS NOT NULL;"
        " END",
    ]


def workflow_control_v10(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Cancel, resume and fork as views: the INSERT's SELECT computes the workflow's state before
    (`workflow_state`), the trigger acts only where the command applies, RETURNING says what it found."""
    n = ControlNames(prefix)
    dl = dead_letters_table(prefix)
    return [
        f"INSERT OR IGNORE INTO workflow_info (workflow, namespace)"
        f" SELECT workflow, namespace FROM {dl} WHERE kind = 'workflow' ORDER BY id",
        # The cancel: marked, its fence raised (a running pass writes nothing more), its queue
        # row and dead letters gone (no timer, no wakeup, no requeue).
        f"CREATE VIEW {n.cancel} (workflow, at, state) AS SELECT NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {n.cancel} INSTEAD OF INSERT ON {n.cancel}"
        " WHEN NEW.state IN ('running', 'sleeping', 'ready', 'dead', 'waiting') BEGIN"
        " INSERT INTO workflow_info (workflow, namespace, cancelled_at)"
        f" VALUES (NEW.workflow, {known_namespace('NEW.workflow', dl)}, NEW.at)"
        " ON CONFLICT (workflow) DO UPDATE SET cancelled_at = excluded.cancelled_at,"
        " namespace = COALESCE(namespace, excluded.namespace);"
        f" {RAISE_FENCE}"
        " DELETE FROM workflow_queue WHERE workflow = NEW.workflow;"
        f" DELETE FROM {dl} WHERE kind = 'workflow' AND workflow = NEW.workflow;"
        " END",
        # The resume: unmarked, ready now in its namespace (where one is known) with its count of
        # failed passes reset, its dead letters gone.
        f"CREATE VIEW {n.resume} (workflow, at, state) AS SELECT NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {n.resume} INSTEAD OF INSERT ON {n.resume}"
        " WHEN NEW.state IN ('cancelled', 'dead') BEGIN"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at)"
        f" SELECT ns, NEW.workflow, NEW.at FROM (SELECT {known_namespace('NEW.workflow', dl)} AS ns) WHERE ns IS NOT NULL"
        " ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at),"
        f" generation = {QUEUE_BUMP}, failures = 0, last_error = NULL;"
        " UPDATE workflow_info SET cancelled_at = NULL WHERE workflow = NEW.workflow;"
        f" DELETE FROM {dl} WHERE kind = 'workflow' AND workflow = NEW.workflow;"
        " END",
        # The fork: the source's records written before `step`, copied in their order under the
        # new id (its result never), which is made ready in `namespace`.
        f"CREATE VIEW {n.fork} (source, step, workflow, namespace, at, outcome)"
        " AS SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0",
        f"CREATE TRIGGER {n.fork} INSTEAD OF INSERT ON {n.fork} WHEN NEW.outcome = 'forked' BEGIN"
        " INSERT INTO workflow_checkpoint (workflow, step, value, written_at)"
        " SELECT NEW.workflow, step, value, written_at FROM workflow_checkpoint"
        f" WHERE workflow = NEW.source AND step <> '{RESULT}' AND seq <"
        " (SELECT seq FROM workflow_checkpoint WHERE workflow = NEW.source AND step = NEW.step) ORDER BY seq;"
        " INSERT INTO workflow_queue (namespace, workflow, visible_at) VALUES (NEW.namespace, NEW.workflow, NEW.at);"
        " UPDATE workflow_info SET forked_from = NEW.source, forked_step = NEW.step WHERE workflow = NEW.workflow;"
        " END",
    ]
