"""Processes a test starts: workers putting one answer each on a queue the test reads, and
`harel-edge` commands.

They start from a fork server that imported harel_edge once (`context()`): a spawned process
imports it again each time (0.6 s of CPU here; 0.09 s forked from the server). The server opens
no connection, so no libsql connection crosses a fork."""

from __future__ import annotations

import locale
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# What every test's processes import, loaded once in the fork server. Not `harel_edge.cli`: its
# consoles read the environment (COLUMNS) when imported, so a command imports it afresh.
PRELOAD = [
    "harel.spec.states",
    "harel_edge.queue",
    "harel_edge.store",
    "harel_edge.durable",
    "harel_edge.worker",
    "harel_edge.testing.proxy",
    "typer",
    "aiohttp",
    "harel_edge.settings",
    "harel_edge.logs",
    "harel_edge.status",
    "harel_edge.inspection",
]


def context() -> Any:
    """The multiprocessing context for a test's processes: forked from a server that has
    imported `PRELOAD` and holds no connection or thread of libsql's."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def answers(ctx: Any, target: Callable[..., None], arguments: Sequence[tuple], results: Any, *, timeout: float) -> list:
    """Start `target(*args)` in a process for each `args`, and return the answer each put on
    `results` (in the order they came), once every process has ended."""
    processes = [ctx.Process(target=target, args=args) for args in arguments]
    for process in processes:
        process.start()
    try:
        return [results.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)


def command(executable: str, args: Sequence[str], env: dict[str, str], cwd: Path, *,
            input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the `harel-edge` console script's `main` with ARGS in a process forked from the server,
    as `subprocess.run(..., capture_output=True, text=True)` would run the script: its own
    environment, directory, descriptors 0-2 and exit code, without importing its libraries again."""
    with tempfile.TemporaryDirectory(prefix="harel-edge-command-") as scratch:
        stdin, stdout, stderr = (Path(scratch) / name for name in ("stdin", "stdout", "stderr"))
        stdin.write_text(input or "")
        stdout.touch()
        stderr.touch()
        process = context().Process(
            target=_run_command, args=(executable, list(args), env, str(cwd), str(stdin), str(stdout), str(stderr))
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([executable, *args], timeout)
        return subprocess.CompletedProcess(
            [executable, *args], process.exitcode, _read(stdout), _read(stderr)
        )


def _read(path: Path) -> str:
    with open(path, encoding=locale.getpreferredencoding(False), newline=None) as file:
        return file.read()


def _run_command(executable: str, args: list[str], env: dict[str, str], cwd: str,
                 stdin: str, stdout: str, stderr: str) -> None:
    """The forked side of `command`; multiprocessing turns its SystemExit into the exit code."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # harel_edge.connection's default, set when the server imported it, before this environment.
    os.environ.setdefault("RUST_LOG", "error")
    for fd, path, flags in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY), (2, stderr, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    encoding = locale.getpreferredencoding(False)
    sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115 - the process's own
    sys.stdout = open(1, "w", encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding=encoding, errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.argv = [executable, *args]
    from harel_edge.cli import app  # noqa: PLC0415 - after the environment is the command's

    sys.exit(app())
