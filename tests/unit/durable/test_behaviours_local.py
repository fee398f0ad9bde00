"""Every behaviour of `behaviours.py` on the local profile: one SQLite file per test."""

from __future__ import annotations

import asyncio

import pytest
from behaviours import ALL, Behaviour, open_stores

from harel_edge.settings import EdgeSettings


@pytest.mark.parametrize("behaviour", ALL, ids=[b.__name__ for b in ALL])
def test_on_a_local_file(behaviour: Behaviour, tmp_path) -> None:  # noqa: ANN001
    async def scenario() -> None:
        stores = await open_stores(EdgeSettings(db_path=str(tmp_path / "durable.db")))
        try:
            await behaviour(stores)
        finally:
            await stores.database.aclose()

    asyncio.run(scenario())
