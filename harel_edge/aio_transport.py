"""AsyncLibsqlTransport: harel's async transport on the event path, on every profile: each call
is a unit of work of the profile's executor (docs/executor.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from harel.engine.schema import DEFAULT_PREFIX

from harel_edge import schema
from harel_edge.event_path import EventPath, EventTransport
from harel_edge.executor import Executor, blocking_execute, open_executor
from harel_edge.executor.local import LocalExecutor
from harel_edge.settings import EdgeSettings, settings_for_database
from harel_edge.transport import Clock, LibsqlTransport, check_schema


class AsyncLibsqlTransport(EventTransport):
    """harel's `AsyncTransport` on libSQL: `await AsyncLibsqlTransport.from_settings()` or
    `.create(...)`; `AsyncLibsqlTransport(sync_transport)` takes over an open sync transport's
    settings, clock and (locally) connection, and closes it when closed."""

    def __init__(self, sync_transport: LibsqlTransport) -> None:
        settings = sync_transport.settings
        if settings.profile == "local":
            executor: Executor = LocalExecutor(settings, connection=sync_transport.connection)
        else:
            executor = open_executor(settings)
        super().__init__(EventPath(executor, settings, clock=sync_transport.clock))
        self.settings = settings
        self._sync: LibsqlTransport | None = sync_transport

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
    ) -> AsyncLibsqlTransport:
        """Open the transport `database` names (a file, a server URL, or a replica's file with
        `sync_url`), without blocking the loop."""
        settings = settings_for_database(database, auth_token, sync_url, sync_interval, prefix, routing_keys)
        return await cls._open(settings, clock, create_schema)

    @classmethod
    async def from_settings(cls, settings: EdgeSettings | None = None, clock: Clock | None = None) -> AsyncLibsqlTransport:
        """The transport the settings describe (`EdgeSettings.load()` when none are given)."""
        return await cls._open(settings or EdgeSettings.load(), clock, True)

    @classmethod
    async def _open(cls, settings: EdgeSettings, clock: Clock | None, create_schema: bool) -> AsyncLibsqlTransport:
        self = cls.__new__(cls)
        EventTransport.__init__(self, EventPath(open_executor(settings), settings, clock=clock))
        self.settings = settings
        self._sync = None
        try:
            await self.path.run("migrate", lambda: self._prepare(create_schema))
        except BaseException:
            await self.path.executor.aclose()
            raise
        return self

    async def _prepare(self, create_schema: bool) -> None:
        """The schema steps are sync code: run them on a thread whose statements go through the
        executor, so the loop keeps running while they travel."""
        execute = blocking_execute(self.path.executor, asyncio.get_running_loop())
        if create_schema:
            await asyncio.to_thread(schema.migrate, execute, self.settings.prefix)
        else:
            await asyncio.to_thread(check_schema, execute, self.settings.prefix)

    def __repr__(self) -> str:
        return f"<AsyncLibsqlTransport prefix={self.settings.prefix} profile={self.settings.profile} {self.path.executor!r}>"

    @property
    def sync_transport(self) -> LibsqlTransport | None:
        """The sync transport this one was built from, if it was."""
        return self._sync

    async def close(self) -> None:
        """Send what is queued, then close the connections."""
        await self.path.executor.aclose()
        if self._sync is not None:
            await asyncio.to_thread(self._sync.close)
