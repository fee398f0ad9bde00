"""Bad input gets a clear message on stderr, a non-zero exit code, and changes nothing stored.

Every case runs the command as a user would (subprocess). For a file, "nothing changed" is its
bytes (and those of its -wal and -shm files); for a sqld primary, the rows of every table, read
with a read-write token before and after.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import libsql
import pytest
from cli_helpers import env_for, permissions_hold, run, run_unprivileged
from harel.spec.states import Event

from harel_edge import LibsqlTransport

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")
WRITERS = [["publish", "g", "Pay", "--data", "{}"], ["migrate"], ["worker", "-D", EXAMPLES]]
READERS = [["status"], ["doctor"]]


def fingerprint(path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + "*"))
    }


def a_queue(path: Path) -> Path:
    transport = LibsqlTransport(str(path))
    transport.publish("kept", Event(kind="Stored"), priority=1, routing_key="eu")
    transport.close()
    return path


def primary_rows(server) -> list:
    connection = libsql.connect(server.http_url, auth_token=server.rw_token, isolation_level=None)
    tables = [
        r[0]
        for r in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
    ]
    rows = [(t, connection.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall()) for t in tables]
    connection.close()
    return rows


def assert_refused(result, code: int, *words: str) -> None:
    """The exit code, and the error as the last line on stderr (after any retry log lines)."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("harel-edge: error: "), result.stderr
    for word in words:
        assert word in last, (word, last)


# ---- local files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", WRITERS + READERS, ids=lambda a: a[0])
def test_a_file_that_is_not_a_database_is_refused_and_left_untouched(args, tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are somebody's notes, not a database\n" * 50)
    before = fingerprint(path)
    result = run(args, env_for({"profile": "local", "db_path": str(path)}), tmp_path)
    if args[0] == "doctor":
        assert result.returncode == 1 and "not a SQLite/libSQL database" in result.stdout
    else:
        assert_refused(result, 5, "not a SQLite/libSQL database", "untouched")
    assert fingerprint(path) == before


@pytest.mark.parametrize("args", WRITERS + READERS, ids=lambda a: a[0])
def test_a_damaged_database_is_refused_and_left_untouched(args, tmp_path):
    path = a_queue(tmp_path / "queue.db")
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # the schema page, past the header
    path.write_bytes(bytes(data))
    before = fingerprint(path)
    result = run(args, env_for({"profile": "local", "db_path": str(path)}), tmp_path)
    if args[0] == "doctor":
        assert result.returncode == 1 and "damaged" in result.stdout
    else:
        assert_refused(result, 5, "damaged", "backup")
    assert fingerprint(path) == before


@pytest.mark.parametrize("args", WRITERS + READERS, ids=lambda a: a[0])
def test_another_applications_database_is_refused_and_left_untouched(args, tmp_path):
    path = tmp_path / "shop.db"
    shop = sqlite3.connect(path)
    shop.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    shop.execute("INSERT INTO customers (name) VALUES ('ada')")
    shop.commit()
    shop.close()
    before = fingerprint(path)
    result = run(args, env_for({"profile": "local", "db_path": str(path)}), tmp_path)
    if args[0] == "doctor":
        assert result.returncode == 1 and "another application's tables (customers)" in result.stdout
    else:
        assert_refused(result, 5, "another application's tables (customers)", "--adopt")
    assert fingerprint(path) == before


def test_a_database_from_a_newer_harel_edge_is_refused_and_left_untouched(tmp_path):
    path = a_queue(tmp_path / "queue.db")
    newer = sqlite3.connect(path)
    newer.execute("PRAGMA user_version = 99")
    newer.commit()
    newer.close()
    before = fingerprint(path)
    for args in WRITERS + [["status"]]:
        assert_refused(run(args, env_for({"profile": "local", "db_path": str(path)}), tmp_path), 5, "newer")
    assert fingerprint(path) == before


def damage_a_page(path: Path, table: str = "harel_transport_messages") -> None:
    """Break the free-space list of one table's page, leaving the header and the schema intact:
    SQLite opens the file and reads its schema, and only an integrity check sees the damage."""
    reader = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    ((page_size,),) = reader.execute("PRAGMA page_size").fetchall()
    ((root,),) = reader.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchall()
    reader.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page_size
    data[start + 1 : start + 3] = (page_size - 96).to_bytes(2, "big")  # the first freeblock
    path.write_bytes(bytes(data))
    checked = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    problems = checked.execute("PRAGMA quick_check").fetchall()
    checked.close()
    assert f"Page {root}: free space corruption" in str(problems), problems


@pytest.mark.parametrize("journal", ["wal", "delete"])
@pytest.mark.parametrize("args", WRITERS + READERS, ids=lambda a: a[0])
def test_a_database_with_a_damaged_page_is_refused_by_every_command_and_left_byte_for_byte(
    args, journal, tmp_path
):
    path = a_queue(tmp_path / "queue.db")
    if journal == "delete":  # a file in rollback-journal mode, as another SQLite program leaves it
        other = sqlite3.connect(path)
        other.execute("PRAGMA journal_mode=delete")
        other.close()
    damage_a_page(path)
    before = fingerprint(path)
    assert list(before) == ["queue.db"]
    result = run(args, env_for({"profile": "local", "db_path": str(path)}), tmp_path, timeout=30)
    if args[0] == "doctor":
        assert result.returncode == 1, result.stdout + result.stderr
        assert "FAIL  database file" in result.stdout and "free space corruption" in result.stdout
        assert "backup" in result.stdout
    else:
        assert_refused(result, 5, "damaged", "free space corruption", "backup", "untouched")
    assert fingerprint(path) == before  # the same bytes, and no -wal, -shm or -journal beside it


# ---- read-only files and directories ----------------------------------------------------------
# Run as a user whom file permissions bind (as root: in a user namespace, see cli_helpers).


@pytest.fixture
def binding(tmp_path):
    if not permissions_hold(tmp_path):
        pytest.skip("cannot run the command as a user whom file permissions bind (no user namespaces)")
    return tmp_path


def read_only(*paths: Path) -> None:
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)


