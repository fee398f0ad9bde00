"""sqld as something to start, stop, kill, pause and read logs from: a subprocess or a container.

Each is tagged with its owner's pid, so a later run removes what a killed run left (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harel_edge.testing.sqld.backends import Backend, _docker_client

# Where the work dir (data, key file) is mounted inside a container.
CONTAINER_WORK_DIR = "/var/lib/sqld"

# --------------------------------------------------------------------------- leftovers

# A killed test process runs no cleanup (and Ryuk is off): the first launch in a later
# process removes what a dead owner left (docs/testing.md).
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
        """SIGSTOP, then wait until every thread has stopped: the stop reaches each thread
        asynchronously, and on a loaded machine one answered another request first (seen on CI)."""
        self.signal(signal.SIGSTOP)
        for _ in range(1000):  # at most 10 s
            if _all_threads_stopped(self._proc.pid):
                return
            time.sleep(0.01)

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


def _all_threads_stopped(pid: int) -> bool:
    """Whether /proc shows every thread of `pid` stopped (state T), or the process gone."""
    try:
        stats = [path.read_text() for path in Path(f"/proc/{pid}/task").glob("*/stat")]
    except OSError:
        return False
    return all(stat.rpartition(")")[2].split()[0] in ("T", "t") for stat in stats)


class _DockerProcess:
    """sqld in a container on the host network, started through testcontainers."""

    backend: Backend = "docker"

    def __init__(
        self, image: str, env: dict[str, str], extra_args: list[str], work_dir: Path, name_hint: str
    ) -> None:
        """Configure sqld through `SQLD_*` env vars rather than flags, which work for our image and the
        official one alike; the command is the image's CMD plus `extra_args` (docs/testing.md).
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
