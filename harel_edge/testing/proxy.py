"""A TCP proxy on loopback that adds latency to a link and can cut it, for tests and benchmarks.

It runs in a process of its own; why, and what `cut()` and `heal()` do: docs/testing.md.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import time
from typing import Any

from harel_edge.loop_thread import run_main

LOOPBACK = "127.0.0.1"


class LatencyProxy:
    """Listen on 127.0.0.1:`port` and forward to 127.0.0.1:`target_port` with `delay` s each way.

    A context manager; put `url` where the server's address would go (`EdgeSettings.url`, `sync_url`).
    """

    def __init__(self, target_port: int, delay: float = 0.010, *, port: int = 0) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        ctx = multiprocessing.get_context("spawn")
        self._control, child_end = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(child_end, target_port, delay, port), name="latency-proxy", daemon=True
        )
        self._process.start()
        child_end.close()
        self.target_port = target_port
        self.delay = delay
        if not self._control.poll(30):
            self.close()
            raise RuntimeError("the latency proxy did not start within 30 s")
        reply = self._control.recv()
        if reply[0] != "ready":
            self.close()
            raise RuntimeError(f"the latency proxy failed to start: {reply[1]}")
        self.port: int = reply[1]
        self.url = f"http://{LOOPBACK}:{self.port}"

    def __repr__(self) -> str:
        return f"<LatencyProxy {LOOPBACK}:{self.port} -> :{self.target_port} delay={self.delay * 1000:g} ms>"

    def _ask(self, *command: Any) -> Any:
        self._control.send(command)
        if not self._control.poll(10):
            raise RuntimeError(f"the latency proxy did not answer {command[0]!r}")
        status, value = self._control.recv()
        if status != "ok":
            raise RuntimeError(f"the latency proxy failed {command[0]!r}: {value}")
        return value

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until `heal()`."""
        self._ask("cut")

    def heal(self) -> None:
        """Let connections through again."""
        self._ask("heal")

    def stats(self) -> dict[str, int]:
        """Connections accepted and refused, bytes and chunks forwarded each way, since the start."""
        return self._ask("stats")

    def close(self) -> None:
        """Stop the proxy process (it also exits by itself if this process dies)."""
        if self._process is None:
            return
        try:
            self._control.send(("close",))
        except (OSError, ValueError):
            pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._control.close()
        self._process = None

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---- the child process ------------------------------------------------------------------------


def _serve(control: Any, target_port: int, delay: float, port: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the proxy stops
    try:
        run_main(_Proxy(control, target_port, delay, port).run())
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        try:
            control.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass


class _Proxy:
    def __init__(self, control: Any, target_port: int, delay: float, port: int) -> None:
        self.control = control
        self.target_port = target_port
        self.delay = delay
        self.port = port
        self.is_cut = False
        self.links: set[asyncio.Task] = set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.stats = {
            "connections": 0,
            "refused": 0,
            "bytes_up": 0,
            "bytes_down": 0,
            "chunks_up": 0,
            "chunks_down": 0,
        }

    async def run(self) -> None:
        server = await asyncio.start_server(self._accept, LOOPBACK, self.port, reuse_address=True)
        port = server.sockets[0].getsockname()[1]
        self.control.send(("ready", port))
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue = asyncio.Queue()
        # The control pipe is a blocking multiprocessing connection; read it off the loop.
        loop.add_reader(self.control.fileno(), lambda: self._read_command(commands))
        try:
            while True:
                command = await commands.get()
                if command is None or command[0] == "close":
                    break
                try:
                    self.control.send(("ok", self._apply(command)))
                except Exception as exc:  # noqa: BLE001 - a bad command is the caller's to see
                    self.control.send(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            loop.remove_reader(self.control.fileno())
            server.close()
            self._drop_all()

    def _read_command(self, commands: asyncio.Queue) -> None:
        try:
            commands.put_nowait(self.control.recv())
        except (EOFError, OSError):
            commands.put_nowait(None)  # the parent is gone: stop

    def _apply(self, command: tuple) -> Any:
        name = command[0]
        if name == "cut":
            self.is_cut = True
            self._drop_all()
        elif name == "heal":
            self.is_cut = False
        elif name == "stats":
            return dict(self.stats)
        else:
            raise ValueError(f"unknown command {name!r}")
        return None

    def _drop_all(self) -> None:
        for writer in list(self.writers):
            _abort(writer)
        for task in list(self.links):
            task.cancel()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.stats["refused"] += 1
            _abort(client_w)
            return
        try:
            server_r, server_w = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            _abort(client_w)
            return
        self.stats["connections"] += 1
        for w in (client_w, server_w):
            self.writers.add(w)
            _no_delay(w)
        task = asyncio.current_task()
        self.links.add(task)
        try:
            await asyncio.gather(self._pump(client_r, server_w, "up"), self._pump(server_r, client_w, "down"))
        except (asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            self.links.discard(task)
            for w in (client_w, server_w):
                self.writers.discard(w)
                _abort(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Copy one direction, each chunk held until `delay` after it was read, order kept."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                self.stats[f"bytes_{direction}"] += len(data)
                self.stats[f"chunks_{direction}"] += 1
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay, data or None))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if transport is not None and not transport.is_closing():
        transport.abort()