def a_queue_left_with_its_wal(path: Path) -> Path:
    """A queue whose last commit is only in its -wal: the files a crashed worker leaves behind."""
    source = path.parent.parent / "source" / path.name
    path.parent.mkdir()
    transport = LibsqlTransport(str(source))
    transport.publish("kept", Event(kind="Stored"), priority=1, routing_key="eu")
    transport.publish("in-the-wal", Event(kind="Stored"), priority=0)
    for suffix in ("", "-wal"):  # while it is open, as a crash would leave them
        shutil.copyfile(f"{source}{suffix}", f"{path}{suffix}")
    transport.close()
    return path


@pytest.mark.parametrize("args", WRITERS, ids=lambda a: a[0])
def test_a_read_only_database_is_refused_by_the_writers_before_anything_is_created(args, binding):
    path = a_queue(binding / "queue.db")
    read_only(path)
    before = fingerprint(path)
    result = run_unprivileged(args, env_for({"profile": "local", "db_path": str(path)}), binding)
    assert_refused(result, 5, "read-only", "chmod", "HAREL_EDGE_DB_PATH", "nothing was changed")
    assert fingerprint(path) == before


@pytest.mark.parametrize("args", WRITERS, ids=lambda a: a[0])
def test_a_database_in_a_read_only_directory_is_refused_by_the_writers_before_anything_is_created(
    args, binding
):
    path = a_queue(binding / "data" / "queue.db")
    read_only(path.parent)
    before = fingerprint(path)
    result = run_unprivileged(args, env_for({"profile": "local", "db_path": str(path)}), binding)
    assert_refused(result, 5, f"{path.parent} is not writable", "-wal", "nothing was changed")
    assert fingerprint(path) == before


@pytest.mark.parametrize("where", ["queue.db", "missing/queue.db"], ids=["new file", "new directory"])
@pytest.mark.parametrize("args", WRITERS, ids=lambda a: a[0])
def test_a_new_database_in_a_read_only_directory_is_refused_with_what_to_do(args, where, binding):
    directory = binding / "data"
    directory.mkdir()
    read_only(directory)
    path = directory / where
    result = run_unprivileged(args, env_for({"profile": "local", "db_path": str(path)}), binding)
    if args[0] == "publish":  # publish creates no database at all: `migrate` (or a worker) does
        assert_refused(result, 5, f"no database at {path}", "harel-edge migrate")
    else:
        assert_refused(result, 5, f"cannot create {path}", f"{directory} is not writable", "HAREL_EDGE_DB_PATH")
    assert sorted(directory.iterdir()) == []


