"""The seam through which the worker's statements reach the data: one implementation a profile.

A unit of work goes as one piece, and units in flight together are coalesced (docs/executor.md).
"""

from __future__ import annotations

from typing import Any

from harel_edge.executor.base import (
    ClosesOnce,
    Executor,
    ExecutorClosedError,
    Result,
    StatementError,
    Stmt,
    Value,
    built,
    waiting,
    with_one_tail,
)
from harel_edge.settings import EdgeSettings


def open_executor(settings: EdgeSettings, *, local_runner: Any = None) -> Executor:
    """The executor for the settings' profile: a local file (on `local_runner`'s connection if
    given, see `LocalExecutor`), or the primary over Hrana (sqld, and every write of a replica,
    whose embedded file keeps serving local reads)."""
    settings.one_database()  # a deployment's settings name no one database to open
    if settings.profile in ("sqld", "replica"):
        from harel_edge.executor.remote import HranaExecutor  # noqa: PLC0415 - only remote profiles need aiohttp

        return HranaExecutor(settings)
    from harel_edge.executor.local import LocalExecutor  # noqa: PLC0415

    return LocalExecutor(settings, runner=local_runner)


__all__ = ["ClosesOnce", "Executor", "ExecutorClosedError", "Result", "StatementError", "Stmt", "Value", "built",
           "open_executor", "waiting", "with_one_tail"]  # fmt: skip
