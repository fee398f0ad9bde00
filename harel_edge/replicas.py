"""The embedded replicas a worker process keeps of the databases it serves: a deployment's opened
when its database has work and closed after a quiet spell, never more open than a bound, since
each holds about eight files and syncs with its primary every HAREL_EDGE_SYNC_INTERVAL."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from harel_edge import retry
from harel_edge.connection import EdgeConnection, primary_answers
from harel_edge.errors import AuthError, ConfigurationError, PrimaryUnavailableError
from harel_edge.settings import EdgeSettings

# Measured with libsql 0.1.8 (docs/deploy.md): the file twice, its -wal, -shm and
# -client_wal_index, and about three sockets to the primary; all given back at close.
FILES_PER_REPLICA = 8
LOOK_EVERY = 1.0  # seconds between looks at which databases did work
OPEN_AGAIN_AFTER = 30.0  # seconds before a replica that would not open is tried again, doubled each time
OPEN_AGAIN_AT_MOST = 600.0  # the longest wait between two tries
# libsql opens a replica holding the GIL until its primary answers, however long (measured: a paused
# primary froze the whole process for as long as it was paused), so an open waits for the primary to
# answer over Hrana first, for this long at most.
PRIMARY_ANSWERS_WITHIN = 5.0
# Replicas opening at once: each opens and syncs on a thread of the loop's default executor, which
# the worker's other blocking calls share.
OPENING_AT_ONCE = 2

log = structlog.get_logger("harel_edge.worker")


@dataclass
class _Kept:
    """One database's replica and what says it is busy."""

    name: str  # the database's, or its file's when a process serves one
    settings: EdgeSettings
    settled: Callable[[], int]
    seen: int = 0  # settled() at the last look
    busy_at: float | None = None  # when work was last seen (monotonic); None: none yet
    connection: EdgeConnection | None = None
    opening: asyncio.Task | None = None
    failed_at: float | None = None
    failures: int = 0  # opens failed in a row
    given_up: bool = False  # a failure that trying again cannot mend (a refused token, a bad path)
    left: bool = False

    def may_try_at(self) -> float:
        """When an open may be tried again after the failures so far."""
        if self.failed_at is None:
            return float("-inf")
        return self.failed_at + min(OPEN_AGAIN_AFTER * 2 ** (self.failures - 1), OPEN_AGAIN_AT_MOST)