@pytest.mark.parametrize("directory_too", [False, True], ids=["file", "file and directory"])
def test_status_reads_a_read_only_database_and_its_wal_without_creating_files_beside_it(
    directory_too, binding
):
    path = a_queue_left_with_its_wal(binding / "data" / "queue.db")
    read_only(path, Path(f"{path}-wal"), *([path.parent] if directory_too else []))
    before = fingerprint(path)
    assert list(before) == ["queue.db", "queue.db-wal"]
    result = run_unprivileged(["status", "--json"], env_for({"db_path": str(path)}), binding)
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"messages": 2' in result.stdout  # the commit only the -wal holds was read
    assert fingerprint(path) == before


@pytest.mark.parametrize("args", WRITERS + [["status"]], ids=lambda a: a[0])
def test_a_database_this_user_cannot_read_is_refused_with_what_to_do(args, binding):
    path = a_queue(binding / "queue.db")
    path.chmod(0o000)
    before = fingerprint(path)
    result = run_unprivileged(args, env_for({"db_path": str(path)}), binding)
    assert_refused(result, 5, f"{path} cannot be read by this user", "chmod", "nothing was changed")
    assert fingerprint(path) == before


@pytest.mark.parametrize("what", ["file", "directory"])
def test_doctor_reports_a_database_this_user_cannot_write_and_what_to_do(what, binding):
    path = a_queue(binding / "data" / "queue.db")
    read_only(path if what == "file" else path.parent)
    before = fingerprint(path)
    result = run_unprivileged(["doctor"], env_for({"db_path": str(path)}), binding)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  write access" in result.stdout and "chmod" in result.stdout
    assert fingerprint(path) == before


# ---- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["status"], ["doctor"], ["publish", "g", "E"]], ids=lambda a: a[0])
def test_a_token_with_whitespace_inside_it_is_refused_naming_the_variable_and_never_shown(args, tmp_path):
    path = a_queue(tmp_path / "queue.db")
    before = fingerprint(path)
    token = "eyJhbGciOiJFZERTQSJ9.eyJhIjoicncifQ\nsecret-tail"
    result = run(args, env_for({"db_path": str(path), "auth_token": token}), tmp_path)
    assert_refused(result, 2, "HAREL_EDGE_AUTH_TOKEN", "whitespace inside it")
    assert "secret-tail" not in result.stdout + result.stderr
    assert fingerprint(path) == before


