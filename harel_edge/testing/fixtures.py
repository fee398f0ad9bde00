"""pytest fixtures that hand tests a real sqld; load with `pytest_plugins = ["harel_edge.testing.fixtures"]`.

They skip when sqld cannot start, or fail with `HAREL_EDGE_REQUIRE_SQLD=1` (docs/testing.md, "Fixtures").
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from harel_edge.testing.sqld import SqldServer

REQUIRE_ENV = "HAREL_EDGE_REQUIRE_SQLD"
BACKENDS = ("docker", "binary")


def sqld_required() -> bool:
    """True when ``HAREL_EDGE_REQUIRE_SQLD`` asks for sqld tests to fail rather than skip."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def sqld_unavailable(reason: str) -> NoReturn:
    """Skip the current test because sqld cannot run, or fail it when sqld is required."""
    if sqld_required():
        pytest.fail(f"sqld is required ({REQUIRE_ENV}=1) but cannot start: {reason}", pytrace=False)
    pytest.skip(f"sqld cannot start: {reason}")


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A directory that `build` filled once for the whole test run: under pytest-xdist, the first
    worker to ask builds it while the others wait on a lock, then all share it; alone, a new one.

    For data a test only reads (or changes inside a transaction it rolls back) that takes seconds
    to make, which each worker would otherwise make again.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    shared = tmp_path_factory.getbasetemp().parent  # every worker's basetemp is one level down
    root, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(root, ignore_errors=True)  # what a failed build left
                root.mkdir()
                build(root)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root


def _start(starter: Callable[..., SqldServer], *args: Any, **kwargs: Any) -> SqldServer:
    try:
        from harel_edge.testing.sqld import SqldStartError, SqldUnavailable  # noqa: PLC0415
    except ImportError as exc:
        sqld_unavailable(f"a test dependency is missing ({exc}); install harel_edge[test]")
    try:
        return starter(*args, **kwargs)
    except ImportError as exc:
        sqld_unavailable(f"a test dependency is missing ({exc}); install harel_edge[test]")
    except (SqldUnavailable, SqldStartError) as exc:
        sqld_unavailable(str(exc))


def _primary() -> Iterator[SqldServer]:
    """Start a primary, hand it to the test, and remove it afterwards."""
    from harel_edge.testing.sqld import start_sqld_primary  # noqa: PLC0415

    server = _start(start_sqld_primary)
    try:
        yield server
    finally:
        server.close()


# The primaries tests share (session and module), while they run: what each test makes on them
# is dropped after it (`_shared_primaries_keep_only_what_was_there`).
_SHARED: list[SqldServer] = []
SHARED_FIXTURES = {"sqld_primary", "module_sqld_primary"}


def _shared_primary() -> Iterator[SqldServer]:
    for server in _primary():
        _SHARED.append(server)
        try:
            yield server
        finally:
            _SHARED.remove(server)


@pytest.fixture(scope="session")
def sqld_primary() -> Iterator[SqldServer]:
    """A sqld primary shared by the session (auth on; ``rw_token`` / ``ro_token``); the tables
    a test makes on it are dropped after the test."""
    yield from _shared_primary()


@pytest.fixture(scope="module")
def module_sqld_primary() -> Iterator[SqldServer]:
    """A sqld primary shared by one test module: a start for many tests, and a shorter log for
    each new embedded replica to replay than a primary shared by the whole run; the tables a
    test makes on it are dropped after the test."""
    yield from _shared_primary()


@pytest.fixture(scope="module")
def sqld_namespaces() -> Iterator[SqldServer]:
    """A sqld primary of many databases (namespaces, no default one; its admin API at
    ``admin_url``) for one test module; each test makes namespaces of its own."""
    from harel_edge.testing.sqld import start_sqld_primary  # noqa: PLC0415

    server = _start(start_sqld_primary, namespaces=True)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _shared_primaries_keep_only_what_was_there(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that uses a shared primary, drop the tables, views and triggers it made there:
    sqld reads the whole schema for every stream it opens, so kept ones would slow every later test."""
    if not SHARED_FIXTURES.intersection(request.fixturenames):
        yield
        return
    from harel_edge.testing.prefixes import drop_new_objects, object_names  # noqa: PLC0415

    before = {id(server): object_names(server) for server in _SHARED if server.state == "running"}
    yield
    for server in list(_SHARED):
        if server.state == "running":  # one started by this test had nothing before it
            drop_new_objects(server, before.get(id(server), set()))


@pytest.fixture
def fresh_sqld_primary() -> Iterator[SqldServer]:
    """A sqld primary of this test alone: empty, and free to be killed, paused or restarted."""
    yield from _primary()


@pytest.fixture
def sqld_replica_node(fresh_sqld_primary: SqldServer) -> Iterator[SqldServer]:
    """A sqld replica node of ``fresh_sqld_primary``: reads served locally, writes forwarded.

    Its own primary, because a node joining the session's primary replays the whole run's log."""
    from harel_edge.testing.sqld import start_sqld_replica_node  # noqa: PLC0415

    server = _start(start_sqld_replica_node, fresh_sqld_primary)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=BACKENDS)
def sqld_backend(request: pytest.FixtureRequest) -> str:
    """Each backend in turn ('docker', 'binary'), skipped (or failed if required) where it cannot run."""
    backend: str = request.param
    try:
        from harel_edge.testing.sqld import backend_unavailable_reason  # noqa: PLC0415
    except ImportError as exc:
        sqld_unavailable(f"a test dependency is missing ({exc}); install harel_edge[test]")
    reason = backend_unavailable_reason(backend)  # type: ignore[arg-type]
    if reason:
        sqld_unavailable(f"backend {backend!r}: {reason}")
    return backend


SQLD_FIXTURES = frozenset(
    {"sqld_primary", "module_sqld_primary", "fresh_sqld_primary", "sqld_replica_node", "sqld_backend"}
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``sqld`` marker, so ``--strict-markers`` runs accept it."""
    config.addinivalue_line("markers", "sqld: needs a real sqld (started by harel_edge.testing)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a sqld fixture with ``sqld``, so ``-m "not sqld"`` leaves it out."""
    for item in items:
        if SQLD_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sqld)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say in the run's header which sqld backends can run here, and whether sqld is required;
    silent where the test extras are not installed.
    """
    try:
        from harel_edge.testing.sqld import backend_unavailable_reason, sqld_image  # noqa: PLC0415
    except ImportError:
        return None
    parts = []
    for backend in BACKENDS:
        reason = backend_unavailable_reason(backend)  # type: ignore[arg-type]
        label = f"{backend} ({sqld_image()})" if backend == "docker" else backend
        parts.append(f"{label}: {'ok' if reason is None else 'unavailable'}")
    required = "required" if sqld_required() else "optional"
    chosen = os.environ.get("HAREL_EDGE_SQLD_BACKEND") or "auto"
    return f"sqld ({required}, backend {chosen}): " + "; ".join(parts)
