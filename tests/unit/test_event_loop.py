"""The latency proxy and the process pool, on loopback and local files (no sqld needed).

The pool's work functions are defined at module level: a request is pickled to a spawned
worker, which imports this module to find them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from harel_edge.procpool import (
    PoolClosedError,
    ProcessPool,
    WorkerProcessError,
    execute,
    open_connection,
    worker_settings,
)
from harel_edge.settings import ExplicitSettings
from harel_edge.testing.proxy import LatencyProxy

# ---- work that runs in a worker process ----------------------------------------------------------


def pid_of_worker(connection) -> int:
    return os.getpid()


def exit_abruptly(connection) -> None:
    os._exit(3)


def transaction_held_until(connection, inside: str, release: str) -> str:
    """BEGIN IMMEDIATE, one insert, then hold the transaction open until `release` exists."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("INSERT INTO t (v) VALUES ('held')")
    Path(inside).touch()
    while not Path(release).exists():
        time.sleep(0.005)
    connection.execute("COMMIT")
    return "committed"


def state_seen_by_next_caller(connection) -> tuple[bool, list[tuple]]:
    return connection.in_transaction, connection.execute("SELECT v FROM t")


# ---- helpers -------------------------------------------------------------------------------------


def local_pool(tmp_path: Path, size: int = 1) -> ProcessPool:
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "pool.db"))
    return ProcessPool(functools.partial(open_connection, settings), size=size, name="test-pool")


async def until(predicate, what: str, limit: float = 30.0) -> None:
    """Poll (never a fixed sleep) until `predicate()` holds; fail naming `what` if it never does."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


class EchoServer:
    """A TCP echo server on 127.0.0.1, on a thread: something real for the proxy to reach."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


def round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break  # what a cut link looks like, as much as a plain close
            if not chunk:
                break
            got += chunk
        return got


# ---- the proxy -----------------------------------------------------------------------------------


def test_the_proxy_forwards_both_ways_and_counts_what_it_carried():
    echo = EchoServer()
    try:
        with LatencyProxy(echo.port, delay=0.005) as proxy:
            assert round_trip(proxy.port, b"hello" * 1000) == b"hello" * 1000
            stats = proxy.stats()
            assert stats["connections"] == 1
            assert stats["bytes_up"] == stats["bytes_down"] == 5000
    finally:
        echo.close()


def test_a_cut_proxy_drops_open_links_and_refuses_new_ones_until_healed():
    echo = EchoServer()
    try:
        with LatencyProxy(echo.port, delay=0.0) as proxy:
            held = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            held.sendall(b"x")
            assert held.recv(1) == b"x"
            proxy.cut()
            try:
                assert held.recv(1) == b"", "the open link was closed"
            except ConnectionResetError:
                pass  # or reset: either way it is gone
            held.close()
            assert round_trip(proxy.port, b"y") == b"", "a new connection is closed at once"
            assert proxy.stats()["refused"] >= 1
            proxy.heal()
            assert round_trip(proxy.port, b"z") == b"z"
    finally:
        echo.close()


def test_the_proxy_refuses_a_negative_delay():
    with pytest.raises(ValueError, match="delay must be >= 0"):
        LatencyProxy(1, delay=-1)


# ---- the process pool ----------------------------------------------------------------------------


