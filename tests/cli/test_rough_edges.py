"""The command's rough edges a new user met, each one mended: quiet logs at info, a
worker that says it started, one line per error, `--version`, choices in `--help`, a
confirmation before a purge of everything, plurals, empty tables, no database made by a typo,
"no token set", and an honest doctor with a read-only token."""

from __future__ import annotations

import http.server
import json
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import COMMAND, env_for, run

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


def _sqld_env(server, **overrides) -> dict[str, str]:
    return env_for({"profile": "sqld", "url": server.http_url, "auth_token": server.rw_token, **overrides})


@pytest.mark.sqld
def test_info_logging_does_not_print_a_line_per_http_request(fresh_sqld_primary, tmp_path):
    env = _sqld_env(fresh_sqld_primary)
    assert run(["migrate"], env, tmp_path).returncode == 0
    shown = run(["--log-level", "info", "--log-format", "console", "status"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "hrana exchange" not in shown.stderr, shown.stderr
    debug = run(["--log-level", "debug", "--log-format", "console", "status"], env, tmp_path)
    assert "hrana exchange" in debug.stderr, debug.stderr  # still there when debugging


def test_the_worker_says_it_started_at_the_default_log_level_and_stops_on_sigterm(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "w.db")})
    worker = subprocess.Popen(  # noqa: S603
        [COMMAND, "--log-format", "console", "worker", "--definitions", EXAMPLES],
        env=env, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in worker.stderr:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=60)
            assert line is not None, f"the worker ended without a start line: {''.join(seen)}"
            seen.append(line)
            if "worker started" in line:
                break
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert "machines=['order']" in seen[-1]
    assert code == 0


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


@pytest.fixture
def unavailable_primary() -> Iterator[str]:
    """A server on loopback that answers every request with 503: a primary that is down."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("args", [["status"], ["publish", "g", "E"]], ids=lambda a: a[0])
def test_a_primary_that_stays_down_is_one_line_on_stderr_however_often_it_was_retried(unavailable_primary, tmp_path, args):
    env = env_for({"profile": "sqld", "url": unavailable_primary, "retry_deadline": "1.5"})
    for level in ("warning", "info"):
        done = run(["--log-level", level, *args], env, tmp_path)
        assert done.returncode == 3
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("harel-edge: error: ") and "HTTP 503" in done.stderr


def test_version_prints_the_packages_version(tmp_path):
    from harel_edge import __version__

    done = run(["--version"], env_for(), tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"harel-edge {__version__}")


def test_help_shows_the_choices_instead_of_a_type(tmp_path):
    top = run(["--help"], env_for(), tmp_path).stdout
    assert "--profile <local|sqld|replica>" in top
    assert "--log-level <debug|info|warning|error>" in top
    assert "--log-format <auto|json|console>" in top
    purge = run(["dead-letter", "purge", "--help"], env_for(), tmp_path).stdout
    assert "--kind <message|workflow>" in purge
    assert "--yes" in purge
    refused = run(["--profile", "nope", "status"], env_for(), tmp_path)
    assert refused.returncode == 2 and "local, sqld, replica" in refused.stderr


def test_purge_all_asks_first_and_without_a_terminal_needs_yes(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    refused = run(["dead-letter", "purge", "--all"], env, tmp_path)
    assert refused.returncode == 2
    assert "add --yes" in refused.stderr and "nothing was deleted" in refused.stderr
    done = run(["dead-letter", "purge", "--all", "--yes"], env, tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "purged 0 dead letters")


def test_one_message_is_one_message_and_an_empty_queue_says_none_instead_of_an_empty_table(tmp_path):
    env = env_for({"profile": "local", "db_path": str(tmp_path / "q.db")})
    assert run(["migrate"], env, tmp_path).returncode == 0
    empty = run(["status"], env, tmp_path).stdout
    assert "0 messages in 0 groups" in empty
    assert "queue by priority and routing key: none" in empty
    assert "┏" not in empty  # no table drawn without rows
    assert run(["publish", "g", "E"], env, tmp_path).returncode == 0
    one = run(["status"], env, tmp_path).stdout
    assert "1 message in 1 group," in one
    assert "dead letters: 0 messages, 0 workflows" in one


def test_publish_to_a_database_file_that_does_not_exist_refuses_and_says_how_to_create_one(tmp_path):
    typo = tmp_path / "qeue.db"
    for args in (["publish", "g", "E"], ["publish", "--from", "-"]):
        done = run(args, env_for({"profile": "local", "db_path": str(typo)}), tmp_path, input='{"group": "g", "kind": "E"}')
        assert done.returncode == 5, done.stderr
        assert f"no database at {typo}" in done.stderr and "harel-edge migrate" in done.stderr
        assert not typo.exists()


@pytest.mark.sqld
@pytest.mark.parametrize("args", [["status"], ["publish", "g", "E"], ["migrate"]], ids=lambda a: a[0])
def test_no_token_set_on_a_primary_that_needs_one_says_the_token_is_not_set(fresh_sqld_primary, tmp_path, args):
    env = env_for({"profile": "sqld", "url": fresh_sqld_primary.http_url})
    done = run(args, env, tmp_path)
    assert done.returncode == 4
    assert "no auth token is set" in done.stderr and "HAREL_EDGE_AUTH_TOKEN" in done.stderr
    assert "does not conform" not in done.stderr


@pytest.mark.sqld
def test_doctor_with_a_read_only_token_passes_and_says_what_the_token_cannot_do(fresh_sqld_primary, tmp_path):
    assert run(["migrate"], _sqld_env(fresh_sqld_primary), tmp_path).returncode == 0
    env = _sqld_env(fresh_sqld_primary, auth_token=fresh_sqld_primary.ro_token)
    done = run(["doctor"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout
    assert "read-only" in done.stdout and "status and doctor" in done.stdout
    checks = json.loads(run(["doctor", "--json"], env, tmp_path).stdout)
    assert checks["ok"] is True
    assert fresh_sqld_primary.ro_token not in done.stdout + done.stderr
