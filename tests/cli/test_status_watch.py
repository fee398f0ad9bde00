"""`harel-edge status --watch` under a real terminal (tmux): it draws the queue and redraws it
as work arrives, says since when the primary is unreachable while it is down and draws the queue
again once it is back, and Ctrl-C ends it with exit code 0."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for, run


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


def screen_shows(socket: str, text: str, within: float = 60.0, *, absent: str | None = None) -> str:
    """The pane's text, its runs of spaces and line breaks made one space (a line the view wraps
    reads as one), once it contains `text` and not `absent`; polled, the deadline only guards
    against a hang."""
    deadline, shown = time.monotonic() + within, ""
    while time.monotonic() < deadline:
        shown = " ".join(tmux(socket, "capture-pane", "-p", "-J", "-t", "watch").split())
        if text in shown and (absent is None or absent not in shown):
            return shown
        time.sleep(0.1)  # polling pace; the verdict is the pane's text
    raise AssertionError(f"the terminal never showed {text!r}{f' without {absent!r}' if absent else ''}; it showed:\n{shown}")


@contextmanager
def watching(env: dict[str, str], cwd: Path) -> Iterator[str]:
    """`status --watch` running in a tmux pane of its own (its socket given to the test), and what
    the pane shows once it ends (`exited CODE`) checked for a traceback."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: `apt-get install tmux` (.ci/run installs it)")
    socket = f"harel-edge-test-{uuid.uuid4().hex[:8]}"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("HAREL_EDGE_", "PATH", "PYTHONPATH")))
    command = f"cd {shlex.quote(str(cwd))} && env {exports} {COMMAND} status --watch --interval 0.3; echo exited $?; read done"
    tmux(socket, "-f", "/dev/null", "new-session", "-d", "-s", "watch", "-x", "160", "-y", "60", command)
    try:
        yield socket
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def ctrl_c_ends_it_with_0(socket: str) -> None:
    tmux(socket, "send-keys", "-t", "watch", "C-c")
    shown = screen_shows(socket, "exited ")
    assert "exited 0" in shown and "Traceback" not in shown, shown


def test_status_watch_redraws_as_work_arrives_and_ctrl_c_ends_it_with_0(tmp_path: Path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    assert run(["publish", "first", "E"], env, tmp_path).returncode == 0
    with watching(env, tmp_path) as socket:
        screen_shows(socket, "1 message in 1 group")
        assert run(["publish", "second", "E"], env, tmp_path).returncode == 0
        screen_shows(socket, "2 messages in 2 groups")
        ctrl_c_ends_it_with_0(socket)


@pytest.mark.sqld
def test_status_watch_says_since_when_the_primary_is_unreachable_and_redraws_the_queue_once_it_is_back(
    fresh_sqld_primary, tmp_path: Path
):
    server = fresh_sqld_primary
    env = env_for({"profile": "sqld", "url": server.http_url, "auth_token": server.rw_token})
    assert run(["migrate"], env, tmp_path).returncode == 0
    assert run(["publish", "first", "E"], env, tmp_path).returncode == 0
    with watching(env, tmp_path) as socket:
        screen_shows(socket, "1 message in 1 group")
        server.stop()
        down = screen_shows(socket, f"cannot reach the primary at {server.http_url}")
        assert re.search(r"primary unreachable since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(\d+ s\)", down), down
        assert "its last view:" in down and "1 message in 1 group" in down, down
        assert "exited" not in down, down
        server.restart()
        assert run(["publish", "second", "E"], env, tmp_path).returncode == 0
        screen_shows(socket, "2 messages in 2 groups", absent="unreachable")
        ctrl_c_ends_it_with_0(socket)
