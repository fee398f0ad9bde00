"""A deployment of many databases (HAREL_EDGE_DATABASES): making a tenant's database and its
schema in one step, and going through each database for `migrate --all` and `status --all`,
one database's failure reported beside the others' results."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from harel_edge import retry
from harel_edge.errors import ConfigurationError, HarelEdgeError, PrimaryUnavailableError, tidy
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

T = TypeVar("T")
ADMIN_TIMEOUT = 10.0  # seconds an admin request may take; creating a namespace takes milliseconds
# Databases `--all` goes through at once: each waits mostly for round trips, and a sqld asked to
# open hundreds of namespaces at once makes them wait for connections (docs/deploy.md).
AT_ONCE = 8


@dataclass(frozen=True)
class Each:
    """What one database gave, or why it gave nothing."""

    database: str
    value: Any = None
    error: str | None = None


def each_database(settings: EdgeSettings, do: Callable[[EdgeSettings], T], *, doorbell: bool = False) -> list[Each]:
    """`do` on the settings of each database of the deployment, AT_ONCE at a time, reported in
    order (then the doorbell's, with `doorbell`, when it is not one of them); a database that
    fails is reported with its error and the others go on."""
    if not settings.databases:
        raise ConfigurationError("--all goes through HAREL_EDGE_DATABASES, which is not set: list the databases there")
    names = list(settings.databases)
    if doorbell and settings.doorbell is not None and settings.doorbell not in names:
        names.append(settings.doorbell)

    def one(name: str) -> Each:
        try:
            return Each(name, value=do(settings.for_database(name)))
        except (HarelEdgeError, OSError, RuntimeError, ValueError) as exc:
            return Each(name, error=scrub(tidy(str(exc))))

    with ThreadPoolExecutor(max_workers=AT_ONCE, thread_name_prefix="each-database") as pool:
        return list(pool.map(one, names))


def create_database(settings: EdgeSettings, name: str) -> bool:
    """Make the database `name` where the deployment's databases live: a sqld namespace through
    the admin API at HAREL_EDGE_ADMIN_URL; a file is made by its migration. True if it was made,
    False if it was there already. On Turso, make it with Turso's own tools first."""
    one = settings.for_database(name)
    if not one.has_primary:
        return not _file_exists(one.db_path)
    if not settings.admin_url:
        raise ConfigurationError(
            "HAREL_EDGE_ADMIN_URL is not set: give sqld's admin address (its --admin-listen-addr) to make "
            f"namespaces, or make {name!r} yourself (on Turso: `turso db create {name}`) and run "
            "`harel-edge --database NAME migrate`"
        )
    request = urllib.request.Request(  # noqa: S310 - the operator's own admin address
        f"{settings.admin_url.rstrip('/')}/v1/namespaces/{quote(name)}/create",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json", **_admin_auth(settings)},
    )
    try:
        with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT):  # noqa: S310
            pass
    except urllib.error.HTTPError as exc:
        said = _error_of(exc)
        if exc.code == 400 and "already exists" in said:
            return False
        if exc.code in (401, 403):
            raise ConfigurationError(
                f"sqld's admin API at {settings.admin_url} refused the request ({exc.code}): set "
                "HAREL_EDGE_ADMIN_KEY to its --admin-auth-key"
            ) from None
        raise PrimaryUnavailableError(f"sqld's admin API at {settings.admin_url} answered {exc.code}: {said}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PrimaryUnavailableError(
            f"sqld's admin API at {settings.admin_url} cannot be reached ({exc}): is sqld started with "
            "--admin-listen-addr, and HAREL_EDGE_ADMIN_URL its address?"
        ) from None
    _until_served(one)
    return True


def _until_served(one: EdgeSettings) -> None:
    """Wait (bounded) until sqld serves the namespace it has just made: it may answer "doesn't
    exist" for a moment (retry.NAMESPACE_BEING_MADE)."""
    from harel_edge.sync_sql import Statements  # noqa: PLC0415 - only a primary's namespaces need it

    statements = Statements(one)
    try:
        retry.until_served(
            lambda: statements.execute_once("SELECT 1"), lambda exc: "doesn't exist" in str(exc), retry.NAMESPACE_BEING_MADE
        )
    finally:
        statements.close()


def _admin_auth(settings: EdgeSettings) -> dict[str, str]:
    # sqld compares the header with `Basic <key>`, the key as given (not base64).
    return {"Authorization": f"Basic {settings.admin_key.get_secret_value()}"} if settings.admin_key else {}


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read() or b"{}").get("error", ""))[:300]
    except ValueError:
        return ""


def _file_exists(path: str) -> bool:
    return path != ":memory:" and Path(path).exists()
