"""The schema's numbered versions from harel 0.9's tables on, each applied once, in ONE transaction
with its `user_version` bump, serialised by the write lock (docs/operations.md, "Upgrades").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from harel_edge import schema, schema_control, schema_durable, schema_flow, schema_harel
from harel_edge.errors import SchemaTooNewError
from harel_edge.executor import Stmt
from harel_edge.schema import DEFAULT_PREFIX


@dataclass(frozen=True)
class Version:
    """One step: what it adds to the objects every prefix shares (the durable stores') and to one
    prefix's own, and `marks`: names that exist in a prefix for which this is the newest version."""

    number: int
    summary: str
    shared: Callable[[], list[str]]
    prefixed: Callable[[str], list[str]]
    marks: Callable[[str], list[str]]


def _none() -> list[str]:
    return []


VERSIONS: tuple[Version, ...] = (
    Version(
        4,
        "harel 0.9's execution store and transport tables, as harel creates them",
        _none,
        schema_harel.harel_tables,
        schema_harel.harel_names,
    ),
    Version(
        5,
        "routing keys; one-statement publish and ack; the durable stores",
        schema_durable.durable_v5,
        schema.routing_v5,
        lambda prefix: [schema.EdgeNames(prefix).publish_view],
    ),
    Version(
        6,
        "claim-time round-robin, idempotent publish, dead letters, scheduler generations",
        schema_durable.durable_v6,
        lambda prefix: [*schema.claim_times_v6(prefix), *schema.publish_once_v6(prefix), *schema.dead_letters_v6(prefix)],
        lambda prefix: [schema.EdgeNames(prefix).claim_trigger],
    ),
    Version(
        7,
        "flow control: delayed publish, per-key concurrency and rate limits",
        _none,
        schema_flow.flow_control_v7,
        lambda prefix: [schema_flow.FlowNames(prefix).limits],
    ),
    Version(
        8,
        "debounced publish",
        _none,
        schema_flow.debounce_v8,
        lambda prefix: [schema_flow.FlowNames(prefix).publish_view],
    ),
    Version(
        9,
        "workers' heartbeats",
        _none,
        schema.workers_v9,
        lambda prefix: [schema.EdgeNames(prefix).workers],
    ),
    Version(
        10,
        "durable workflows' own rows: cancel, resume and fork",
        schema_control.workflow_info_v10,
        schema_control.workflow_control_v10,
        lambda prefix: [schema_control.ControlNames(prefix).fork],
    ),
    Version(
        11,
        "the doorbell of a deployment of many databases",
        _none,
        schema.doorbell_v11,
        lambda prefix: [schema.EdgeNames(prefix).doorbell],
    ),
)

SCHEMA_VERSION = VERSIONS[-1].number


def refuse_newer(found: int, where: str = "this database") -> None:
    """The one check that a database was not written by a newer harel_edge (which this one must
    not touch), with the one message that says what to do."""
    if found > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"{where} has schema version {found}, newer than {SCHEMA_VERSION} which this harel_edge "
            "understands: upgrade harel_edge here (never downgrade a database); nothing was changed"
        )


# ---- where a database and a prefix are ------------------------------------------------------------


def _present(names: Sequence[str]) -> str:
    listed = ", ".join(f"'{name}'" for name in dict.fromkeys(names))  # names are checked identifiers
    return f"(SELECT count(DISTINCT name) FROM sqlite_master WHERE name IN ({listed})) = {len(set(names))}"


def _state_columns(prefix: str) -> tuple[str, str]:
    """SQL for the database's version, and the prefix's: the newest version whose marks, and
    harel's tables (made again by version 4 where one is missing), are all there."""
    base, *later = VERSIONS
    cases = " ".join(f"WHEN {_present(v.marks(prefix))} THEN {v.number}" for v in reversed(later))
    own = f"(CASE WHEN NOT {_present(base.marks(prefix))} THEN 0 {cases} ELSE {base.number} END)"
    return "(SELECT user_version FROM pragma_user_version)", own


def state_sql(prefix: str = DEFAULT_PREFIX) -> str:
    """One read: (the database's `user_version`, the prefix's version)."""
    return "SELECT {}, {}".format(*_state_columns(prefix))


def _refusal(condition: str) -> str:
    """A statement that fails (integer overflow) unless `condition` holds: a transaction planned
    from a state someone else has since moved ends there, rolled back."""
    return f"SELECT abs(CASE WHEN {condition} THEN 0 ELSE -9223372036854775807 - 1 END)"