class Replicas:
    """At most `max_open` embedded replicas open at once, each opened when its database is seen
    doing work and closed after `idle_close` seconds without (None: kept while it is served). A
    busy database finds room when another's replica closes; none is closed to make room."""

    def __init__(self, max_open: int, idle_close: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_open = max_open
        self.idle_close = idle_close
        self.clock = clock
        self._kept: dict[str, _Kept] = {}
        self._full_said = False
        self._open_slots = asyncio.Semaphore(OPENING_AT_ONCE)

    @classmethod
    def of_deployment(cls, settings: EdgeSettings) -> Replicas:
        """The replicas of a deployment's worker, refused at start when the bound's files could
        not all be open under this process's limit on open files."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = settings.max_open_replicas * FILES_PER_REPLICA
        if soft != resource.RLIM_INFINITY and needed > soft:
            raise ConfigurationError(
                f"HAREL_EDGE_MAX_OPEN_REPLICAS={settings.max_open_replicas} replicas hold about {needed} open files, "
                f"more than this process may open ({soft}, `ulimit -n`): lower HAREL_EDGE_MAX_OPEN_REPLICAS to "
                f"{max(1, soft // (2 * FILES_PER_REPLICA))} or raise the limit"
            )
        return cls(settings.max_open_replicas, settings.replica_idle_close)

    def is_open(self, name: str) -> bool:
        kept = self._kept.get(name)
        return kept is not None and kept.connection is not None

    def open_count(self) -> int:
        return sum(kept.connection is not None for kept in self._kept.values())

    async def keep(self, name: str, settings: EdgeSettings, settled: Callable[[], int], *, now: bool = False) -> None:
        """Keep `name`'s replica (its settings', profile replica) while it is served: opened when
        `settled()` moves, or with `now` at once (a process's only database syncs at start)."""
        await self.leave(name)  # a database's worker started again: one replica of a file at a time
        kept = _Kept(name, settings, settled, seen=settled())
        self._kept[name] = kept
        if now:
            kept.busy_at = self.clock()
            await self._start_open(kept)

    async def leave(self, name: str) -> None:
        """`name` is no longer served: its replica is closed (one being opened, once it is, so its
        file is free again when this returns)."""
        kept = self._kept.pop(name, None)
        if kept is None:
            return
        kept.left = True
        if kept.opening is not None:
            await asyncio.wait([kept.opening])  # it closes what it opens, since it was left
        await self._close(kept, "its database is no longer served")

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: every LOOK_EVERY, open the replicas of the databases that did work, as
        room allows, and close those idle for `idle_close`; at the end, close every one."""
        try:
            while not stop.is_set():
                try:
                    await self.look()
                except Exception as exc:  # noqa: BLE001 - the next look tries again; the worker goes on
                    log.error("looking at the embedded replicas failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
                await retry.wait_any([stop], LOOK_EVERY)
        finally:
            for kept in list(self._kept.values()):
                kept.left = True
                await self._close(kept, "the worker stops")
            await self.opened()  # each closes what it opened

    async def opened(self) -> None:
        """Wait for the replicas being opened, opened or failed."""
        # A left database's open is waited for by its `leave`: those still kept are the ones to wait for.
        await asyncio.gather(*(kept.opening for kept in self._kept.values() if kept.opening), return_exceptions=True)

    async def look(self) -> None:
        """One look: which databases did work since the last, and what to open and close for it."""
        now = self.clock()
        for kept in self._kept.values():
            settled = kept.settled()
            if settled != kept.seen:
                kept.seen, kept.busy_at = settled, now
        for kept in list(self._kept.values()):
            if kept.connection is not None and not self._recent(kept, now):
                await self._close(kept, f"no work for {self.idle_close:g} s")
        wanting = sorted(  # the most recently busy first: the one likeliest still to work
            (-kept.busy_at, name) for name, kept in self._kept.items()
            if self._recent(kept, now) and kept.connection is None and kept.opening is None
            and not kept.given_up and now >= kept.may_try_at()
        )
        room = self.max_open - sum(
            kept.connection is not None or kept.opening is not None for kept in self._kept.values()
        )
        for _busy_at, name in wanting[: max(0, room)]:
            self._start_open(self._kept[name])
        waiting = len(wanting) - max(0, room)
        if waiting > 0 and not self._full_said:
            log.warning(
                "busy databases wait for an embedded replica: the most that may be open are open",
                waiting=waiting, max_open_replicas=self.max_open,
                hint="raise HAREL_EDGE_MAX_OPEN_REPLICAS (and `ulimit -n`), or lower HAREL_EDGE_REPLICA_IDLE_CLOSE",
            )
        self._full_said = waiting > 0

    def _recent(self, kept: _Kept, now: float) -> bool:
        """Whether the database did work within `idle_close` (ever, with None)."""
        if kept.busy_at is None:
            return False
        return self.idle_close is None or now - kept.busy_at < self.idle_close

    def _start_open(self, kept: _Kept) -> asyncio.Task:
        task = asyncio.create_task(self._open(kept), name=f"replica:{kept.name}")
        kept.opening = task
        return task

    async def _open(self, kept: _Kept) -> None:
        # One attempt an open: this class tries again, OPEN_AGAIN_AFTER apart, so a stop waits for one at most.
        settings = kept.settings.model_copy(update={"retry_attempts": 1})
        try:
            async with self._open_slots:
                try:
                    await asyncio.wait_for(primary_answers(settings), PRIMARY_ANSWERS_WITHIN)
                except TimeoutError:
                    raise PrimaryUnavailableError(
                        f"the primary did not answer within {PRIMARY_ANSWERS_WITHIN:g} s"
                    ) from None
                opening = asyncio.ensure_future(asyncio.to_thread(EdgeConnection, settings))
                try:
                    connection = await asyncio.shield(opening)  # its thread goes on if we are cancelled
                except asyncio.CancelledError:
                    opening.add_done_callback(_close_when_opened)
                    raise
        except Exception as exc:  # noqa: BLE001 - only this machine's local reads depend on it
            self._failed(kept, exc)
            return
        finally:
            kept.opening = None
        kept.failed_at, kept.failures = None, 0
        if kept.left:  # stopped serving it while it opened
            await asyncio.to_thread(connection.close)
            return
        kept.connection = connection
        log.info("embedded replica opened", database=kept.name, open=self.open_count())

    def _failed(self, kept: _Kept, exc: Exception) -> None:
        kept.failed_at, kept.failures = self.clock(), kept.failures + 1
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        if isinstance(exc, (AuthError, ConfigurationError)):  # the same again until the worker restarts
            kept.given_up = True
            log.error(
                "embedded replica not opened, and not tried again: this machine's local reads (status) stay as "
                "they are", database=kept.name, error=error,
                hint="mend what the error names (the token, the sync URL, the file) and restart the worker",
            )
            return
        log.warning(
            "embedded replica not opened: this machine's local reads (status) stay as they are",
            database=kept.name, retry_in=kept.may_try_at() - kept.failed_at, error=error,
        )

    async def _close(self, kept: _Kept, why: str) -> None:
        connection, kept.connection = kept.connection, None
        if connection is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.to_thread(connection.close)
        log.info("embedded replica closed", database=kept.name, reason=why, open=self.open_count())


def _close_when_opened(opening: asyncio.Future) -> None:
    """Close a replica whose opening was abandoned, once its thread has made it."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
