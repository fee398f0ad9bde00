"""`harel-edge demo`, the README's first command, as a user runs it."""

from __future__ import annotations

from cli_helpers import env_for, run


def test_the_demo_processes_everything_with_two_workers_and_exits_0(tmp_path):
    # The user's own settings must not leak into the demo: point them somewhere that would fail.
    env = env_for({"profile": "sqld", "url": "http://127.0.0.1:9"})
    result = run(["demo", "--orders", "6", "--workflows", "3"], env, tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "what each worker did" in out and "edge-1" in out and "edge-2" in out
    assert "done in" in out and "3 charges for 3 workflows (each exactly once)" in out
    assert list(tmp_path.iterdir()) == [], "the demo cleans up after itself"


def test_the_demo_keeps_its_database_when_given_one(tmp_path):
    path = tmp_path / "demo.db"
    result = run(
        ["demo", "--db", str(path), "--orders", "3", "--workflows", "1"], env_for({}), tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    status = run(["status", "--json"], env_for({"db_path": str(path)}), tmp_path)
    assert status.returncode == 0 and '"messages": 0' in status.stdout
