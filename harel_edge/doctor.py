"""`harel-edge doctor`'s checks: connectivity, credentials, the file, write access, schema, clock, sync.

Each finding says what to do; the checks only read (write access is a write that changes nothing).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from harel_edge import migrations
from harel_edge.access import READ_ONLY_FILE_FIX, probe
from harel_edge.errors import AuthError, DamagedDatabaseError, HarelEdgeError, PrimaryUnavailableError, tidy
from harel_edge.inspection import (
    DatabaseFacts,
    Execute,
    check_usable,
    database_facts,
    inspect_file,
    last_sync_of_replica_file,
    write_access,
    write_problem,
)
from harel_edge.schema import DB_NOW
from harel_edge.settings import EdgeSettings
from harel_edge.status import settings_summary

Level = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    """One of doctor's findings: what was checked, what was found, and what to do about it."""

    name: str
    level: Level
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


# Beyond these a skew is worth a warning / a failure. Leases are decided by the primary's clock,
# but harel's worker fires statechart timers and a workflow measures its sleeps by this one.
SKEW_WARN = 0.5
SKEW_FAIL = 5.0


def clock_skew(execute: Execute) -> tuple[float, float]:
    """(primary's clock minus this machine's, the round trip), both in seconds.

    This machine's time is the round trip's midpoint, so the error is at most half the round trip.
    """
    before = time.time()
    ((primary,),) = execute(f"SELECT {DB_NOW}")
    after = time.time()
    return float(primary) - (before + after) / 2, after - before


def skew_check(skew: float, rtt: float) -> Check:
    detail = f"the primary's clock is {skew:+.3f} s from this machine's (round trip {rtt * 1000:.1f} ms)"
    fix = (
        "synchronize this machine's clock (chrony, systemd-timesyncd or ntpd) with the primary's time source"
    )
    if abs(skew) > SKEW_FAIL:
        return Check("clock skew", "fail", detail, fix)
    if abs(skew) > SKEW_WARN:
        return Check("clock skew", "warn", detail, fix)
    return Check("clock skew", "ok", detail)


def schema_check(facts: DatabaseFacts, prefix: str) -> Check:
    found, wanted = facts.user_version, migrations.SCHEMA_VERSION
    if found > wanted:
        return Check(
            "schema version",
            "fail",
            f"version {found}, newer than this harel_edge's {wanted}",
            "upgrade harel_edge on this machine; never point an older version at a newer database",
        )
    if not facts.has_schema(prefix):
        return Check(
            "schema version",
            "warn",
            f"no harel_edge tables with prefix {prefix!r} yet",
            "run `harel-edge migrate` (or start a worker, which migrates at start)",
        )
    if found < wanted:
        return Check(
            "schema version",
            "warn",
            f"version {found}, this harel_edge uses {wanted}",
            "run `harel-edge migrate` (idempotent, safe while workers run)",
        )
    return Check("schema version", "ok", f"version {found}")


