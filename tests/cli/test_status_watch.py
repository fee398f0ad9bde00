"""`harel-edge status --watch` under a real terminal (tmux): it draws the queue and redraws it
as work arrives, and Ctrl-C ends it with exit code 0."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for, run


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


def screen_shows(socket: str, text: str, within: float = 60.0) -> str:
    """The pane's text once it contains `text` (polled; the deadline only guards against a hang)."""
    deadline, shown = time.monotonic() + within, ""
    while time.monotonic() < deadline:
        shown = tmux(socket, "capture-pane", "-p", "-J", "-t", "watch")
        if text in shown:
            return shown
        time.sleep(0.1)  # polling pace; the verdict is the pane's text
    raise AssertionError(f"the terminal never showed {text!r}; it showed:\n{shown}")


def test_status_watch_redraws_as_work_arrives_and_ctrl_c_ends_it_with_0(tmp_path: Path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: `apt-get install tmux` (.ci/run installs it)")
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    assert run(["publish", "first", "E"], env, tmp_path).returncode == 0
    socket = f"harel-edge-test-{uuid.uuid4().hex[:8]}"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("HAREL_EDGE_", "PATH")))
    command = f"cd {shlex.quote(str(tmp_path))} && env {exports} {COMMAND} status --watch --interval 0.3; echo exited $?; read done"
    tmux(socket, "-f", "/dev/null", "new-session", "-d", "-s", "watch", "-x", "160", "-y", "60", command)
    try:
        screen_shows(socket, "1 message in 1 group")
        assert run(["publish", "second", "E"], env, tmp_path).returncode == 0
        screen_shows(socket, "2 messages in 2 groups")
        tmux(socket, "send-keys", "-t", "watch", "C-c")
        shown = screen_shows(socket, "exited ")
        assert "exited 0" in shown and "Traceback" not in shown, shown
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
