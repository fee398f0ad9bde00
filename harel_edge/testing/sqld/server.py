"""The handle on a running sqld, which tests read URLs and tokens from and disturb through.

Readiness is a poll of `/health`, never a fixed sleep.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from harel_edge.testing.auth import Access, SqldKeys
from harel_edge.testing.sqld.backends import Backend
from harel_edge.testing.sqld.processes import _BinaryProcess, _DockerProcess

Role = Literal["primary", "replica"]

LOOPBACK = "127.0.0.1"


class SqldStartError(RuntimeError):
    """sqld was launched but did not become ready; the message ends with its last log lines."""


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.01,
) -> object:
    """Call `condition` until it returns something truthy, and return that; raise after `timeout`.

    An exception from `condition` means "not yet"; the last one is chained to the `TimeoutError`.
    """
    deadline = time.monotonic() + timeout
    delay = interval
    last_error: Exception | None = None
    while True:
        try:
            result = condition()
        except Exception as exc:  # noqa: BLE001 - "not yet"; kept for the final error
            last_error = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.1f}s") from last_error
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


# --------------------------------------------------------------------------- the handle


_LIVE: weakref.WeakSet[SqldServer] = weakref.WeakSet()


@atexit.register
def _close_leftovers() -> None:
    """Close servers a test forgot, so no sqld process or container outlives Python."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()


class SqldServer:
    """A running sqld (primary or replica node) and the means to disturb it.

    Its attributes and what each method keeps: docs/testing.md ("The handle").
    """

    def __init__(
        self,
        *,
        role: Role,
        process: _BinaryProcess | _DockerProcess,
        http_port: int,
        grpc_port: int | None,
        work_dir: Path,
        admin_port: int | None = None,
        data_dir: Path,
        owns_work_dir: bool,
        keys: SqldKeys | None,
        primary: SqldServer | None,
        startup_timeout: float,
    ) -> None:
        self.role: Role = role
        self._process = process
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.http_url = f"http://{LOOPBACK}:{http_port}"
        self.grpc_url = f"http://{LOOPBACK}:{grpc_port}" if grpc_port else None
        self.admin_port = admin_port
        self.admin_url = f"http://{LOOPBACK}:{admin_port}" if admin_port else None  # with namespaces
        self.work_dir = work_dir
        self.data_dir = data_dir
        self._owns_work_dir = owns_work_dir
        self.keys = keys
        self.rw_token: str | None = keys.token("rw") if keys else None
        self.ro_token: str | None = keys.token("ro") if keys else None
        self.primary = primary
        self.startup_timeout = startup_timeout
        self.ready_seconds: float | None = None
        self._state = "new"
        self._closed = False

    # -- information

    @property
    def backend(self) -> Backend:
        return self._process.backend

    @property
    def auth_token(self) -> str | None:
        """The read-write token, under the name libsql.connect uses for it."""
        return self.rw_token

    @property
    def state(self) -> str:
        """'running', 'paused', 'stopped', 'killed', 'closed' or 'new' (as this handle last left it)."""
        return self._state

    def token(self, access: Access | None = "rw", *, expires_in: float | None = None) -> str:
        """Mint another token for this server (e.g. an expired one, or one without a claim)."""
        if self.keys is None:
            raise RuntimeError("this sqld runs without authentication: it has no keys")
        return self.keys.token(access, expires_in=expires_in)

    def logs(self, lines: int = 40) -> str:
        """sqld's last log lines (stdout and stderr)."""
        return self._process.logs(lines)

    def __repr__(self) -> str:
        auth = "<redacted>" if self.keys else None
        return (
            f"SqldServer(role={self.role!r}, backend={self.backend!r}, state={self._state!r}, "
            f"http_url={self.http_url!r}, grpc_url={self.grpc_url!r}, "
            f"data_dir={str(self.data_dir)!r}, tokens={auth})"
        )

    # -- lifecycle

    def start(self) -> SqldServer:
        """Start sqld and wait until it answers ``/health``."""
        if self._closed:
            raise RuntimeError("this sqld handle is closed")
        began = time.monotonic()
        self._process.start()
        self._state = "running"
        _LIVE.add(self)
        self.wait_ready(self.startup_timeout)
        self.ready_seconds = time.monotonic() - began
        return self

    def healthy(self, timeout: float = 1.0) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout`` seconds."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/health", timeout=timeout) as response:  # noqa: S310
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll ``/health`` until it answers 200; raise :class:`SqldStartError` after ``timeout``.

        Why polling: a fixed sleep is either too long (slow tests) or too short (flaky ones).
        """
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            answered = self.healthy(timeout=min(1.0, max(0.05, deadline - time.monotonic())))
            # Checked after the answer too: if sqld failed to bind its port, whatever else
            # holds that port may have answered.
            exit_status = self._process.exit_status()
            if answered and exit_status is None:
                return
            if exit_status is not None:
                raise SqldStartError(
                    f"sqld {self.role} ({self.backend}) exited before it was ready "
                    f"({exit_status}); last log lines:\n{self.logs()}"
                )
            if time.monotonic() >= deadline:
                raise SqldStartError(
                    f"sqld {self.role} ({self.backend}) did not answer {self.http_url}/health "
                    f"within {timeout:.1f}s; last log lines:\n{self.logs()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sqld gracefully (SIGTERM, then SIGKILL after ``timeout``); ``restart()`` brings it back."""
        self._process.stop(timeout)
        self._state = "stopped"

    def kill(self) -> None:
        """Kill sqld with SIGKILL, as a crash or a power cut would."""
        self._process.kill()
        self._state = "killed"

    def pause(self) -> None:
        """Freeze sqld (SIGSTOP, or ``docker pause``): connections hang rather than fail."""
        self._process.pause()
        self._state = "paused"

    def resume(self) -> None:
        """Unfreeze a paused sqld."""
        self._process.resume()
        self._state = "running"

    def restart(self, timeout: float = 10.0) -> SqldServer:
        """Stop (if running) and start again on the same data dir and ports, then wait until ready."""
        if self._state == "paused":
            self.resume()
        if self._process.alive():
            self.stop(timeout)
        return self.start()

    def close(self) -> None:
        """Remove the process or container and, if this handle made it, the work dir."""
        if self._closed:
            return
        self._closed = True
        self._state = "closed"
        try:
            self._process.stop(5.0)
        finally:
            self._process.remove()
            _LIVE.discard(self)
            if self._owns_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> SqldServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
