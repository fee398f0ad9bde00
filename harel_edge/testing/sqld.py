"""Start a real sqld (libsql-server) for tests: a primary, or a replica node of one.

Why: harel_edge's guarantees must hold against the real server, so its tests (and its
users' tests) run against a real sqld, never a mock. This module starts one in a Docker
container (through testcontainers) when a Docker engine is reachable and the image is
present, otherwise from the sqld binary as a subprocess, and returns a
:class:`SqldServer` handle that can also stop, kill, pause, resume and restart it, which
is what fault-injection tests need.

Choices that matter:

- Loopback only. Servers listen on 127.0.0.1 on free ports; containers use
  ``network_mode=host``, so no test traffic ever goes to a private-range address.
- Authentication is on by default, as in production: a fresh Ed25519 key per server
  (shared by a replica node with its primary), and read-write / read-only tokens.
- Readiness is decided by polling ``GET /health``, never by a fixed sleep; a server that
  does not get ready in time raises :class:`SqldStartError` with sqld's last log lines.
- Nothing imports Docker or testcontainers until the Docker backend is used.

Env vars: ``HAREL_EDGE_SQLD_BACKEND`` (``docker`` | ``binary``; unset: docker when it
works, else binary), ``HAREL_EDGE_SQLD_BINARY`` (path of the binary), ``SQLD_IMAGE``
(image name, default ``harel-edge/sqld:0.24.32``), ``SQLD_CACHE_DIR`` (where
``sqld/fetch-binary.sh`` puts the binary).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from harel_edge.testing.auth import Access, KeyFormat, SqldKeys, generate_keys

Backend = Literal["docker", "binary"]
Role = Literal["primary", "replica"]

DEFAULT_IMAGE = "harel-edge/sqld:0.24.32"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
LOOPBACK = "127.0.0.1"
# Where the work dir (data, key file) is mounted inside a container.
CONTAINER_WORK_DIR = "/var/lib/sqld"

__all__ = [
    "DEFAULT_IMAGE",
    "SqldServer",
    "SqldStartError",
    "SqldUnavailable",
    "backend_unavailable_reason",
    "choose_backend",
    "find_sqld_binary",
    "sqld_image",
    "start_sqld_primary",
    "start_sqld_replica_node",
    "wait_until",
]


class SqldUnavailable(RuntimeError):
    """sqld cannot be started here at all (no binary, no Docker engine or image).

    Why a type of its own: test fixtures skip (or fail, when sqld is required) on this,
    and the message says what to install or run.
    """


class SqldStartError(RuntimeError):
    """sqld was launched but did not become ready; the message ends with its last log lines."""


# --------------------------------------------------------------------------- discovery


def sqld_image() -> str:
    """The image the Docker backend runs: ``SQLD_IMAGE`` or the one sqld/build-image.sh builds."""
    return os.environ.get("SQLD_IMAGE") or DEFAULT_IMAGE


def _repo_cache_candidates() -> list[Path]:
    candidates = []
    if os.environ.get("SQLD_CACHE_DIR"):
        candidates.append(Path(os.environ["SQLD_CACHE_DIR"]) / "sqld")
    candidates.append(Path.cwd() / ".cache" / "sqld" / "sqld")
    # A source checkout (editable install): <repo>/.cache/sqld/sqld next to the package.
    candidates.append(Path(__file__).resolve().parents[2] / ".cache" / "sqld" / "sqld")
    return candidates


def find_sqld_binary() -> Path | None:
    """Where the sqld binary is: ``HAREL_EDGE_SQLD_BINARY``, the fetch cache, or ``PATH``."""
    explicit = os.environ.get("HAREL_EDGE_SQLD_BINARY")
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    for candidate in _repo_cache_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("sqld")
    return Path(found) if found else None


def _docker_client():
    """A Docker SDK client that answered a ping (imported lazily; raises if unreachable)."""
    import docker  # noqa: PLC0415 - optional dependency, imported only for this backend

    client = docker.from_env(timeout=10)
    client.ping()
    return client


def backend_unavailable_reason(backend: Backend, *, image: str | None = None) -> str | None:
    """Why ``backend`` cannot run sqld here, or None when it can.

    Why: fixtures and tests skip or fail with this reason, so it says what to do.
    """
    if backend == "binary":
        binary = find_sqld_binary()
        if binary is None:
            where = os.environ.get("HAREL_EDGE_SQLD_BINARY")
            if where:
                return f"HAREL_EDGE_SQLD_BINARY={where} is not an executable file"
            return "no sqld binary found (run sqld/fetch-binary.sh, or set HAREL_EDGE_SQLD_BINARY)"
        if not CA_BUNDLE.is_file() and not os.environ.get("SSL_CERT_FILE"):
            return f"sqld needs a CA bundle at {CA_BUNDLE} (apt-get install ca-certificates)"
        return None
    if backend == "docker":
        image = image or sqld_image()
        try:
            import testcontainers.core.container  # noqa: F401, PLC0415
        except ImportError:
            return "the Docker backend needs the 'testcontainers' and 'docker' packages"
        try:
            client = _docker_client()
        except Exception as exc:  # noqa: BLE001 - any failure means "no engine"; say which
            return f"no Docker engine reachable ({type(exc).__name__}: {exc}); run scripts/start-docker.sh"
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            return f"Docker image {image} is missing (run sqld/build-image.sh, or set SQLD_IMAGE)"
        finally:
            client.close()
        return None
    return f"unknown sqld backend {backend!r} (use 'docker' or 'binary')"


def choose_backend(backend: str | None = None, *, image: str | None = None) -> Backend:
    """Pick the backend: the argument, else ``HAREL_EDGE_SQLD_BACKEND``, else docker if usable, else binary.

    Raises :class:`SqldUnavailable` with the reason when the chosen (or every) backend is unusable.
    """
    wanted = backend or os.environ.get("HAREL_EDGE_SQLD_BACKEND") or None
    if wanted:
        if wanted not in ("docker", "binary"):
            raise SqldUnavailable(
                f"HAREL_EDGE_SQLD_BACKEND={wanted!r} is not a backend (use 'docker' or 'binary')"
            )
        reason = backend_unavailable_reason(wanted, image=image)  # type: ignore[arg-type]
        if reason:
            raise SqldUnavailable(f"sqld backend {wanted!r} unavailable: {reason}")
        return wanted  # type: ignore[return-value]
    docker_reason = backend_unavailable_reason("docker", image=image)
    if docker_reason is None:
        return "docker"
    binary_reason = backend_unavailable_reason("binary")
    if binary_reason is None:
        return "binary"
    raise SqldUnavailable(f"cannot start sqld: docker: {docker_reason}; binary: {binary_reason}")


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.01,
) -> object:
    """Call ``condition`` until it returns something truthy, and return that; raise after ``timeout``.

    Why: what a test waits for on sqld (a replica node catching up, a restarted primary
    answering) takes a variable time; polling a real condition is both fast and reliable
    where a fixed sleep is neither. Exceptions raised by ``condition`` count as "not yet";
    the last one is chained to the ``TimeoutError``.
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


