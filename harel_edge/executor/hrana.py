"""Hrana's JSON as the executor speaks it: statements and their values, and the errors a
statement or a stream comes back with (the protocol: tursodatabase/libsql's HRANA_3_SPEC)."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

import orjson

from harel_edge.executor.base import Result, StatementError, Stmt, Value

STREAM_PIPELINE = "/v3/pipeline"
# Hrana 3's batch condition: the batch's (or the stream's) transaction still runs. A statement
# under it cannot commit on its own after the primary ended the transaction (its timeout).
IN_TRANSACTION = {"type": "not", "cond": {"type": "is_autocommit"}}
# SQL texts a grouped batch stores and names by id (`store_sql`): sqld keeps at most 50 a
# stream, and each exchange is a stream of its own; it refuses to store a text over 5 kB (and
# then the whole exchange, whose steps name it), so a longer text is sent in full each time.
STORED_SQL_AT_MOST = 40
STORED_SQL_BYTES_AT_MOST = 5000


def statement_error(error: dict[str, Any], step: int) -> StatementError:
    message = str(error.get("message") or "statement failed")
    code = error.get("code")
    return StatementError(f"{message} ({code})" if code else message, step=step, code=code)


def stmt_json(stmt: Stmt) -> dict[str, Any]:
    return {"sql": stmt.sql, "args": [encode(v) for v in stmt.args], "want_rows": True}


def encode(value: Value) -> dict[str, Any]:
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool | int):
        return {"type": "integer", "value": str(int(value))}
    if isinstance(value, float):
        return {"type": "float", "value": value}
    if isinstance(value, str):
        return {"type": "text", "value": value}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"type": "blob", "base64": base64.b64encode(bytes(value)).decode()}
    raise TypeError(f"cannot send a {type(value).__name__} as an SQL value")


def decode(value: dict[str, Any]) -> Value:
    kind = value.get("type")
    if kind == "null":
        return None
    if kind == "integer":
        return int(value["value"])
    if kind == "float":
        return float(value["value"])
    if kind == "text":
        return value["value"]
    if kind == "blob":
        return base64.b64decode(value["base64"])
    raise ValueError(f"unknown Hrana value type {kind!r}")


def result_of(raw: dict[str, Any]) -> Result:
    """One statement's Hrana result as the executor's `Result`."""
    index = raw.get("replication_index")
    rowid = raw.get("last_insert_rowid")
    return Result(
        rows=[tuple(decode(v) for v in row) for row in raw.get("rows", [])],
        affected=int(raw.get("affected_row_count") or 0),
        last_rowid=int(rowid) if rowid is not None else None,
        replication_index=int(index) if index is not None else None,
    )


def unit_result(result: dict[str, Any], statements: int) -> Any:
    """The answer to one request: a `Result` for an `execute` (`statements` 0), else the results
    of a `transaction_request`'s statements; raises the StatementError of the one that failed."""
    if result.get("type") != "ok":
        raise statement_error(result.get("error") or {}, 0)
    response = result["response"]
    if statements == 0:
        return result_of(response["result"])
    batch = response["result"]
    errors = batch.get("step_errors") or []
    for step, error in enumerate(errors[: statements + 2]):
        if error is not None:
            raise statement_error(error, step - 1)
    steps = batch["step_results"]
    if steps[statements + 1] is None:  # the COMMIT did not run: nothing was applied
        raise StatementError("the transaction was not committed", step=statements)
    return [result_of(r) for r in steps[1 : statements + 1]]


def transaction_request(stmts: list[Stmt], tail: Stmt | None = None) -> dict[str, Any]:
    """One `batch`: `BEGIN IMMEDIATE`, each statement if the step before succeeded, `COMMIT`, and
    a `ROLLBACK` that runs when the `COMMIT` did not. A `tail` (the one statement of a deferred
    unit, see `with_one_tail`) runs after them if they did, and the `COMMIT` waits on them alone."""
    steps = [{"stmt": stmt_json(Stmt("BEGIN IMMEDIATE"))}]
    for i, stmt in enumerate(stmts):
        steps.append({"stmt": stmt_json(stmt), "condition": _ok(i)})
    last = len(steps) - 1
    if tail is not None:
        steps.append({"stmt": stmt_json(tail), "condition": _ok(last)})
    steps.append({"stmt": stmt_json(Stmt("COMMIT")), "condition": _ok(last)})
    commit = len(steps) - 1
    steps.append({"stmt": stmt_json(Stmt("ROLLBACK")), "condition": {"type": "not", "cond": _ok(commit)}})
    return {"type": "batch", "batch": {"steps": steps}}


# ---- units of work sharing one transaction ------------------------------------------------------------

UNIT_SAVEPOINT = "harel_edge_unit"
NOT_RUN = object()  # a unit the transaction ended before it ran: it goes again on its own
LOCK_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED")  # the write lock was not had: nothing ran


def _ok(step: int) -> dict[str, Any]:
    return {"type": "ok", "step": step}


def _all(*conds: dict[str, Any]) -> dict[str, Any]:
    return {"type": "and", "conds": list(conds)}