def test_a_pool_runs_work_in_another_process_and_returns_its_rows_and_its_errors(tmp_path):
    async def main():
        pool = local_pool(tmp_path)
        await pool.start()
        try:
            assert await pool.run(pid_of_worker) != os.getpid()
            await pool.run(execute, "CREATE TABLE t (v TEXT)")
            await pool.run(execute, "INSERT INTO t (v) VALUES (?)", ("a",))
            assert await pool.run(execute, "SELECT v FROM t") == [("a",)]
            with pytest.raises(ValueError, match="no such table"):
                await pool.run(execute, "SELECT * FROM nosuch")
            assert await pool.run(execute, "SELECT count(*) FROM t") == [(1,)], (
                "an error leaves the worker usable"
            )
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_pool_grows_only_to_the_calls_in_flight(tmp_path):
    async def main():
        pool = local_pool(tmp_path, size=3)
        await pool.start()
        try:
            for _ in range(3):
                await pool.run(pid_of_worker)
            assert pool.live == 1, "one call at a time needs one process"
            pids = await asyncio.gather(*(pool.run(pid_of_worker) for _ in range(6)))
            assert 1 < pool.live <= 3 and len(set(pids)) == pool.live
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_cancelled_caller_does_not_hand_its_connection_mid_transaction_to_the_next(tmp_path):
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def main():
        pool = local_pool(tmp_path, size=1)
        await pool.start()
        try:
            await pool.run(execute, "CREATE TABLE t (v TEXT)")
            first = asyncio.create_task(pool.run(transaction_held_until, inside, release))
            await until(lambda: Path(inside).exists(), "the first call to be inside its transaction")
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert (pool.live, pool.pids) == (1, []), "the cancelled call still holds the pool's one worker"
            second = asyncio.create_task(pool.run(state_seen_by_next_caller))
            # The next caller has run as far as it can without an answer from a worker process.
            await until(
                lambda: inspect.getcoroutinestate(second.get_coro()) != inspect.CORO_CREATED,
                "the next caller to start",
            )
            assert not second.done()
            assert (pool.live, pool.pids) == (1, []), "the next caller waits for that worker, not another"
            Path(release).touch()
            in_transaction, rows = await second
            assert in_transaction is False, "the next caller found no transaction left open"
            assert rows == [("held",)], "the cancelled caller's transaction ran to its COMMIT first"
        finally:
            Path(release).touch()
            await pool.close()

    asyncio.run(main())


def test_close_waits_for_the_call_in_flight_and_then_no_worker_is_left(tmp_path):
    inside, release = str(tmp_path / "inside"), str(tmp_path / "release")

    async def main():
        pool = local_pool(tmp_path, size=2)
        await pool.start()
        await pool.run(execute, "CREATE TABLE t (v TEXT)")
        pids = pool.pids
        call = asyncio.create_task(pool.run(transaction_held_until, inside, release))
        await until(lambda: Path(inside).exists(), "the call to be inside its transaction")
        closing = asyncio.create_task(pool.close())
        await asyncio.sleep(0)  # one loop step: the close has begun
        with pytest.raises(PoolClosedError):
            await pool.run(pid_of_worker)
        Path(release).touch()
        await closing
        assert await call == "committed", "the call in flight finished during the close"
        assert pool.live == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)

    asyncio.run(main())
    import libsql

    rows = libsql.connect(str(tmp_path / "pool.db")).execute("SELECT v FROM t").fetchall()
    assert rows == [("held",)]


def test_a_worker_that_dies_while_idle_is_replaced_without_the_caller_noticing(tmp_path):
    async def main():
        pool = local_pool(tmp_path)
        await pool.start()
        try:
            (dead,) = pool.pids
            os.kill(dead, signal.SIGKILL)
            await until(lambda: not pool._idle[0].process.is_alive(), "the worker to be gone")
            assert await pool.run(pid_of_worker) != dead
            assert pool.live == 1
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_worker_that_dies_during_a_call_fails_that_call_and_the_next_call_gets_a_new_one(tmp_path):
    async def main():
        pool = local_pool(tmp_path)
        await pool.start()
        try:
            with pytest.raises(WorkerProcessError, match="may or may not have taken effect"):
                await pool.run(exit_abruptly)
            assert isinstance(await pool.run(pid_of_worker), int)
            assert pool.live == 1
        finally:
            await pool.close()

    asyncio.run(main())


def test_an_opener_that_fails_fails_start_with_its_own_error(tmp_path):
    (tmp_path / "not-a-db").write_bytes(b"this is not a database file" * 100)
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "not-a-db"))

    async def main():
        pool = ProcessPool(functools.partial(open_connection, settings), size=1)
        with pytest.raises(Exception, match="not a SQLite/libSQL database"):
            await pool.start()
        assert pool.live == 0

    asyncio.run(main())


def test_each_replica_worker_gets_its_own_file_beside_the_configured_one(tmp_path):
    settings = ExplicitSettings.load(
        profile="replica", db_path=str(tmp_path / "edge.db"), sync_url="http://127.0.0.1:1"
    )
    assert worker_settings(settings, 0).db_path == str(tmp_path / "edge.db")
    assert worker_settings(settings, 3).db_path == str(tmp_path / "edge.w3.db")
    local = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "edge.db"))
    assert worker_settings(local, 3) is local
