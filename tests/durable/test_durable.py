"""LibsqlDurable's construction check: one-commit operations need one connection."""

from __future__ import annotations

import asyncio

import pytest

from harel_edge.durable import (
    LibsqlCheckpointer,
    LibsqlDurable,
    LibsqlScheduler,
    SeparateDatabasesError,
    connect,
)
from harel_edge.settings import EdgeSettings


def test_stores_on_two_databases_are_refused_even_when_both_open_the_same_file(tmp_path) -> None:  # noqa: ANN001
    settings = EdgeSettings(db_path=str(tmp_path / "durable.db"))

    async def scenario() -> None:
        one, two = connect(settings), connect(settings)
        try:
            with pytest.raises(SeparateDatabasesError, match="same Database"):
                LibsqlDurable(LibsqlCheckpointer(one), LibsqlScheduler(two))
            durable = LibsqlDurable(LibsqlCheckpointer(one), LibsqlScheduler(one))
            assert durable.database is one
        finally:
            await one.aclose()
            await two.aclose()

    asyncio.run(scenario())