@dataclass(frozen=True)
class Unit:
    """One version's transaction for one prefix, planned from the state it must still find."""

    version: int
    statements: list[str]


def plan(found: int, at: int, prefix: str = DEFAULT_PREFIX) -> Unit | None:
    """The next version to apply to a database at `found` whose prefix is at `at`, or None."""
    for version in VERSIONS:
        database, own = version.number > found, version.number > at
        if not (database or own):
            continue
        user_version, prefix_version = _state_columns(prefix)
        statements = [_refusal(f"{user_version} = {found} AND {prefix_version} = {at}")]
        statements += version.shared() if database else []
        statements += version.prefixed(prefix) if own else []
        statements += [f"PRAGMA user_version = {version.number}"] if database else []
        return Unit(version.number, statements)
    return None


@dataclass(frozen=True)
class Outcome:
    """The database's version before and after, and the versions this call applied."""

    found: int
    version: int
    applied: tuple[int, ...] = ()


# ---- applying them --------------------------------------------------------------------------------

_READ = object()
Steps = Generator[Any, Any, Outcome]


def _steps(prefix: str) -> Steps:
    """The migration as requests: yields `_READ` for the state's rows, or a unit's statements
    for one transaction (sent back: None, or what it raised)."""
    found, at = _state((yield _READ))
    first, applied = found, []
    while (unit := plan(found, at, prefix)) is not None:
        error = yield unit.statements
        now = _state((yield _READ))
        if error is None:
            applied.append(unit.version)
        elif now == (found, at):  # no race lost: a real failure, and nothing of it applied
            raise error
        found, at = now
    return Outcome(first, found, tuple(applied))


def _state(rows: list[tuple]) -> tuple[int, int]:
    found, at = int(rows[0][0]), int(rows[0][1])
    refuse_newer(found)
    return found, at


async def _drive(steps: Steps, read: Callable[[], Awaitable[Any]], apply: Callable[[list[str]], Awaitable[Any]]) -> Outcome:
    """Answer `steps`' requests: `read()` for the state's rows, `apply(statements)` for a version's
    transaction (what it raised handed back: a lost race, or re-raised)."""
    reply = None
    try:
        while True:
            request = steps.send(reply)
            if request is _READ:
                reply = await read()
                continue
            try:
                await apply(request)
                reply = None
            except Exception as exc:  # noqa: BLE001 - handed back: a lost race or re-raised
                reply = exc
    except StopIteration as done:
        return done.value


async def upgrade_async(executor: Any, prefix: str = DEFAULT_PREFIX, *, state: list[tuple] | None = None) -> Outcome:
    """Apply every version the database or `prefix` lacks through an executor
    (harel_edge.executor): each version one `transaction`, so one Hrana request to a remote
    primary; reads are `execute` units, the first one spared by `state` (`state_sql`'s rows, just
    read). `schema_step.prepare` is its one caller in the package."""
    sql = state_sql(prefix)
    known = [state]

    async def read() -> Any:
        if known[0] is not None:
            rows, known[0] = known[0], None
            return rows
        return (await executor.execute(Stmt(sql))).rows

    async def apply(statements: list[str]) -> None:
        await executor.transaction([Stmt(statement) for statement in statements])

    return await _drive(_steps(prefix), read, apply)


def missing(execute: schema.Execute, prefix: str = DEFAULT_PREFIX) -> tuple[int, ...]:
    """The versions the database or `prefix` lacks, read only: for callers that must not migrate
    (`create_schema=False`); a newer database raises `SchemaTooNewError`."""
    return lacking(execute(state_sql(prefix)))


def lacking(state_rows: list[tuple]) -> tuple[int, ...]:
    """`missing`, from the answer to `state_sql`."""
    found, at = _state(state_rows)
    return tuple(v.number for v in VERSIONS if v.number > min(found, at))


# ---- as SQL, for a migration tool --------------------------------------------------------------


def migration_sql(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Every version as the statements of its transaction, for a database that has no other
    prefix (`migrate --print-sql`); each stops (integer overflow) unless the version before it is there."""
    statements, before = [], 0
    for version in VERSIONS:
        statements += [
            "BEGIN IMMEDIATE",
            _refusal(f"(SELECT user_version FROM pragma_user_version) = {before}"),
            *version.shared(),
            *version.prefixed(prefix),
            f"PRAGMA user_version = {version.number}",
            "COMMIT",
        ]
        before = version.number
    return statements