@dataclass
class Diagnosis:
    """Doctor's findings, in the order they were checked."""

    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(check.level == "fail" for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """The --json output."""
        return {"ok": not self.failed, "checks": [check.as_dict() for check in self.checks]}


def diagnose(settings: EdgeSettings) -> Diagnosis:
    """Doctor's checks, in the order a problem should be fixed; a check that an earlier failure
    makes meaningless is not run."""
    return Diagnosis(_run_checks(settings))


def _run_checks(settings: EdgeSettings) -> list[Check]:
    checks = [Check("configuration", "ok", settings_summary(settings))]
    facts = None
    if settings.has_file:
        label = "replica file" if settings.syncs else "database file"
        try:
            local = inspect_file(settings.db_path)  # with SQLite's quick_check
        except DamagedDatabaseError as exc:
            detail = f"{settings.db_path} is damaged: {exc.problems}"
            fix = (
                "restore it from a backup, or for a replica move the file (and its -wal, -shm, "
                "-client_wal_index files) aside and let it re-sync; nothing was changed"
            )
            checks.append(Check(label, "fail", detail, fix))
            return checks
        except HarelEdgeError as exc:
            checks.append(Check(label, "fail", f"{settings.db_path} cannot be used", str(exc)))
            return checks
        problem = write_problem(settings.db_path)
        writable = (
            Check("write access", "fail", problem, READ_ONLY_FILE_FIX)
            if problem
            else Check("write access", "ok", f"this user may write {settings.db_path} and beside it")
        )
        if not local.exists:
            if not settings.has_primary:
                checks.append(
                    Check(
                        label,
                        "warn",
                        f"{settings.db_path} does not exist yet",
                        "run `harel-edge migrate` or start a worker",
                    )
                )
                checks.append(writable)
                return checks
            checks.append(Check(label, "ok", f"{settings.db_path} does not exist yet: a worker creates it"))
            checks.append(writable)
        else:
            try:
                check_usable(local, settings.prefix, settings.db_path)
            except HarelEdgeError as exc:
                checks.append(Check(label, "fail", f"{settings.db_path} cannot be used", str(exc)))
                return checks
            checks.append(Check(label, "ok", f"{settings.db_path} reads cleanly (quick_check)"))
            checks.append(writable)
            if not settings.has_primary:
                facts = local
    if settings.has_primary:
        server = settings.server
        started = time.monotonic()
        try:
            primary = probe(settings)
        except PrimaryUnavailableError as exc:
            checks.append(Check("connectivity", "fail", f"cannot reach {server}", tidy(str(exc))))
            return checks
        except AuthError as exc:
            checks.append(Check("connectivity", "ok", f"{server} answers"))
            checks.append(Check("auth", "fail", "the primary refused the token", tidy(str(exc))))
            return checks
        try:
            connect_ms = (time.monotonic() - started) * 1000
            checks.append(Check("connectivity", "ok", f"{server} answers ({connect_ms:.0f} ms to connect)"))
            facts = database_facts(primary.execute)
            skew, rtt = clock_skew(primary.execute)
            allowed = write_access(primary.execute, facts, settings.prefix)
            if allowed is None:
                checks.append(
                    Check("auth", "ok", "the token is accepted (write access not checked: no tables yet)")
                )
            elif allowed:
                checks.append(Check("auth", "ok", "the token may read and write"))
            else:
                checks.append(
                    Check(  # enough for what doctor and status do: a warning, not a failure
                        "auth",
                        "warn",
                        "the token is read-only: status and doctor work with it, nothing else does",
                        "workers, publish and migrate need a read-write token: set HAREL_EDGE_AUTH_TOKEN "
                        "to one where they run",
                    )
                )
            checks.append(skew_check(skew, rtt))
        finally:
            primary.close()
    if facts is not None:
        try:
            check_usable(facts, settings.prefix, settings.server or settings.db_path)
            checks.append(schema_check(facts, settings.prefix))
        except HarelEdgeError as exc:
            checks.append(Check("schema version", "fail", "the database cannot be used", str(exc)))
    if settings.syncs:
        checks.append(_sync_health(settings))
    return checks


def _sync_health(settings: EdgeSettings) -> Check:
    """A replica's file a worker uses syncs every HAREL_EDGE_SYNC_INTERVAL: a much older last
    sync means no worker runs here, or its syncs fail."""
    last = last_sync_of_replica_file(settings.db_path)
    if last is None:
        return Check(
            "sync health",
            "warn",
            f"{settings.db_path} has never synced on this machine",
            "start a worker here (it syncs at start), or check HAREL_EDGE_DB_PATH is the workers' file",
        )
    age = max(0.0, time.time() - last)
    expected = settings.sync_interval or 5.0
    detail = f"last synced {age:.1f} s ago"
    if age > max(60.0, 10 * expected):
        idle = (
            f"; or the database had no work for HAREL_EDGE_REPLICA_IDLE_CLOSE ({settings.replica_idle_close:g} s): "
            "a deployment's worker then closes its replica, which syncs again when work comes"
            if settings.database is not None else ""
        )
        return Check(
            "sync health",
            "warn",
            detail + " (no worker may be running here, or its syncs fail)",
            "check the workers' logs for 'sync failed' lines and the harel_edge_sync_failures metric" + idle,
        )
    return Check("sync health", "ok", detail)
