"""Shared pytest setup for harel_edge's own tests.

Why the guard: harel_edge's sqld fixtures are a pytest plugin. Once the package declares
it as a ``pytest11`` entry point, pytest loads it by itself, and naming it here as well
would register it twice; until then (or with plugin autoloading off) it is loaded here.

Why the reordering: `make test` runs the suite on several pytest-xdist workers, each handed one
test at a time in collection order (``--maxschedchunk=1``). The run can end no sooner than its
longest test, so the long ones (marked ``chaos`` or ``slow``) are handed out first, each followed
by a short one: a worker always holds the test it runs and the next one, and a long test
queued behind another long test would start only when that one ends (docs/testing.md).
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest

_PLUGIN = "harel_edge.testing.fixtures"
LONG_MARKS = ("chaos", "slow")


def _plugin_autoloaded() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == _PLUGIN for ep in entry_points(group="pytest11"))


pytest_plugins = [] if _plugin_autoloaded() else [_PLUGIN]


def _is_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) for mark in LONG_MARKS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the long tests first, each followed by a short one; the rest in order.

    Deterministic (every worker must collect the same order); a plain run keeps pytest's order.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    long_items = [item for item in items if _is_long(item)]
    short_items = [item for item in items if not _is_long(item)]
    ordered: list[pytest.Item] = []
    for item in long_items:
        ordered.append(item)
        if short_items:
            ordered.append(short_items.pop(0))
    items[:] = ordered + short_items
