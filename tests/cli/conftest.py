"""Fixtures for the command's tests: where a test's data lives, on each profile.

`place` is a local file always, and for sqld and replica a primary of the test's own, each test
under a table prefix of its own (sqld loads the schema for each stream a request opens, and a new
embedded replica replays its primary's whole log: a primary holding many tests' tables makes
every request and every replica slower).
`cli_helpers` runs the command itself.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harel_edge.settings import EdgeSettings, ExplicitSettings

PROFILES = [
    "local",
    pytest.param("sqld", marks=pytest.mark.sqld),
    pytest.param("replica", marks=pytest.mark.sqld),
]
_counter = itertools.count()


@dataclass
class Place:
    """Where one test's data lives, as settings and as the environment a user would set."""

    profile: str
    tmp_path: Path
    server: Any = None
    prefix: str = field(default_factory=lambda: f"c{next(_counter)}")

    def settings(self, **overrides: Any) -> EdgeSettings:
        return ExplicitSettings.load(**{**self.values(), **overrides})

    def values(self) -> dict[str, Any]:
        n = next(_counter)
        if self.profile == "local":
            return {"profile": "local", "db_path": str(self.tmp_path / f"local{n}.db")}
        if self.profile == "sqld":
            return {"profile": "sqld", "url": self.server.http_url, "auth_token": self.server.rw_token, "prefix": self.prefix}
        return {
            "profile": "replica",
            "prefix": self.prefix,
            "db_path": str(self.tmp_path / f"replica{n}.db"),
            "sync_url": self.server.http_url,
            "auth_token": self.server.rw_token,
        }


@pytest.fixture(params=PROFILES)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    server = request.getfixturevalue("fresh_sqld_primary") if request.param != "local" else None
    return Place(request.param, tmp_path, server)
