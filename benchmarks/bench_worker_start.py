"""How long `harel-edge worker` takes to start, and how much memory it holds, per profile.

Starts the command as a deployment does (one process, the demo's statechart and workflow),
waits for its "worker started" log line, and reads the process's resident memory
(VmRSS, and VmHWM: the peak) from /proc, with its child processes counted. sqld and replica
reach a real sqld (`harel_edge.testing`).

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_worker_start.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "harel_edge" / "examples"
COMMAND = str(Path(sys.executable).parent / "harel-edge")


def rss_kib(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if line.startswith(("VmRSS", "VmHWM"))}
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def measure(env: dict[str, str], cwd: Path) -> dict:
    log = cwd / "worker.log"
    began = time.perf_counter()
    process = subprocess.Popen(
        [COMMAND, "--log-format", "json", "--log-level", "info", "worker", "-D", str(EXAMPLES), "--workflow", "fulfil=harel_edge.examples.workflow:fulfil"],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        while '"worker started"' not in log.read_text():
            if process.poll() is not None:
                raise SystemExit(f"the worker exited: {log.read_text()[-2000:]}")
            time.sleep(0.01)
        started = time.perf_counter() - began
        time.sleep(1.0)  # let it settle before reading its memory
        pids = [process.pid, *children(process.pid)]
        rss = sum(rss_kib(p)[0] for p in pids)
        return {"start_s": round(started, 2), "processes": len(pids), "rss_mib": round(rss / 1024, 1)}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def main() -> None:
    from harel_edge.testing import start_sqld_primary  # noqa: PLC0415

    base = {k: v for k, v in os.environ.items() if not k.startswith("HAREL_")}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, start_sqld_primary() as server:
        tmp_path = Path(tmp)
        remote = {"HAREL_EDGE_AUTH_TOKEN": server.rw_token}
        profiles = {
            "local": {"HAREL_EDGE_PROFILE": "local", "HAREL_EDGE_DB_PATH": str(tmp_path / "local.db")},
            "sqld": {"HAREL_EDGE_PROFILE": "sqld", "HAREL_EDGE_URL": server.http_url, **remote},
            "replica": {
                "HAREL_EDGE_PROFILE": "replica",
                "HAREL_EDGE_SYNC_URL": server.http_url,
                "HAREL_EDGE_DB_PATH": str(tmp_path / "replica.db"),
                **remote,
            },
        }
        for name, env in profiles.items():
            rows[name] = measure({**base, **env}, tmp_path)
    print(json.dumps(rows, indent=2))
    print("\n| profile | start (s) | processes | resident memory (MiB, all processes) |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in rows.items():
        print(f"| {name} | {row['start_s']} | {row['processes']} | {row['rss_mib']} |")


if __name__ == "__main__":
    main()