def _free_port() -> int:
    """A port free on 127.0.0.1 right now (the kernel picks it when binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- processes


# --------------------------------------------------------------------------- leftovers

# A test process killed outright (SIGKILL, or SIGTERM from `timeout`) runs no cleanup, and
# the Ryuk reaper is off, so its sqld processes and containers would live on. Each one is
# tagged with the pid of the process that started it, and the first launch in a later
# process removes those whose owner is dead. The engine and the binaries are local (host
# network, loopback), so pids are comparable.
_OWNER_FILE = ".harel-edge-owner"
_OWNER_LABEL = "harel_edge.testing.owner_pid"
_reaped: set[str] = set()


def _pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie (a killed owner may linger as one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" not in status


def _reap_leftover_processes_and_dirs() -> None:
    if "dirs" in _reaped:
        return
    _reaped.add("dirs")
    for owner_file in Path(tempfile.gettempdir()).glob(f"harel-edge-sqld-*/{_OWNER_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            owner, *sqld_pid = (int(part) for part in owner_file.read_text().split())
            if _pid_alive(owner):
                continue
            comm = Path(f"/proc/{sqld_pid[0]}/comm") if sqld_pid else None
            if comm and comm.exists() and comm.read_text().strip() == "sqld":
                os.kill(sqld_pid[0], signal.SIGKILL)
            shutil.rmtree(owner_file.parent, ignore_errors=True)


def _reap_docker_leftovers(client) -> None:
    if "docker" in _reaped:
        return
    _reaped.add("docker")
    with contextlib.suppress(Exception):
        for container in client.containers.list(all=True, filters={"label": _OWNER_LABEL}):
            with contextlib.suppress(Exception):
                if not _pid_alive(int(container.labels[_OWNER_LABEL])):
                    container.remove(force=True, v=True)


class _BinaryProcess:
    """sqld as a subprocess of this one; its output goes to a log file."""

    backend: Backend = "binary"

    def __init__(self, binary: Path, args: list[str], work_dir: Path) -> None:
        self._binary = binary
        self._args = args
        self._log_path = work_dir / "sqld.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        # Keep the log readable and free of ANSI colour codes.
        env.setdefault("RUST_LOG", "info")
        env["NO_COLOR"] = "1"
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed binary, our own arguments
                [str(self._binary), *self._args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Same process group as the caller: a Ctrl-C stops sqld too.
            )
        (self._log_path.parent / _OWNER_FILE).write_text(f"{os.getpid()} {self._proc.pid}\n")

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_status(self) -> str | None:
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"exit code {self._proc.returncode}"

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self._proc is not None
            self._proc.send_signal(sig)

    def stop(self, timeout: float) -> None:
        if not self.alive():
            return
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        self._proc.terminate()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        if self.alive():
            assert self._proc is not None
            self._proc.kill()
            self._proc.wait()

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def logs(self, lines: int) -> str:
        try:
            text = self._log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def remove(self) -> None:
        self.kill()


class _DockerProcess:
    """sqld in a container on the host network, started through testcontainers."""

    backend: Backend = "docker"

    def __init__(
        self, image: str, env: dict[str, str], extra_args: list[str], work_dir: Path, name_hint: str
    ) -> None:
        """Configure sqld through ``SQLD_*`` env vars rather than flags.

        Why: sqld reads every setting used here from an env var, and so does the official
        image's entry point (which appends its own flags after the command, so flags given
        on the command line would be duplicated). Env vars work for both images; the
        command is the image's own CMD (none for ours, ``/bin/sqld`` for the official
        one) followed by ``extra_args``.
        """
        # The reaper (Ryuk) image cannot be pulled on offline machines; we clean up ourselves.
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415

        client = _docker_client()
        try:
            _reap_docker_leftovers(client)
            config = client.images.get(image).attrs.get("Config") or {}
        finally:
            client.close()
        entrypoint = config.get("Entrypoint") or []
        labels = {"harel_edge.testing": name_hint, _OWNER_LABEL: str(os.getpid())}
        kwargs: dict[str, object] = {"network_mode": "host", "labels": labels}
        if entrypoint and Path(entrypoint[0]).name == "sqld":
            # sqld itself is the entry point (our image): run it as the caller, so that the
            # files it writes in the work dir stay the caller's to delete.
            kwargs["user"] = f"{os.getuid()}:{os.getgid()}"
        else:
            # A wrapper entry point (the official image) starts as root and switches to its
            # own user, which must be able to reach the key file in the work dir.
            work_dir.chmod(0o755)
        container = DockerContainer(image).with_volume_mapping(str(work_dir), CONTAINER_WORK_DIR, "rw")
        command = [*(config.get("Cmd") or []), *extra_args]
        if command:
            container = container.with_command(command)
        for name, value in {**env, "NO_COLOR": "1"}.items():
            container = container.with_env(name, value)
        self._container = container.with_kwargs(**kwargs)
        self._started = False

    @property
    def _wrapped(self):
        return self._container.get_wrapped_container()

    def start(self) -> None:
        if not self._started:
            self._container.start()
            self._started = True
        else:
            self._wrapped.start()

    def _status(self) -> str | None:
        if not self._started:
            return None
        try:
            wrapped = self._wrapped
            wrapped.reload()
            return wrapped.status
        except Exception:  # noqa: BLE001 - the container is gone
            return "removed"

    def alive(self) -> bool:
        return self._status() in ("running", "paused", "created", "restarting")

    def exit_status(self) -> str | None:
        status = self._status()
        if status in (None, "running", "paused", "created", "restarting"):
            return None
        try:
            code = self._wrapped.attrs["State"]["ExitCode"]
        except Exception:  # noqa: BLE001
            code = "?"
        return f"container {status}, exit code {code}"

    def stop(self, timeout: float) -> None:
        status = self._status()
        if status == "paused":
            self._wrapped.unpause()
        if self.alive():
            self._wrapped.stop(timeout=int(max(1, timeout)))

    def kill(self) -> None:
        status = self._status()
        if status in ("running", "paused"):
            self._wrapped.kill(signal="SIGKILL")
            self._wrapped.wait()

    def pause(self) -> None:
        self._wrapped.pause()

    def resume(self) -> None:
        self._wrapped.unpause()

    def logs(self, lines: int) -> str:
        if not self._started:
            return ""
        try:
            return self._wrapped.logs(tail=lines).decode(errors="replace").rstrip("\n")
        except Exception as exc:  # noqa: BLE001
            return f"(no container logs: {exc})"

    def remove(self) -> None:
        if not self._started:
            return
        with contextlib.suppress(Exception):
            if self._status() == "paused":
                self._wrapped.unpause()
        with contextlib.suppress(Exception):
            self._container.stop(force=True, delete_volume=True)


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

    Attributes a test uses: ``http_url`` (Hrana over HTTP, and the ``sync_url`` of an
    embedded replica), ``grpc_url`` (a primary's inter-node address, None on a replica
    node), ``rw_token`` / ``ro_token`` (None when auth is off), ``data_dir`` (sqld's
    ``--db-path``), ``backend``, ``role``, ``primary`` (of a replica node) and
    ``ready_seconds`` (how long the last start took to answer ``/health``).

    ``stop()`` / ``kill()`` / ``pause()`` / ``resume()`` / ``restart()`` inject faults;
    ``restart()`` keeps the data dir and the ports. ``close()`` (or leaving a ``with``
    block) removes the process or container and the temporary work dir. Tokens and keys
    never appear in ``repr`` or in error messages.
    """

    def __init__(
        self,
        *,
        role: Role,
        process: _BinaryProcess | _DockerProcess,
        http_port: int,
        grpc_port: int | None,
        work_dir: Path,
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


# --------------------------------------------------------------------------- launchers


_PORT_LOCK = threading.Lock()


def _launch(
    *,
    role: Role,
    backend: str | None,
    image: str | None,
    binary: str | os.PathLike[str] | None,
    auth: bool,
    keys: SqldKeys | None,
    key_format: KeyFormat,
    work_dir: str | os.PathLike[str] | None,
    http_port: int | None,
    grpc_port: int | None,
    primary: SqldServer | None,
    extra_args: list[str],
    startup_timeout: float,
) -> SqldServer:
    image = image or sqld_image()
    chosen = choose_backend(backend, image=image) if binary is None else (backend or "binary")
    if chosen == "binary":
        binary_path = Path(binary) if binary is not None else find_sqld_binary()
        if binary_path is None:
            raise SqldUnavailable(backend_unavailable_reason("binary") or "no sqld binary")

    owns_work_dir = work_dir is None
    work = Path(tempfile.mkdtemp(prefix=f"harel-edge-sqld-{role}-")) if work_dir is None else Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    _reap_leftover_processes_and_dirs()
    if owns_work_dir:
        (work / _OWNER_FILE).write_text(f"{os.getpid()}\n")
    if role == "primary" and auth and keys is None:
        keys = generate_keys()
    if not auth:
        keys = None
    if keys is not None:
        keys.write_public_key(work / "jwt_key", key_format)

    # Paths as sqld sees them: the same on the host, under /var/lib/sqld in a container.
    inside = Path(CONTAINER_WORK_DIR) if chosen == "docker" else work
    # A port picked by binding port 0 can be taken by someone else before sqld binds it;
    # when we picked it, try again with new ports rather than fail the test.
    attempts = 1 if http_port is not None else 3
    last_error: SqldStartError | None = None
    for _attempt in range(attempts):
        with _PORT_LOCK:
            port = http_port or _free_port()
            gport = None
            if role == "primary":
                gport = grpc_port or _free_port()
                while gport == port:
                    gport = _free_port()
        # The same settings as flags (binary) or as the env vars sqld reads for them (docker).
        settings = {
            "--db-path": ("SQLD_DB_PATH", str(inside / "data.sqld")),
            "--http-listen-addr": ("SQLD_HTTP_LISTEN_ADDR", f"{LOOPBACK}:{port}"),
        }
        if gport is not None:
            settings["--grpc-listen-addr"] = ("SQLD_GRPC_LISTEN_ADDR", f"{LOOPBACK}:{gport}")
        if primary is not None:
            if primary.grpc_url is None:
                raise ValueError("a replica node needs a primary that serves gRPC")
            settings["--primary-grpc-url"] = ("SQLD_PRIMARY_GRPC_URL", primary.grpc_url)
        if keys is not None:
            settings["--auth-jwt-key-file"] = ("SQLD_AUTH_JWT_KEY_FILE", str(inside / "jwt_key"))

        if chosen == "docker":
            env = {name: value for name, value in settings.values()}
            # The official image's entry point reads these two instead.
            env["SQLD_NODE"] = "replica" if primary is not None else "primary"
            if primary is not None:
                env["SQLD_PRIMARY_URL"] = env["SQLD_PRIMARY_GRPC_URL"]
            process: _BinaryProcess | _DockerProcess = _DockerProcess(
                image, env, ["--no-welcome", *extra_args], work, f"sqld-{role}"
            )
        else:
            args = [item for flag, (_env, value) in settings.items() for item in (flag, value)]
            process = _BinaryProcess(binary_path, [*args, "--no-welcome", *extra_args], work)
        server = SqldServer(
            role=role,
            process=process,
            http_port=port,
            grpc_port=gport,
            work_dir=work,
            data_dir=work / "data.sqld",
            owns_work_dir=owns_work_dir,
            keys=keys,
            primary=primary,
            startup_timeout=startup_timeout,
        )
        try:
            return server.start()
        except SqldStartError as exc:
            last_error = exc
            # Keep the work dir for the next attempt, and for the caller's eyes on failure.
            server._owns_work_dir = False  # noqa: SLF001
            server.close()
            if "Address already in use" not in str(exc):
                break
        except BaseException:
            server.close()
            raise
    if owns_work_dir:
        shutil.rmtree(work, ignore_errors=True)
    assert last_error is not None
    raise last_error


def start_sqld_primary(
    *,
    backend: str | None = None,
    image: str | None = None,
    binary: str | os.PathLike[str] | None = None,
    auth: bool = True,
    keys: SqldKeys | None = None,
    key_format: KeyFormat = "pem",
    work_dir: str | os.PathLike[str] | None = None,
    http_port: int | None = None,
    grpc_port: int | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    startup_timeout: float = 30.0,
) -> SqldServer:
    """Start a sqld primary on 127.0.0.1 and return it once ``/health`` answers.

    ``backend`` is 'docker' or 'binary' (default: see :func:`choose_backend`). With
    ``auth`` (the default) a new key pair is made unless ``keys`` is given; sqld reads
    its public key from a file in ``key_format`` ("pem" or "base64"). Without
    ``work_dir`` a temporary one is made and removed by ``close()``. Raises
    :class:`SqldUnavailable` if sqld cannot run here, :class:`SqldStartError` if it
    does not get ready within ``startup_timeout`` seconds.
    """
    return _launch(
        role="primary",
        backend=backend,
        image=image,
        binary=binary,
        auth=auth,
        keys=keys,
        key_format=key_format,
        work_dir=work_dir,
        http_port=http_port,
        grpc_port=grpc_port,
        primary=None,
        extra_args=list(extra_args),
        startup_timeout=startup_timeout,
    )


def start_sqld_replica_node(
    primary: SqldServer,
    *,
    backend: str | None = None,
    image: str | None = None,
    binary: str | os.PathLike[str] | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    http_port: int | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    startup_timeout: float = 30.0,
) -> SqldServer:
    """Start a sqld replica node of ``primary`` (``--primary-grpc-url``) on 127.0.0.1.

    It checks tokens with the primary's key, so the primary's tokens work on it, and
    forwards writes to the primary. ``backend`` defaults to the primary's. A replica node
    serves no gRPC of its own (sqld does not allow it), so its ``grpc_url`` is None.
    """
    return _launch(
        role="replica",
        backend=backend or primary.backend,
        image=image,
        binary=binary,
        auth=primary.keys is not None,
        keys=primary.keys,
        key_format="pem",
        work_dir=work_dir,
        http_port=http_port,
        grpc_port=None,
        primary=primary,
        extra_args=list(extra_args),
        startup_timeout=startup_timeout,
    )
