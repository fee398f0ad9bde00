"""AsyncLibsqlTransport: the transport for harel's async worker.

libsql is synchronous, so this wraps `LibsqlTransport` and runs each call on a thread, one at
a time on its one connection (`offload.OneAtATime`: cancellation-safe, see there). Every
feature of the sync transport is here: routing keys, batch publish, fenced ack/nack, the
database's clock, retries and ambiguous-write resolution.

On a remote primary the driver holds the GIL for the whole round trip (FACTS.md), so a thread
does not keep the event loop free while a statement is in flight; see docs/benchmarks.md for
what that costs and how the worker works around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge.offload import OneAtATime
from harel_edge.settings import EdgeSettings
from harel_edge.transport import Clock, LibsqlTransport, Message


class AsyncLibsqlTransport:
    """The harel `AsyncTransport` on libSQL. Build it with `await AsyncLibsqlTransport.create(...)`
    or `await AsyncLibsqlTransport.from_settings()`."""

    def __init__(self, sync_transport: LibsqlTransport) -> None:
        self._t = sync_transport
        self._serial = OneAtATime()

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
        """Open (and on a replica, sync) on a thread: both are network round trips."""
        sync = await asyncio.to_thread(
            LibsqlTransport,
            database,
            clock,
            auth_token=auth_token,
            sync_url=sync_url,
            sync_interval=sync_interval,
            prefix=prefix,
            create_schema=create_schema,
            routing_keys=routing_keys,
        )
        return cls(sync)

    @classmethod
    async def from_settings(
        cls, settings: EdgeSettings | None = None, clock: Clock | None = None
    ) -> AsyncLibsqlTransport:
        settings = settings or EdgeSettings.load()
        return cls(await asyncio.to_thread(LibsqlTransport, settings=settings, clock=clock))

    def __repr__(self) -> str:
        return f"<AsyncLibsqlTransport {self._t!r}>"

    @property
    def sync_transport(self) -> LibsqlTransport:
        return self._t

    async def publish(
        self, group_id: str, event: Event, priority: int = 0, routing_key: str | None = None
    ) -> None:
        await self._serial.run(self._t.publish, group_id, event, priority, routing_key)

    async def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        return await self._serial.run(self._t.publish_many, list(messages))

    async def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        routing_keys: Sequence[str] | None = None,
    ) -> Lease | None:
        return await self._serial.run(self._t.claim, worker_id, visibility, min_priority, routing_keys)

    async def ack(self, lease: Lease) -> bool:
        return await self._serial.run(self._t.ack, lease)

    async def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        return await self._serial.run(self._t.nack, lease, delay)

    async def depth(self) -> int:
        return await self._serial.run(self._t.depth)

    async def close(self) -> None:
        await self._serial.close(self._t.close)
