"""Every behaviour of `behaviours.py` on every profile: a local file of its own per test, and a
real sqld primary over HTTP and through an embedded replica (one primary for the session; each
behaviour uses workflow ids and namespaces of its own)."""

from __future__ import annotations

import asyncio

import pytest
from behaviours import ALL, Behaviour, open_stores, settings_for

PROFILES = ["local", pytest.param("sqld", marks=pytest.mark.sqld), pytest.param("replica", marks=pytest.mark.sqld)]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("behaviour", ALL, ids=[b.__name__ for b in ALL])
def test_each_durable_behaviour_holds_on_each_profile(
    behaviour: Behaviour, profile: str, request: pytest.FixtureRequest, tmp_path  # noqa: ANN001
) -> None:
    settings = settings_for(profile, request, tmp_path)

    async def scenario() -> None:
        stores = await open_stores(settings)
        try:
            await behaviour(stores)
        finally:
            await stores.database.aclose()

    asyncio.run(scenario())
