"""AsyncLibsqlTransport: the transport for harel's async worker.

libsql is synchronous, so every call of this class runs the sync `LibsqlTransport` somewhere
else and awaits the answer. Every feature of the sync transport is therefore here, unchanged:
routing keys, batch publish, fenced ack/nack, the database's clock, retries and
ambiguous-write resolution. Where it runs depends on the profile:

- `local`: on a thread, one call at a time on one connection (`offload.OneAtATime`). A local
  statement is short and mostly file I/O, and threads are the cheapest way to reach it.
- `sqld` and `replica`: in worker processes (`procpool.ProcessPool`), each with its own
  connection (on a replica, its own replica file). The driver holds the GIL for the whole of a
  network round trip (FACTS.md), so on a thread each call would freeze the event loop for a
  round trip to the primary and calls could only follow one another. In another process the
  call costs the loop nothing, and `processes` calls are in flight at once. Every operation is
  one statement decided on the primary, so connections in several processes claim and ack
  exactly as one connection would. docs/benchmarks.md has the measurements.

`processes=0` keeps the thread design on every profile (one connection in this process).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_edge.errors import HarelEdgeError
from harel_edge.offload import OneAtATime
from harel_edge.procpool import ProcessPool, can_spawn, worker_settings
from harel_edge.settings import EdgeSettings
from harel_edge.transport import Clock, LibsqlTransport, Message, _explicit_settings

log = structlog.get_logger("harel_edge.aio_transport")


class AsyncLibsqlTransport:
    """The harel `AsyncTransport` on libSQL. Build it with `await AsyncLibsqlTransport.create(...)`
    or `await AsyncLibsqlTransport.from_settings()`.

    `AsyncLibsqlTransport(sync_transport)` wraps an open sync transport and runs it on a thread
    in this process (one call at a time): the design for the local profile, or for a test that
    wants the sync transport's connection at hand.
    """

    def __init__(self, sync_transport: LibsqlTransport) -> None:
        self._t: LibsqlTransport | None = sync_transport
        self._serial = OneAtATime()
        self._pool: ProcessPool | None = None
        self._clock: Clock | None = None
        self.settings: EdgeSettings = sync_transport.settings

    @classmethod
    def _on_processes(
        cls, pool: ProcessPool, settings: EdgeSettings, clock: Clock | None
    ) -> AsyncLibsqlTransport:
        self = cls.__new__(cls)
        self._t = None
        self._serial = OneAtATime()
        self._pool = pool
        self._clock = clock
        self.settings = settings
        return self

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
        processes: int | None = None,
    ) -> AsyncLibsqlTransport:
        """Open the transport `database` names (a file, a server URL, or a replica's file with
        `sync_url`), without blocking the loop. `processes`: see `from_settings`."""
        settings = _explicit_settings(database, auth_token, sync_url, sync_interval, prefix, routing_keys)
        return await cls._open(settings, clock, create_schema, processes)

    @classmethod
    async def from_settings(
        cls,
        settings: EdgeSettings | None = None,
        clock: Clock | None = None,
        *,
        processes: int | None = None,
    ) -> AsyncLibsqlTransport:
        """The transport the settings describe (`EdgeSettings.load()` when none are given).

        On sqld and replica, up to `processes` worker processes (default: the settings' `async_processes`, 8)
        each hold a connection; `processes=0` runs one connection on a thread instead. The local
        profile always uses a thread. A worker process is spawned, so a program that builds this
        transport needs the usual `if __name__ == "__main__":` guard around its start.
        """
        return await cls._open(settings or EdgeSettings.load(), clock, True, processes)

    @classmethod
    async def _open(
        cls, settings: EdgeSettings, clock: Clock | None, create_schema: bool, processes: int | None
    ) -> AsyncLibsqlTransport:
        if processes is None:
            processes = settings.async_processes
        if processes < 0:
            raise ValueError(f"processes must be 0 (threads) or more, got {processes!r}")
        if settings.profile == "local" or processes == 0 or not can_spawn():
            # Opening (and on a replica, the first sync) is a round trip: on a thread.
            sync = await asyncio.to_thread(
                LibsqlTransport, settings=settings, clock=clock, create_schema=create_schema
            )
            return cls(sync)
        opener = functools.partial(_open_in_worker, settings, clock is not None, create_schema)
        pool = ProcessPool(opener, size=processes, name=f"harel-edge-{settings.prefix}")
        await pool.start()
        return cls._on_processes(pool, settings, clock)

    def __repr__(self) -> str:
        if self._pool is None:
            return f"<AsyncLibsqlTransport {self._t!r}>"
        return (
            f"<AsyncLibsqlTransport prefix={self.settings.prefix} profile={self.settings.profile} "
            f"at {self.settings.server} processes={self._pool.live}/{self._pool.size}>"
        )

    @property
    def sync_transport(self) -> LibsqlTransport:
        """The wrapped sync transport (thread design only)."""
        if self._t is None:
            raise HarelEdgeError(
                "this transport's connections live in worker processes; build it with processes=0 "
                "to have an in-process LibsqlTransport"
            )
        return self._t

    @property
    def processes(self) -> int:
        """Worker processes running now (0 in the thread design)."""
        return 0 if self._pool is None else self._pool.live

    async def _call(self, name: str, *args: Any) -> Any:
        if self._pool is None:
            return await self._serial.run(getattr(self._t, name), *args)
        # An injected clock is read here and its reading sent along: the worker's transport
        # uses it as its clock for this call (None: the database's clock, as always).
        now = self._clock() if self._clock is not None else None
        return await self._pool.run(_invoke, now, name, args)

    async def publish(
        self, group_id: str, event: Event, priority: int = 0, routing_key: str | None = None
    ) -> None:
        await self._call("publish", group_id, event, priority, routing_key)

    async def publish_many(self, messages: Iterable[Message | tuple]) -> int:
        return await self._call("publish_many", list(messages))

    async def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        routing_keys: Sequence[str] | None = None,
    ) -> Lease | None:
        return await self._call("claim", worker_id, visibility, min_priority, routing_keys)

    async def ack(self, lease: Lease) -> bool:
        return await self._call("ack", lease)

    async def nack(self, lease: Lease, delay: float = 0.0) -> bool:
        return await self._call("nack", lease, delay)

    async def depth(self) -> int:
        return await self._call("depth")

    async def close(self) -> None:
        """Wait for the calls in flight, then close every connection."""
        if self._pool is None:
            await self._serial.close(self._t.close)
        else:
            await self._pool.close()


# ---- what runs in a worker process ---------------------------------------------------------------


@dataclass
class _Now:
    """The clock of a worker's transport when the caller injected one: the caller's reading."""

    value: float = 0.0

    def __call__(self) -> float:
        return self.value


@dataclass
class _Served:
    transport: LibsqlTransport
    now: _Now | None

    def close(self) -> None:
        self.transport.close()


def _open_in_worker(settings: EdgeSettings, injected_clock: bool, create_schema: bool, index: int) -> _Served:
    now = _Now() if injected_clock else None
    # The first worker creates or upgrades the schema; later ones only check it.
    transport = LibsqlTransport(
        settings=worker_settings(settings, index), clock=now, create_schema=create_schema and index == 0
    )
    return _Served(transport, now)


def _invoke(served: _Served, now: float | None, name: str, args: tuple) -> Any:
    if served.now is not None and now is not None:
        served.now.value = now
    if name == "depth":
        _catch_up(served.transport)
    return getattr(served.transport, name)(*args)


def _catch_up(transport: LibsqlTransport) -> None:
    """On a replica, other workers' writes reach this worker's file only by a sync: without one a
    caller could count fewer messages than it has just published through another worker."""
    if transport.connection.profile != "replica":
        return
    try:
        transport.connection.sync()
    except Exception as exc:  # noqa: BLE001 - a replica still answers from what it has
        log.warning("replica sync before depth failed; counting what this replica has", error=str(exc))
