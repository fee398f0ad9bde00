"""A deployment's doorbell (HAREL_EDGE_DOORBELL): a publisher rings for the database it published
to, in one database every worker of the deployment reads, so a worker polls its idle databases
about once a minute and still takes a new event within a second (docs/deploy.md, "The doorbell")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from harel_edge.executor import Executor, Stmt, open_executor
from harel_edge.redaction import scrub
from harel_edge.schema import EdgeNames
from harel_edge.schema_step import prepare
from harel_edge.settings import EdgeSettings

log = structlog.get_logger("harel_edge.doorbell")

LISTEN_EVERY = 0.5  # seconds between a worker's reads of the doorbell: a ring is heard within this
# The longest pause of an idle database's poll and heartbeat when a doorbell wakes it: what a
# publish that does not ring (harel's own transport, raw SQL) may wait.
IDLE_MAX = 90.0


def ring_sql(prefix: str) -> str:
    """SQL: ring for database `?`, numbered after every earlier ring of any database."""
    bell = EdgeNames(prefix).doorbell
    return (
        f"INSERT INTO {bell} (database, rung) VALUES (?, (SELECT coalesce(max(rung), 0) + 1 FROM {bell}))"
        " ON CONFLICT (database) DO UPDATE SET rung = excluded.rung"
    )


def rung_sql(prefix: str) -> str:
    """SQL: the databases rung for since ring number `?`, with their latest ring's number."""
    return f"SELECT database, rung FROM {EdgeNames(prefix).doorbell} WHERE rung > ? ORDER BY rung"


def last_sql(prefix: str) -> str:
    return f"SELECT coalesce(max(rung), 0) FROM {EdgeNames(prefix).doorbell}"


class Ringer:
    """A publisher's side: rings for its database after a publish, on the doorbell database's
    executor, opened at the first ring. Best effort: a ring that fails is logged, and the event
    is taken at the worker's next poll of that database (within IDLE_MAX)."""

    def __init__(self, settings: EdgeSettings) -> None:
        self._bell = settings.doorbell_settings() if settings.database is not None else None
        self._database = settings.database
        self._executor: Executor | None = None

    def __repr__(self) -> str:  # never the token
        return f"<Ringer for {self._database!r}>" if self._bell is not None else "<Ringer (no doorbell)>"

    async def ring(self) -> None:
        if self._bell is None:
            return
        try:
            if self._executor is None:
                self._executor = open_executor(self._bell)
            await self._executor.execute(Stmt(ring_sql(self._bell.prefix), (self._database,)))
        except Exception as exc:  # noqa: BLE001 - the publish is done; only its wake-up is late
            _not_rung(self._database, self._bell, exc)

    async def aclose(self) -> None:
        if self._executor is not None:
            await self._executor.aclose()


async def ring_once(settings: EdgeSettings) -> None:
    """One ring for `settings`' database on an executor of its own (a caller that rings rarely:
    a workflow asked for), best effort as `Ringer.ring`; nothing without a doorbell."""
    ringer = Ringer(settings)
    try:
        await ringer.ring()
    finally:
        await ringer.aclose()


def ring_for(settings: EdgeSettings) -> None:
    """A sync caller's ring for its database (an operator's requeue), best effort as `Ringer.ring`."""
    bell = settings.doorbell_settings() if settings.database is not None else None
    if bell is None:
        return
    from harel_edge.sync_sql import Statements  # noqa: PLC0415 - sync callers only

    try:
        statements = Statements(bell)
        try:
            statements.execute_once(ring_sql(bell.prefix), (settings.database,))
        finally:
            statements.close()
    except Exception as exc:  # noqa: BLE001 - what was queued is queued; only its wake-up is late
        _not_rung(settings.database, bell, exc)


def _not_rung(database: str | None, bell: EdgeSettings, exc: Exception) -> None:
    log.warning(
        "the doorbell was not rung: a worker takes the event at its next poll of the database",
        database=database, doorbell=bell.database, error=scrub(f"{type(exc).__name__}: {exc}")[:300],
    )


async def listen(settings: EdgeSettings, wake: Callable[[str], None], stop: asyncio.Event, *, migrate: bool) -> None:
    """Until `stop`: every LISTEN_EVERY, read the rings since the last one seen and `wake` each
    database rung for. Raises when the doorbell fails (the caller restarts it)."""
    bell = settings.doorbell_settings()
    if bell is None:
        raise ValueError("listen() needs settings with HAREL_EDGE_DOORBELL")
    executor = open_executor(bell)
    try:
        await prepare(executor, bell, migrate=migrate)
        seen = int((await executor.execute(Stmt(last_sql(bell.prefix)))).rows[0][0])
        while not stop.is_set():
            for database, rung in (await executor.execute(Stmt(rung_sql(bell.prefix), (seen,)))).rows:
                seen = max(seen, int(rung))
                wake(str(database))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), LISTEN_EVERY)
    finally:
        await executor.aclose()
