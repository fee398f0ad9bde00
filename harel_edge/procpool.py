"""Blocking libsql work in worker processes, awaited from an event loop that stays free.

Why processes. libsql holds the GIL for the whole of every network call (docs/executor.md), so a
driver call on a thread freezes the event loop for a round trip to the primary: tens of
milliseconds at the edge, during which nothing else in the process runs. The GIL is per
process, so a call made by another process costs the loop nothing: the loop only waits on a
socket. With several processes, each with its own connection, several calls are in flight at
once, which one connection (one Hrana stream) cannot do.

How. `ProcessPool` starts up to `size` workers with the `spawn` start method (a libsql
connection must not cross a fork). Each worker builds its resource once with `opener(index)`
(a connection, a transport) and then runs requests one at a time: `work(resource, *args)`,
pickled over a socket pair. So `work` and its arguments must be picklable: a module-level
function, not a lambda. A request holds its worker from the moment it is sent until the answer
is back. Workers start lazily, when every live one is busy, so a pool only grows to the
concurrency it is asked for; the first starts in `start()`, so a bad URL or token fails there.

Cancellation. A cancelled caller cannot take its statement back from the worker: the worker
runs it to the end. The worker is therefore released by its answer arriving, never by the
caller leaving: the call runs as a task, the caller
awaits a shield of it, and the task's done-callback puts the worker back. The next caller can
never find a worker mid-statement.

Close. `close()` refuses new calls, waits for the calls in flight to be answered, then asks
each worker to close its resource and exit, and reaps it. A worker also exits when this process
goes away (its socket reaches end of file), so none outlives its owner.

One writer at a time. `size=1` is one connection used by one caller at a time, exactly the
one-caller contract, with the loop kept free: the way for work that spans several statements
(an explicit transaction) to keep its guarantees, since each `work` call runs whole in one
worker.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from harel_edge.errors import HarelEdgeError

R = TypeVar("R")
T = TypeVar("T")

_CLOSE = None  # the request that asks a worker to close its resource and exit
_JOIN_TIMEOUT = 10.0


def can_spawn() -> bool:
    """Whether this process may start worker processes: a daemonic process may not (Python
    forbids it), so code running in one, like a multiprocessing worker, keeps a thread."""
    return not multiprocessing.current_process().daemon


class WorkerProcessError(HarelEdgeError):
    """A worker process exited while a call was in it: whether that call took effect is unknown."""


class PoolClosedError(HarelEdgeError):
    """The pool was closed; open a new transport or connection."""


class ProcessPool(Generic[R]):
    """Up to `size` worker processes, each owning the resource `opener(index)` builds in it."""

    def __init__(self, opener: Callable[[int], R], *, size: int, name: str = "harel-edge") -> None:
        if size < 1:
            raise ValueError(f"a process pool needs at least one process, got size={size!r}")
        pickle.dumps(opener)  # fail here, not in a child, if the opener cannot reach one
        self._opener = opener
        self.size = size
        self.name = name
        self._idle: list[_Worker] = []
        self._free_indices = list(range(size))
        self._live = 0  # started or starting
        self._starting = 0
        self._inflight: set[asyncio.Future] = set()
        self._changed = asyncio.Event()
        self._closing = False
        self._shutdown_task: asyncio.Future | None = None

    def __repr__(self) -> str:
        return f"<ProcessPool {self.name} live={self._live}/{self.size} busy={len(self._inflight)}>"

    @property
    def live(self) -> int:
        """Worker processes started (or starting) and not yet closed."""
        return self._live

    @property
    def pids(self) -> list[int]:
        """Process ids of the idle workers (busy ones are not listed)."""
        return [worker.pid for worker in self._idle]

    async def start(self) -> None:
        """Start the first worker, so that a resource that cannot be opened fails now."""
        if self._live == 0:
            self._release(await self._grow())

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """`work(resource, *args)` in a worker with no other call in it; its result or its error."""
        payload = pickle.dumps((work, args))  # an unpicklable request fails here, in the caller
        worker = await self._acquire()
        try:
            task = asyncio.ensure_future(worker.call(payload))
        except BaseException:
            self._release(worker)
            raise
        self._inflight.add(task)
        task.add_done_callback(functools.partial(self._answered, worker))
        status, value = await asyncio.shield(task)
        if status == "ok":
            return value
        raise value

    async def close(self) -> None:
        """Refuse new calls, let the ones in flight finish, close every worker's resource, reap.

        Cancelling the caller does not stop the shutdown half-way: it goes on in a task.
        """
        if self._shutdown_task is None:
            self._closing = True
            self._wake()
            self._shutdown_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._shutdown_task)

    # ---- internals -----------------------------------------------------------------------------

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _acquire(self) -> _Worker:
        while True:
            if self._closing:
                raise PoolClosedError(f"{self.name}: the pool is closed")
            if self._idle:
                worker = self._idle.pop()  # the most recently used: its connection is warm
                if worker.process.is_alive():
                    return worker
                self._discard(worker)  # died while idle: nothing was sent, so nothing is lost
                continue
            if self._live < self.size:
                return await self._grow()
            changed = self._changed
            await changed.wait()

    async def _grow(self) -> _Worker:
        index = self._free_indices.pop(0)
        self._live += 1
        self._starting += 1
        try:
            return await _Worker.spawn(self._opener, index, f"{self.name}-{index}")
        except BaseException:
            self._live -= 1
            self._free_indices.append(index)
            self._free_indices.sort()
            raise
        finally:
            self._starting -= 1
            self._wake()

    def _release(self, worker: _Worker) -> None:
        self._idle.append(worker)
        self._wake()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self._live -= 1
        self._free_indices.append(worker.index)
        self._free_indices.sort()
        self._wake()

    def _answered(self, worker: _Worker, task: asyncio.Future) -> None:
        self._inflight.discard(task)
        if task.cancelled() or task.exception() is not None:
            self._discard(worker)  # it died or its socket broke: it cannot be trusted again
        else:
            self._release(worker)

    async def _shutdown(self) -> None:
        while self._inflight or self._starting:
            changed = self._changed
            await changed.wait()
        workers, self._idle = self._idle, []
        await asyncio.gather(*(worker.close() for worker in workers), return_exceptions=True)
        self._live -= len(workers)


class _Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(
        self, index: int, process: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.index = index
        self.process = process
        self.pid: int = process.pid
        self._reader = reader
        self._writer = writer

    @classmethod
    async def spawn(cls, opener: Callable[[int], Any], index: int, name: str) -> _Worker:
        ctx = multiprocessing.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_serve, args=(child_end, opener, index), name=name, daemon=True)
        # Starting a spawned process writes its pickled state to it: off the loop. If the caller
        # is cancelled meanwhile, the start still finishes, and the process is then killed.
        starting = asyncio.ensure_future(asyncio.to_thread(process.start))
        try:
            await asyncio.shield(starting)
        except BaseException:
            starting.add_done_callback(lambda _: _kill(process))
            parent_end.close()
            raise
        finally:
            child_end.close()
        sock = socket.socket(fileno=os.dup(parent_end.fileno()))
        parent_end.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            sock.close()
            _kill(process)
            raise
        worker = cls(index, process, reader, writer)
        try:
            status, value = pickle.loads(await _read_frame(reader))
        except BaseException as exc:
            worker.kill()
            if isinstance(exc, (asyncio.IncompleteReadError, ConnectionError)):
                raise WorkerProcessError(
                    f"{name} exited while starting (exit code {process.exitcode})"
                ) from None
            raise
        if status != "ready":
            worker.kill()
            raise value
        return worker

    async def call(self, payload: bytes) -> tuple[str, Any]:
        try:
            _write_frame(self._writer, payload)
            await self._writer.drain()
            return pickle.loads(await _read_frame(self._reader))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerProcessError(
                f"worker process {self.pid} exited during a call (exit code {self.process.exitcode}); "
                "the call may or may not have taken effect"
            ) from exc

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.call(pickle.dumps(_CLOSE)), _JOIN_TIMEOUT)
        except (TimeoutError, WorkerProcessError, OSError):
            pass
        finally:
            self._writer.close()
            await asyncio.to_thread(self.process.join, _JOIN_TIMEOUT)
            if self.process.is_alive():
                _kill(self.process)

    def kill(self) -> None:
        self._writer.close()
        _kill(self.process)


def _kill(process: Any) -> None:
    """Kill and reap: a dead worker must not linger as a zombie."""
    try:
        if process.is_alive():
            process.kill()
        process.join(_JOIN_TIMEOUT)
    except (ValueError, AssertionError, OSError):
        pass


# ---- framing: the same frames as multiprocessing.connection, so the child uses a plain Connection


def _write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    n = len(payload)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", n)
    writer.write(header + payload)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = struct.unpack("!i", await reader.readexactly(4))
    if n == -1:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return await reader.readexactly(n)


# ---- the worker process ----------------------------------------------------------------------


def _serve(conn: Any, opener: Callable[[int], Any], index: int) -> None:
    """A worker's life: open the resource, answer requests one at a time, close it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    try:
        resource = opener(index)
    except BaseException as exc:  # noqa: BLE001 - the parent raises it
        conn.send_bytes(_portable(("error", exc)))
        return
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    try:
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the parent is gone
            try:
                request = pickle.loads(data)
                if request is _CLOSE:
                    break
                work, args = request
                reply: tuple[str, Any] = ("ok", work(resource, *args))
            except BaseException as exc:  # noqa: BLE001 - every failure is the caller's to see
                reply = ("error", exc)
            conn.send_bytes(_portable(reply))
    finally:
        close = getattr(resource, "close", None)
        if close is not None:
            try:
                close()
            except BaseException:  # noqa: BLE001 - closing a broken connection is a courtesy
                pass
    try:
        conn.send_bytes(pickle.dumps(("ok", None)))
    except OSError:
        pass


