"""Shared pytest setup for harel_edge's own tests.

Why the guard: harel_edge's sqld fixtures are a pytest plugin. Once the package declares
it as a ``pytest11`` entry point, pytest loads it by itself, and naming it here as well
would register it twice; until then (or with plugin autoloading off) it is loaded here.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

_PLUGIN = "harel_edge.testing.fixtures"


def _plugin_autoloaded() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == _PLUGIN for ep in entry_points(group="pytest11"))


pytest_plugins = [] if _plugin_autoloaded() else [_PLUGIN]
