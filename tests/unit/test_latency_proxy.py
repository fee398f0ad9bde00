"""The latency proxy the slow-link tests and benchmarks put between a client and sqld, on
loopback against a plain TCP echo server (no sqld needed)."""

from __future__ import annotations

import socket
import threading

import pytest

from harel_edge.testing.proxy import LatencyProxy


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