def _portable(reply: tuple[str, Any]) -> bytes:
    """Pickle a reply; an error that would not survive the trip goes as a RuntimeError with its text."""
    status, value = reply
    if status == "error" and isinstance(value, BaseException):
        try:
            value.add_note(
                f"(raised in worker process {os.getpid()}:\n{''.join(traceback.format_tb(value.__traceback__))})"
            )
        except Exception:  # noqa: BLE001
            pass
    try:
        data = pickle.dumps(reply)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - unpicklable result or exception
        if status == "error":
            text = f"{type(value).__name__}: {value}"
            return pickle.dumps(("error", RuntimeError(text)))
        return pickle.dumps(("error", TypeError(f"the result ({type(value).__name__}) cannot be sent back")))


# ---- ready-made pieces for a pool of plain connections (what the durable Database can adopt) ----


def open_connection(settings: Any, index: int) -> Any:
    """An `EdgeConnection` for worker `index`; on a replica each worker has its own file."""
    from harel_edge.connection import EdgeConnection

    return EdgeConnection(worker_settings(settings, index))


def execute(connection: Any, sql: str, params: tuple | list = ()) -> list[tuple]:
    """The one-statement request: `await pool.run(execute, sql, params)`."""
    return connection.execute(sql, params)


def worker_settings(settings: Any, index: int) -> Any:
    """Worker 0 uses the settings as they are; on the replica profile, worker i > 0 gets its own
    embedded replica file beside the configured one (two processes must not share one)."""
    if index == 0 or settings.profile != "replica":
        return settings
    path = str(settings.db_path)
    stem, dot, suffix = path.rpartition(".")
    replica = f"{stem}.w{index}.{suffix}" if dot and "/" not in suffix else f"{path}.w{index}"
    return settings.model_copy(update={"db_path": replica})
