"""Running `harel-edge` as a user does, for the tests in this directory.

Each command is a process of its own running the console script's `main`, with an environment
that holds only what the test sets, so a developer's own HAREL_EDGE_* variables cannot change
what a test sees; each test runs in its own directory, so no `.env` is found. `run` forks it from
a server that imported the libraries once (0.07 s instead of 0.5 s of CPU a command); the tests
of a long-running command (`worker`, `dashboard`, `status --watch`) start the script itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harel_edge.testing import spawned

COMMAND = str(Path(sys.executable).parent / "harel-edge")


def env_for(values: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    """A clean environment: PATH and the like, no HAREL_* from the caller, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAREL_", "RUST_LOG"))}
    for key, value in (values or {}).items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"HAREL_EDGE_{key.upper()}"] = ",".join(value) if isinstance(value, tuple) else str(value)
    env.update(extra)
    return env


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess:
    """Run `harel-edge ARGS` (its stdin `input`, else empty and never a terminal) and return what
    it printed and its exit code."""
    return spawned.command(COMMAND, args, env, cwd, input=input, timeout=timeout)


def unprivileged(command: list[str]) -> list[str]:
    """`command` as a user whom file permissions bind.

    Root's writes ignore permission bits. As root the command runs in a new user namespace with
    no mapping (`unshare --user`): there root's own files are checked against their owner bits,
    as anybody's are, so a 0444 file or a 0555 directory really cannot be written.
    """
    return ["unshare", "--user", *command] if os.geteuid() == 0 else command


def permissions_hold(directory: Path) -> bool:
    """Whether `unprivileged` really cannot write a read-only file here (no user namespaces, or
    a filesystem that ignores modes, would make a read-only test pass without meaning)."""
    probe = directory / "permission-probe"
    probe.write_bytes(b"")
    probe.chmod(0o444)
    try:
        tried = subprocess.run(
            unprivileged([sys.executable, "-c", f"open({str(probe)!r}, 'ab')"]), capture_output=True
        )
    except OSError:
        return False
    finally:
        probe.unlink()
    return tried.returncode != 0 and b"PermissionError" in tried.stderr


def run_unprivileged(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess:
    """`run`, as a user whom file permissions bind (see `unprivileged`)."""
    return subprocess.run(
        unprivileged([COMMAND, *args]), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
