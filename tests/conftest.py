"""Shared pytest setup for harel_edge's own tests.

Why the guard: harel_edge's sqld fixtures are a pytest plugin. Once the package declares
it as a ``pytest11`` entry point, pytest loads it by itself, and naming it here as well
would register it twice; until then (or with plugin autoloading off) it is loaded here.

Why the reordering: `make test` runs the suite on pytest-xdist workers, handed tests in
collection order one at a time (``--maxschedchunk=1``), each worker holding the test it runs
and the next one (two at first). The run ends no sooner than its longest test, so the longest
ones start first, each with a short test queued behind it rather than another long one
(docs/testing.md).
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest

_PLUGIN = "harel_edge.testing.fixtures"


def _plugin_autoloaded() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == _PLUGIN for ep in entry_points(group="pytest11"))


pytest_plugins = [] if _plugin_autoloaded() else [_PLUGIN]


def _length(item: pytest.Item) -> int:
    """0 for the longest tests (chaos and slow), 1 chaos, 2 slow, 3 the rest."""
    chaos, slow = item.get_closest_marker("chaos"), item.get_closest_marker("slow")
    if chaos and slow:
        return 0
    return 1 if chaos else 2 if slow else 3


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the long tests first, longest first, each followed by a short one; then
    the rest in pytest's order. Deterministic, as every worker must collect the same order; a
    plain run keeps pytest's order.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    by_length = sorted(items, key=_length)  # stable: pytest's order within each length
    long_items = [item for item in by_length if _length(item) < 3]
    short_items = [item for item in by_length if _length(item) == 3]
    ordered: list[pytest.Item] = []
    for item in long_items:
        ordered.append(item)
        if short_items:
            ordered.append(short_items.pop(0))
    items[:] = ordered + short_items


@pytest.fixture(autouse=True)
def _logging_as_structlog_leaves_it():
    """A test that sets up logging (a command run in this process configures structlog at the
    warning level) must not decide what the next test's `capture_logs` sees."""
    import structlog

    yield
    structlog.reset_defaults()