def test_a_misspelled_variable_is_warned_about_naming_the_setting_it_resembles(tmp_path):
    path = a_queue(tmp_path / "queue.db")
    env = env_for({"db_path": str(path)}, HAREL_EDGE_PROFLE="sqld", HAREL_EDGE_SQLD_BACKEND="binary")
    result = run(["status"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "HAREL_EDGE_PROFLE" in line]
    assert len(warnings) == 1 and "HAREL_EDGE_PROFILE" in warnings[0], result.stderr
    assert "HAREL_EDGE_SQLD_BACKEND" not in result.stderr  # the test fixtures' own variable is known


def test_a_misspelled_variable_in_the_env_file_is_warned_about_too(tmp_path):
    path = a_queue(tmp_path / "queue.db")
    (tmp_path / "edge.env").write_text(f"HAREL_EDGE_DB_PATH={path}\nHAREL_EDGE_VISIBILTY=5\n")
    result = run(["--env-file", "edge.env", "status"], env_for({}), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "HAREL_EDGE_VISIBILTY" in result.stderr and "HAREL_EDGE_VISIBILITY" in result.stderr


@pytest.mark.parametrize(
    "args, variables, words",
    [
        (
            ["status"],
            {"profile": "bogus"},
            ["HAREL_EDGE_PROFILE='bogus' is not a profile", "local, sqld, replica"],
        ),
        (["worker", "-D", EXAMPLES], {"profile": "Sqld2"}, ["is not a profile"]),
        (["config", "show"], {"profile": "cloud"}, ["is not a profile"]),
        (
            ["publish", "g", "E"],
            {"profile": "sqld"},
            ["HAREL_EDGE_PROFILE=sqld needs the server", "HAREL_EDGE_URL"],
        ),
        (
            ["doctor"],
            {"profile": "sqld", "url": "ftp://example.com"},
            ["HAREL_EDGE_URL='ftp://example.com' is not"],
        ),
        (["migrate"], {"profile": "replica"}, ["needs its primary", "HAREL_EDGE_SYNC_URL"]),
        (["status"], {"sync_interval": "0.001"}, ["HAREL_EDGE_SYNC_INTERVAL"]),
    ],
    ids=["status", "worker", "config", "publish", "doctor", "migrate", "interval"],
)
def test_a_wrong_configuration_names_the_variable_and_exits_2(args, variables, words, tmp_path):
    path = a_queue(tmp_path / "queue.db")
    before = fingerprint(path)
    result = run(args, env_for({"db_path": str(path), **variables}), tmp_path)
    assert_refused(result, 2, *words)
    assert fingerprint(path) == before


def test_an_unknown_profile_given_as_an_option_is_refused(tmp_path):
    assert_refused(run(["--profile", "edge", "status"], env_for({}), tmp_path), 2, "'edge' is not a profile")


@pytest.mark.parametrize(
    "data, words",
    [("{not json", ["--data is not JSON"]), ("[1, 2]", ["--data must be a JSON object"])],
    ids=["not json", "not an object"],
)
def test_publish_refuses_data_that_is_not_a_json_object(data, words, tmp_path):
    path = a_queue(tmp_path / "queue.db")
    before = fingerprint(path)
    assert_refused(
        run(["publish", "g", "E", "--data", data], env_for({"db_path": str(path)}), tmp_path), 2, *words
    )
    assert fingerprint(path) == before


def test_publish_refuses_a_priority_out_of_range(tmp_path):
    path = a_queue(tmp_path / "queue.db")
    before = fingerprint(path)
    result = run(["publish", "g", "E", "--priority", "9"], env_for({"db_path": str(path)}), tmp_path)
    assert result.returncode == 2 and "--priority" in result.stderr
    assert fingerprint(path) == before


# ---- a real sqld -----------------------------------------------------------------------------------


def sqld_env(server, **overrides) -> dict[str, str]:
    values = {"profile": "sqld", "url": server.http_url, "auth_token": server.rw_token, "retry_attempts": "3"}
    return env_for({**values, **overrides})


def replica_env(server, path: Path, **overrides) -> dict[str, str]:
    values = {
        "profile": "replica",
        "sync_url": server.http_url,
        "db_path": str(path),
        "auth_token": server.rw_token,
        "retry_attempts": "3",
    }
    return env_for({**values, **overrides})


@pytest.fixture(scope="module")
def stored(module_sqld_primary, tmp_path_factory):
    """A primary holding one message, published through the command; shared by the module's
    tests, each of which compares the primary's rows before and after its own command."""
    tmp_path = tmp_path_factory.mktemp("stored")
    assert (
        run(["publish", "kept", "Stored", "-r", "eu"], sqld_env(module_sqld_primary), tmp_path).returncode == 0
    )
    return module_sqld_primary


# Which command meets which profile: every command is covered, without running them all on both.
PAIRS = [
    (["publish", "g", "Pay"], "sqld"),
    (["migrate"], "replica"),
    (["worker", "-D", EXAMPLES], "sqld"),
    (["worker", "-D", EXAMPLES], "replica"),
    (["status"], "replica"),
    (["doctor"], "sqld"),
]


def env_of(profile: str, server, tmp_path: Path, **overrides) -> dict[str, str]:
    return (
        sqld_env(server, **overrides)
        if profile == "sqld"
        else replica_env(server, tmp_path / "r.db", **overrides)
    )


@pytest.mark.parametrize("args, profile", PAIRS, ids=lambda v: v if isinstance(v, str) else v[0])
def test_a_wrong_token_is_refused_and_changes_nothing(args, profile, stored, tmp_path):
    before = primary_rows(stored)
    result = run(args, env_of(profile, stored, tmp_path, auth_token="not-a-jwt"), tmp_path)
    if args[0] == "doctor":
        assert result.returncode == 1 and "FAIL  auth: the primary refused the token" in result.stdout
    else:
        assert_refused(result, 4, "refused the credentials", "HAREL_EDGE_AUTH_TOKEN")
    assert primary_rows(stored) == before
    assert not (tmp_path / "r.db").exists()


def test_an_expired_token_is_refused_and_changes_nothing(stored, tmp_path):
    before = primary_rows(stored)
    expired = stored.token("rw", expires_in=-300)
    assert_refused(run(["publish", "g", "E"], sqld_env(stored, auth_token=expired), tmp_path), 4, "expired")
    assert primary_rows(stored) == before


@pytest.mark.parametrize(
    "args, profile",
    [p for p in PAIRS if p[0][0] in ("publish", "migrate", "worker")],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_a_read_only_token_cannot_write_and_changes_nothing(args, profile, stored, tmp_path):
    before = primary_rows(stored)
    result = run(args, env_of(profile, stored, tmp_path, auth_token=stored.ro_token), tmp_path)
    assert_refused(result, 4, "reading only", "read-write token", "nothing was changed")
    assert primary_rows(stored) == before


def test_doctor_says_a_read_only_token_cannot_write_but_passes_since_doctor_only_reads(stored, tmp_path):
    result = run(["doctor"], sqld_env(stored, auth_token=stored.ro_token), tmp_path)
    assert result.returncode == 0
    assert "WARN  auth: the token is read-only" in result.stdout and "read-write token" in result.stdout


@pytest.mark.parametrize(
    "args, profile",
    [p for p in PAIRS if p[0][0] != "doctor"],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_an_unreachable_primary_is_reported_as_such(args, profile, stored, tmp_path):
    before = primary_rows(stored)
    nowhere = "http://127.0.0.1:9"
    key = "url" if profile == "sqld" else "sync_url"
    result = run(args, env_of(profile, stored, tmp_path, **{key: nowhere}), tmp_path)
    assert_refused(result, 3, "cannot reach the primary at http://127.0.0.1:9", "HTTP address")
    assert primary_rows(stored) == before
    assert not (tmp_path / "r.db").exists()


def test_a_stopped_primary_is_reported_as_unreachable_and_doctor_says_what_to_check(fresh_sqld_primary, tmp_path):
    env = sqld_env(fresh_sqld_primary)
    fresh_sqld_primary.stop()
    assert_refused(run(["publish", "g", "E"], env, tmp_path), 3, "cannot reach the primary")
    result = run(["doctor"], env, tmp_path)
    assert (
        result.returncode == 1
        and "FAIL  connectivity" in result.stdout
        and "check that it runs" in result.stdout
    )


@pytest.mark.parametrize(
    "args, profile",
    [p for p in PAIRS if p[0][0] != "worker"],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_a_valid_token_with_a_trailing_newline_is_accepted(args, profile, stored, tmp_path):
    """As a token file read whole gives it (a secret mounted as a file, a line of a script)."""
    result = run(args, env_of(profile, stored, tmp_path, auth_token=stored.rw_token + "\n"), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_token_never_appears_in_output_or_errors(stored, tmp_path):
    token = stored.ro_token
    outputs = []
    for args in WRITERS + READERS + [["config", "show"]]:
        result = run(args, sqld_env(stored, auth_token=token), tmp_path)
        outputs.append(result.stdout + result.stderr)
    assert not any(token in text for text in outputs)


@pytest.mark.parametrize("args", [["publish", "g", "E"], ["migrate"]], ids=lambda a: a[0])
def test_a_read_only_token_is_refused_on_an_empty_primary_too(args, fresh_sqld_primary, tmp_path):
    result = run(args, sqld_env(fresh_sqld_primary, auth_token=fresh_sqld_primary.ro_token), tmp_path)
    assert_refused(result, 4, "reading only")
    assert primary_rows(fresh_sqld_primary) == []