# The texts every unit of a grouped batch repeats, stored under the same ids in each batch.
_FRAMING = (f"SAVEPOINT {UNIT_SAVEPOINT}", f"RELEASE {UNIT_SAVEPOINT}", f"ROLLBACK TO {UNIT_SAVEPOINT}")
_SAVEPOINT_ID, _RELEASE_ID, _ROLLBACK_TO_ID = range(1, len(_FRAMING) + 1)


def grouped_batch(units: list[list[Stmt]]) -> tuple[list[bytes], list[tuple[int, int]]]:
    """One Hrana batch running `units` in ONE transaction, a savepoint each: a unit whose
    statement fails is rolled back alone, the others commit together (one fsync on the primary).
    Returns the requests' JSON (`store_sql` for each SQL text used more than once, then the batch,
    whose steps name those texts by id: a sixth fewer bytes on the wire) and, for each unit, the
    steps of its savepoint and first statement. Each unit's steps are encoded as they are made: a
    batch of 128 units held as dicts is thousands of objects for the garbage collector to go through."""
    uses = Counter(stmt.sql for stmts in units for stmt in stmts)
    repeated = [sql for sql, n in uses.most_common() if n > 1 and len(sql.encode()) <= STORED_SQL_BYTES_AT_MOST]
    ids = {sql: n for n, sql in enumerate(repeated[: STORED_SQL_AT_MOST - len(_FRAMING)], start=len(_FRAMING) + 1)}

    def named(stmt: Stmt) -> dict[str, Any]:
        sql_id = ids.get(stmt.sql)
        if sql_id is None:
            return stmt_json(stmt)
        return {"sql_id": sql_id, "args": [encode(v) for v in stmt.args], "want_rows": True}

    def framing(sql_id: int) -> dict[str, Any]:
        return {"sql_id": sql_id, "args": [], "want_rows": True}

    parts = [orjson.dumps({"stmt": stmt_json(Stmt("BEGIN IMMEDIATE"))})]
    made = 1  # steps so far
    layout = []
    for stmts in units:
        savepoint = made
        layout.append((savepoint, savepoint + 1))
        steps: list[dict[str, Any]] = [{"stmt": framing(_SAVEPOINT_ID), "condition": IN_TRANSACTION}]
        for stmt in stmts:
            steps.append({"stmt": named(stmt), "condition": _all(_ok(made + len(steps) - 1), IN_TRANSACTION)})
        last = made + len(steps) - 1
        steps.append({"stmt": framing(_RELEASE_ID), "condition": _all(_ok(last), IN_TRANSACTION)})
        undo = made + len(steps)
        failed = {"type": "not", "cond": _ok(last)}
        steps.append({"stmt": framing(_ROLLBACK_TO_ID), "condition": _all(failed, _ok(savepoint), IN_TRANSACTION)})
        steps.append({"stmt": framing(_RELEASE_ID), "condition": _ok(undo)})
        made += len(steps)
        parts.append(orjson.dumps(steps)[1:-1])  # the unit's steps, without the list's brackets
    commit = made
    parts.append(orjson.dumps([
        {"stmt": stmt_json(Stmt("COMMIT")), "condition": IN_TRANSACTION},
        {"stmt": stmt_json(Stmt("ROLLBACK")), "condition": _all({"type": "not", "cond": _ok(commit)}, IN_TRANSACTION)},
    ])[1:-1])
    stored = [*enumerate(_FRAMING, start=1), *((sql_id, sql) for sql, sql_id in ids.items())]
    requests = [orjson.dumps({"type": "store_sql", "sql_id": sql_id, "sql": sql}) for sql_id, sql in stored]
    batch = b'{"type":"batch","batch":{"steps":[' + b",".join(parts) + b"]}}"
    return [*requests, batch], layout


def lock_refused(batch: dict[str, Any]) -> bool:
    """Whether a grouped batch's `BEGIN IMMEDIATE` failed for the primary's write lock (held by
    another transaction past the primary's wait): the transaction never began, no unit ran."""
    errors = batch.get("step_errors") or []
    error = errors[0] if errors else None
    return error is not None and (error.get("code") in LOCK_CODES or "database is locked" in str(error.get("message")))


def grouped_outcomes(
    batch: dict[str, Any], layout: list[tuple[int, int]], counts: list[int]
) -> list[list[dict[str, Any]] | StatementError | object]:
    """Each unit's raw statement results, its StatementError, or NOT_RUN (see `grouped_batch`)."""
    results, errors = batch["step_results"], batch.get("step_errors") or []
    error_at = {i: e for i, e in enumerate(errors) if e is not None}
    commit = len(results) - 2
    committed = results[commit] is not None and commit not in error_at
    outcomes: list[Any] = []
    for (savepoint, first), count in zip(layout, counts, strict=True):
        failed = next((i for i in range(first, first + count) if i in error_at), None)
        if failed is not None:
            outcomes.append(statement_error(error_at[failed], failed - first))
        elif results[savepoint] is None or (not committed and commit not in error_at):
            outcomes.append(NOT_RUN)
        elif not committed:
            outcomes.append(statement_error(error_at[commit], count))
        else:
            outcomes.append(results[first : first + count])
    return outcomes
