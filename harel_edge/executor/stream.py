"""A Hrana stream of its own on the primary: a transaction that spans several round trips (a
Python effect's `transact`), rolled back by the primary if the stream is dropped."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from harel_edge.executor.base import ExecutorClosedError, Result, StatementError, Stmt
from harel_edge.executor.hrana import IN_TRANSACTION, STREAM_PIPELINE, result_of, statement_error, stmt_json


class Poster(Protocol):
    """What a stream needs of its executor: one HTTP exchange, on the stream given."""

    async def post(self, requests: list[dict[str, Any]], *, stream: Any = None) -> list[dict[str, Any]]: ...


class HranaSession:
    """One Hrana stream: statements run in order on one connection of the primary, so a
    transaction can span several requests. Closing the stream rolls back what it left open."""

    def __init__(self, executor: Poster) -> None:
        self._executor = executor
        self.url = STREAM_PIPELINE
        self.baton: str | None = None
        self.closed = False
        # A transaction began on this stream and no statement has ended it (the primary says).
        self.in_transaction = False

    def follow(self, baton: str | None, base_url: str | None) -> None:
        """Take the next request's baton (and address, when the primary moves the stream)."""
        self.baton = baton
        if base_url:
            self.url = base_url.rstrip("/") + STREAM_PIPELINE

    async def execute(self, stmt: Stmt) -> Result:
        """One statement. Once a transaction is open it runs only while the primary keeps that
        transaction open, so nothing after a transaction the primary ended commits on its own."""
        if self.closed:
            raise ExecutorClosedError("this Hrana stream was closed")
        step: dict = {"stmt": stmt_json(stmt)}
        if self.in_transaction:
            step["condition"] = IN_TRANSACTION
        batch = {"type": "batch", "batch": {"steps": [step]}}
        answer, autocommit = await self._executor.post([batch, {"type": "get_autocommit"}], stream=self)
        if answer.get("type") != "ok":
            raise statement_error(answer.get("error") or {}, 0)
        result = answer["response"]["result"]
        error = (result.get("step_errors") or [None])[0]
        raw = (result.get("step_results") or [None])[0]
        if error is None and raw is None:  # not run: the transaction it belonged to is over
            raise StatementError(
                "the primary ended this transaction before this statement (transaction timed out: it "
                "held the write lock while another writer waited); nothing of it was committed",
                code="TRANSACTION_TIMEOUT",
            )
        # The primary's word on whether a transaction is open now. Only a statement that succeeded
        # ends one here: after an error that ended it (its timeout), the rest of it is refused.
        known = autocommit.get("type") == "ok"
        is_open = not autocommit["response"]["is_autocommit"] if known else self.in_transaction
        if error is not None:
            self.in_transaction = self.in_transaction or is_open
            raise statement_error(error, 0)
        self.in_transaction = is_open
        return result_of(raw)

    async def aclose(self) -> None:
        """End the stream; best effort, since an unreachable primary drops it by itself."""
        if self.closed:
            return
        self.closed = True
        if self.baton is None:
            return
        with contextlib.suppress(Exception):
            await self._executor.post([{"type": "close"}], stream=self)
