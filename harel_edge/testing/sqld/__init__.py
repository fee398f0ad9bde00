"""Start a real sqld (libsql-server) for tests, a primary or a replica node of one: guarantees must
hold against the real server, never a mock (docs/testing.md).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from harel_edge.testing.auth import KeyFormat, SqldKeys, generate_keys
from harel_edge.testing.sqld.backends import CA_BUNDLE as CA_BUNDLE
from harel_edge.testing.sqld.backends import (
    DEFAULT_IMAGE,
    SqldUnavailable,
    backend_unavailable_reason,
    choose_backend,
    find_sqld_binary,
    sqld_image,
)
from harel_edge.testing.sqld.backends import Backend as Backend
from harel_edge.testing.sqld.processes import (
    _OWNER_FILE,
    CONTAINER_WORK_DIR,
    _BinaryProcess,
    _DockerProcess,
    _reap_leftover_processes_and_dirs,
)
from harel_edge.testing.sqld.processes import _pid_alive as _pid_alive  # tests/e2e/test_compose.py
from harel_edge.testing.sqld.server import _LIVE, LOOPBACK, Role, SqldServer, SqldStartError, wait_until

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "DEFAULT_IMAGE",
    "LAUNCHER_PORTS",
    "SqldServer",
    "SqldStartError",
    "SqldUnavailable",
    "backend_unavailable_reason",
    "choose_backend",
    "find_sqld_binary",
    "launcher_ports",
    "sqld_image",
    "start_sqld_primary",
    "start_sqld_replica_node",
    "wait_until",
]


# The launcher's ports lie below the kernel's ephemeral range (32768-60999 on Linux), so no
# outgoing connection takes a killed server's port before it restarts there, and each
# pytest-xdist worker picks from a slice of its own, so no other worker starts a server there.
LAUNCHER_PORTS = (18200, 19999)


def launcher_ports() -> tuple[int, int]:
    """This process's slice of `LAUNCHER_PORTS` (inclusive): all of it outside pytest-xdist."""
    low, high = LAUNCHER_PORTS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if count <= 1 or not worker.startswith("gw") or not worker[2:].isdigit():
        return low, high
    size = (high - low + 1) // count
    index = int(worker[2:]) % count
    return low + index * size, low + (index + 1) * size - 1


def _free_port(avoid: set[int]) -> int:
    """A port of this process's slice that is free on 127.0.0.1 now and held by none of its
    servers (a killed one keeps its port for its restart), tried in random order."""
    low, high = launcher_ports()
    taken = avoid | {port for server in list(_LIVE) for port in (server.http_port, server.grpc_port, server.admin_port)}
    candidates = [port for port in range(low, high + 1) if port not in taken]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise SqldStartError(f"no free port on {LOOPBACK} between {low} and {high}")


# --------------------------------------------------------------------------- launchers

_PORT_LOCK = threading.Lock()
# A primary checkpoints its WAL on this timer instead of after the commit that fills 1,000 pages:
# with that automatic checkpoint, concurrent writers wedge sqld 0.24's write-lock queue
# (every request waits, 200 % CPU, for good), measured in docs/operations.md.
CHECKPOINT_INTERVAL_S = 5


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
    checkpoint_interval_s: int | None = None,
    namespaces: bool = False,
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
    # A port found free can be taken by another program before sqld binds it; when we picked
    # it, try again with new ports rather than fail the test: five tries.
    attempts = 1 if http_port is not None else 5
    last_error: SqldStartError | None = None
    for _attempt in range(attempts):
        with _PORT_LOCK:
            port = http_port or _free_port(set())
            gport = aport = None
            if role == "primary":
                gport = grpc_port or _free_port({port})
            if namespaces:
                aport = _free_port({port, gport} - {None})
        more = ["--enable-namespaces", "--disable-default-namespace", "--admin-listen-addr", f"{LOOPBACK}:{aport}"] if aport else []
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
        if checkpoint_interval_s is not None:
            settings["--checkpoint-interval-s"] = ("SQLD_CHECKPOINT_INTERVAL_S", str(checkpoint_interval_s))
        if keys is not None:
            settings["--auth-jwt-key-file"] = ("SQLD_AUTH_JWT_KEY_FILE", str(inside / "jwt_key"))

        if chosen == "docker":
            env = {name: value for name, value in settings.values()}
            # The official image's entry point reads these two instead.
            env["SQLD_NODE"] = "replica" if primary is not None else "primary"
            if primary is not None:
                env["SQLD_PRIMARY_URL"] = env["SQLD_PRIMARY_GRPC_URL"]
            process: _BinaryProcess | _DockerProcess = _DockerProcess(
                image, env, ["--no-welcome", *more, *extra_args], work, f"sqld-{role}"
            )
        else:
            args = [item for flag, (_env, value) in settings.items() for item in (flag, value)]
            process = _BinaryProcess(binary_path, [*args, "--no-welcome", *more, *extra_args], work)
        server = SqldServer(
            role=role,
            process=process,
            http_port=port,
            grpc_port=gport,
            admin_port=aport,
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
    checkpoint_interval_s: int | None = CHECKPOINT_INTERVAL_S,
    namespaces: bool = False,
) -> SqldServer:
    """Start a sqld primary on 127.0.0.1 and return it once `/health` answers. It checkpoints
    every `checkpoint_interval_s` seconds (None: sqld's automatic checkpoint, which can wedge it).
    With `namespaces`, it serves many databases and no default one, its admin API at `admin_url`.

    `SqldUnavailable` if sqld cannot run here, `SqldStartError` if not ready in time (docs/testing.md).
    """
    return _launch(
        role="primary", backend=backend, image=image, binary=binary, auth=auth, keys=keys, key_format=key_format,
        work_dir=work_dir, http_port=http_port, grpc_port=grpc_port, primary=None,
        extra_args=list(extra_args), startup_timeout=startup_timeout, checkpoint_interval_s=checkpoint_interval_s,
        namespaces=namespaces,
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
    """Start a sqld replica node of `primary` (`--primary-grpc-url`) on 127.0.0.1.

    It shares the primary's key and forwards writes to it; its `grpc_url` is None (docs/testing.md).
    """
    return _launch(
        role="replica", backend=backend or primary.backend, image=image, binary=binary,
        auth=primary.keys is not None, keys=primary.keys, key_format="pem", work_dir=work_dir,
        http_port=http_port, grpc_port=None, primary=primary,
        extra_args=list(extra_args), startup_timeout=startup_timeout,
    )
