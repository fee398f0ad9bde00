"""Hrana's JSON as the executor speaks it: statements and their values, and the errors a
statement or a stream comes back with (the protocol: tursodatabase/libsql's HRANA_3_SPEC)."""

from __future__ import annotations

import base64
from typing import Any

from harel_edge.executor import StatementError, Stmt, Value


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
