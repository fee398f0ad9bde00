"""docs/quickstart.md's "Run a worker on a file of your own", run line by line as it is written:
the venv activated, the worker started with its documented options, the execution driven with
the documented publishes, until the order is delivered and the worker stops with SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from harel_edge.testing import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def section_commands(title: str) -> list[list[str]]:
    """The `sh` blocks of the quickstart's section `title`, each a list of commands (a line ending
    in a backslash joined to the next)."""
    text = QUICKSTART.read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    return [[line for line in block.replace("\\\n", " ").splitlines() if line.strip()] for block in blocks]


def bash(script: str, cwd: Path, env: dict[str, str], **how) -> subprocess.Popen | subprocess.CompletedProcess:
    if how.pop("background", False):
        return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_quickstart_runs_as_written_and_delivers_the_order(tmp_path):
    # The repository's root as a user has it: the package's examples and the venv `make demo` made.
    (tmp_path / "harel_edge").symlink_to(ROOT / "harel_edge")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAREL_")}
    env["PATH"] = "/usr/bin:/bin"  # harel-edge is found only once the venv is activated
    setup, drive = section_commands("2. Run a worker on a file of your own")
    worker_line = next(line for line in setup if line.startswith("harel-edge worker"))
    exports = [line for line in setup if line.startswith((". ", "export "))]
    prepared = bash("set -e\n" + "\n".join(line for line in setup if line != worker_line), tmp_path, env)
    assert prepared.returncode == 0, prepared.stderr
    assert (tmp_path / "queue.db").exists(), "migrate created the database the quickstart names"
    worker = bash("set -e\n" + "\n".join(exports) + f"\nexec {worker_line}", tmp_path, env, background=True)
    try:
        driven = bash("set -e\n" + "\n".join(exports + drive), tmp_path, env)
        assert driven.returncode == 0, driven.stdout + driven.stderr
        assert "published Start" in driven.stdout and "queued 2 of 2 events" in driven.stdout
        show = "set -e\n" + "\n".join(exports) + "\nharel-edge executions show order-1 --json"

        def delivered() -> bool:
            shown = bash(show, tmp_path, env)
            return shown.returncode == 0 and json.loads(shown.stdout)["state"].endswith("Delivered")

        wait_until(delivered, timeout=120, what="order-1 delivered", interval=0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
