"""The queue's two faces: `AsyncLibsqlTransport`, the core opening its own executor, and
`LibsqlTransport`, the same core for sync callers on a loop thread (no SQL or retry of its own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge.doorbell import Ringer
from harel_edge.executor import open_executor
from harel_edge.loop_thread import SyncFace
from harel_edge.queue.core import EventTransport
from harel_edge.queue.leases import Clock
from harel_edge.queue.messages import Message
from harel_edge.schema_step import prepare
from harel_edge.server_url import is_url
from harel_edge.settings import EdgeSettings, ExplicitSettings

GIVE_BACK_SECONDS = 2.0  # how long a closing transport tries to give back the leases it claimed ahead


class AsyncLibsqlTransport(EventTransport):
    """harel's `AsyncTransport` on libSQL, owning its executor: `await
    AsyncLibsqlTransport.from_settings()` or `.create(...)`. A publish to a database of a
    deployment with a doorbell rings it (`harel_edge.doorbell`)."""

    def __init__(self, executor: Any, settings: EdgeSettings, **core: Any) -> None:
        super().__init__(executor, settings, **core)
        self._ringer = Ringer(settings)

    @classmethod
    async def create(
        cls,
        database: str | Path = ":memory:",
        clock: Clock | None = None,
        *,
        auth_token: str = "",
        sync_url: str | None = None,
        sync_interval: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        create_schema: bool = True,
        routing_keys: Sequence[str] = (),
        max_deliveries: int = 0,
    ) -> AsyncLibsqlTransport:
        """Open the transport `database` names (a file, a server URL, or a replica's file with
        `sync_url`), without blocking the loop."""
        settings = _settings_for(database, auth_token, sync_url, sync_interval, prefix, routing_keys)
        return await cls.from_settings(settings, clock, create_schema=create_schema, max_deliveries=max_deliveries)

    @classmethod
    async def from_settings(
        cls,
        settings: EdgeSettings | None = None,
        clock: Clock | None = None,
        *,
        create_schema: bool = True,
        max_deliveries: int = 0,
        **core: Any,
    ) -> AsyncLibsqlTransport:
        """The transport the settings describe (`EdgeSettings.load()` when none are given);
        `core`: `EventTransport`'s other options (`concurrency`, `prefetch`)."""
        settings = settings or EdgeSettings.load()
        self = cls(open_executor(settings), settings, clock=clock, max_deliveries=max_deliveries, **core)
        try:
            # A library face opens the database it is pointed at (`adopt`): the worker and
            # `harel-edge migrate` are where another application's tables are refused.
            await prepare(self.path.executor, settings, migrate=create_schema, adopt=True)
        except BaseException:
            await self.path.executor.aclose()
            raise
        return self

    def __repr__(self) -> str:  # never the token
        return f"<AsyncLibsqlTransport prefix={self.settings.prefix} profile={self.settings.profile} {self.path.executor!r}>"

    async def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        queued = await super().publish_many(messages)
        if queued:
            await self._ringer.ring()  # after the commit: the worker woken finds the events
        return queued

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> list[tuple]:
        """One statement of the caller's through this transport's executor (inspection, tools)."""
        return (await self.path.execute(statement, *params)).rows

    async def close(self) -> None:
        """Give back the leases claimed ahead and not handed out (their groups would wait for
        them to lapse), send what is queued, then close the connections."""
        try:
            if (self.buffered or self._tails) and not self.path.executor.closed:
                # Best effort, bounded: a lease not given back lapses by itself.
                with contextlib.suppress(Exception, asyncio.TimeoutError):
                    await asyncio.wait_for(self.release_held(buffered_only=True), GIVE_BACK_SECONDS)
        finally:
            await self._ringer.aclose()
            await self.path.executor.aclose()


class LibsqlTransport(SyncFace):
    """harel's sync `Transport` on libSQL: the async core run on a loop thread of its own, so a
    sync caller gets the same rows, guarantees and speed; safe to share between threads."""

    def __init__(
        self,
        database: str | Path = ":memory:",
        clock: Clock | None = None,
        *,
        auth_token: str = "",
        sync_url: str | None = None,
        sync_interval: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        create_schema: bool = True,
        routing_keys: Sequence[str] = (),
        settings: EdgeSettings | None = None,
        max_deliveries: int = 0,
        pair_with_store: bool = False,
    ) -> None:
        """`database` is a file (local), a server URL (sqld), or the replica's file with
        `sync_url` (replica); or pass `settings`. `clock=None` uses the database's clock.
        `pair_with_store`: each claim brings its execution, for an `EdgeStore(transport=...)` on
        this transport to serve, and that store's commits carry the next claim."""
        if settings is None:
            settings = _settings_for(database, auth_token, sync_url, sync_interval, prefix, routing_keys)
        self.settings = settings
        # Paired: one lease a claim (harel's sync worker handles one at a time), with its execution.
        paired = {"concurrency": 1, "prefetch": True} if pair_with_store else {}
        opener = AsyncLibsqlTransport.from_settings(
            settings, clock, create_schema=create_schema, max_deliveries=max_deliveries, **paired
        )
        self._core: AsyncLibsqlTransport = self._start("harel-edge-transport", opener)

    @classmethod
    def from_settings(cls, settings: EdgeSettings | None = None, clock: Clock | None = None) -> LibsqlTransport:
        """The transport the settings describe (`EdgeSettings.load()` when none are given)."""
        return cls(settings=settings or EdgeSettings.load(), clock=clock)

    def __repr__(self) -> str:  # never the token
        return f"<LibsqlTransport prefix={self.settings.prefix} profile={self.settings.profile}>"

    @property
    def clock(self) -> Clock | None:
        """The injected clock, or None for the database's."""
        return self._core.clock if self._core is not None else None

    @property
    def max_deliveries(self) -> int:
        return self.core.max_deliveries

    def publish(
        self,
        group_id: str,
        event: Event,
        priority: int = 0,
        routing_key: str | None = None,
        **flow: Any,
    ) -> None:
        """`EventTransport.publish`: `flow` is `limit_key`, `delay`, `at`, `debounce`,
        `debounce_key` and `max_wait` (`Message`'s fields)."""
        self._call(self.core.publish(group_id, event, priority, routing_key, **flow))

    def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        return self._call(self.core.publish_many(list(messages)))

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, routing_keys: Sequence[str] | None = None
    ) -> Lease | None:
        return self._call(self.core.claim(worker_id, visibility, min_priority, routing_keys))

    def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0, routing_keys: Sequence[str] | None = None
    ) -> list[Lease]:
        return self._call(self.core.claim_many(worker_id, visibility, n, min_priority, routing_keys))

    def ack(self, lease: Lease) -> bool:
        return self._call(self.core.ack(lease))

    def ack_many(self, leases: Sequence[Lease]) -> list[bool]:
        return self._call(self.core.ack_many(list(leases)))

    def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        return self._call(self.core.nack(lease, delay))

    def failed(self, lease: Lease, error: BaseException | str) -> None:
        self.core.failed(lease, error)

    def deliveries(self, lease: Lease) -> int | None:
        return self.core.deliveries(lease)

    def bury(self, lease: Lease) -> bool:
        return self._call(self.core.bury(lease))

    def depth(self) -> int:
        return self._call(self.core.depth())

    def execute(self, statement: str, params: Sequence[Any] = ()) -> list[tuple]:
        """One statement of the caller's through this transport's executor (inspection, tools)."""
        return self._call(self.core.execute(statement, params))


def _settings_for(
    database: str | Path,
    auth_token: str,
    sync_url: str | None,
    sync_interval: float | None,
    prefix: str,
    routing_keys: Sequence[str],
) -> EdgeSettings:
    """The settings for the arguments harel's own transports take (a path, a URL, a sync URL)."""
    database = str(database)
    values: dict[str, Any] = {"prefix": prefix, "routing_keys": tuple(routing_keys)}
    if auth_token:
        values["auth_token"] = auth_token
    if sync_url is not None:
        values.update(profile="replica", db_path=database, sync_url=sync_url, sync_interval=sync_interval)
    elif is_url(database):
        values.update(profile="sqld", url=database)
    else:
        values.update(profile="local", db_path=database)
    return ExplicitSettings.load(**values)
