"""Every contract test runs on each profile: a local file always, sqld and replica on a real sqld.

`edge` builds fresh settings for the test's profile, on a sqld primary of the test's own: sqld
opens a database connection for each Hrana stream, which loads the schema, so a primary holding
every test's tables makes each request slower; and a new embedded replica replays the primary's
whole log. Each call gets its own table prefix, so two
transports of one test share the database but not each other's rows unless asked to (which is
also the prefix isolation a deployment relies on).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harel_edge.settings import EdgeSettings, ExplicitSettings

PROFILES = ["local", pytest.param("sqld", marks=pytest.mark.sqld), pytest.param("replica", marks=pytest.mark.sqld)]
_counter = itertools.count()


@dataclass
class Edge:
    """Where a test's data lives, and fresh settings for it."""

    profile: str
    tmp_path: Path
    server: Any = None

    def settings(self, **overrides: Any) -> EdgeSettings:
        n = next(_counter)
        values: dict[str, Any] = {"profile": self.profile, "prefix": f"t{n}", "retry_deadline": 20.0}
        if self.profile == "local":
            values["db_path"] = str(self.tmp_path / f"local{n}.db")
        elif self.profile == "sqld":
            values.update(url=self.server.http_url, auth_token=self.server.rw_token)
        else:
            values.update(
                db_path=str(self.tmp_path / f"replica{n}.db"),
                sync_url=self.server.http_url,
                auth_token=self.server.rw_token,
            )
        values.update(overrides)
        return ExplicitSettings.load(**values)

    def peer(self, settings: EdgeSettings) -> EdgeSettings:
        """Settings for a second worker on the same data (its own replica file on `replica`)."""
        if self.profile != "replica":
            return settings
        n = next(_counter)
        return settings.model_copy(update={"db_path": str(self.tmp_path / f"peer{n}.db")})


@pytest.fixture(params=PROFILES)
def edge(request: pytest.FixtureRequest, tmp_path: Path) -> Edge:
    server = request.getfixturevalue("fresh_sqld_primary") if request.param != "local" else None
    return Edge(request.param, tmp_path, server)


@pytest.fixture
def make_transport(edge: Edge) -> Callable[..., Any]:
    from harel_edge import LibsqlTransport

    made: list[Any] = []

    def make(clock: Callable[[], float] | None = None, **overrides: Any) -> Any:
        transport = LibsqlTransport(settings=edge.settings(**overrides), clock=clock)
        made.append(transport)
        return transport

    yield make
    for transport in made:
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - already closed by the test
            pass
