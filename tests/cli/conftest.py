"""Fixtures for the command's tests: settings for each profile, and running `harel-edge` as a user does.

The command is run as a subprocess (the console script the package installs), with an
environment that holds only what the test sets, so a developer's own HAREL_EDGE_* variables
or `.env` cannot change what a test sees.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
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
COMMAND = str(Path(sys.executable).parent / "harel-edge")


@dataclass
class Place:
    """Where one test's data lives, as settings and as the environment a user would set."""

    profile: str
    tmp_path: Path
    server: Any = None

    def settings(self, **overrides: Any) -> EdgeSettings:
        return ExplicitSettings.load(**{**self.values(), **overrides})

    def values(self) -> dict[str, Any]:
        n = next(_counter)
        if self.profile == "local":
            return {"profile": "local", "db_path": str(self.tmp_path / f"local{n}.db")}
        if self.profile == "sqld":
            return {"profile": "sqld", "url": self.server.http_url, "auth_token": self.server.rw_token}
        return {
            "profile": "replica",
            "db_path": str(self.tmp_path / f"replica{n}.db"),
            "sync_url": self.server.http_url,
            "auth_token": self.server.rw_token,
        }


@pytest.fixture(params=PROFILES)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    server = request.getfixturevalue("fresh_sqld_primary") if request.param != "local" else None
    return Place(request.param, tmp_path, server)


def env_for(values: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    """A clean environment: PATH and the like, no HAREL_* from the caller, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAREL_", "RUST_LOG"))}
    for key, value in (values or {}).items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"HAREL_EDGE_{key.upper()}"] = str(value)
    env.update(extra)
    return env


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60, **kwargs: Any
) -> subprocess.CompletedProcess:
    """Run `harel-edge ARGS` and return what it printed and its exit code."""
    return subprocess.run(
        [COMMAND, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs
    )
