"""harel_edge opens database files with one SQLite library, libsql's. A second library in the
same process (the standard library's sqlite3 reading a file libsql writes) drops the other's
POSIX locks when it closes the file: measured here, the writer then fails with "locking protocol"
and "database disk image is malformed", or the process dies of SIGBUS."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import libsql

from harel_edge.inspection import open_read_only, runner

PACKAGE = Path(__file__).resolve().parents[2] / "harel_edge"


def test_no_module_of_harel_edge_imports_the_standard_librarys_sqlite3():
    importers = []
    for module in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "sqlite3" for name in names):
                importers.append(str(module.relative_to(PACKAGE)))
    assert importers == []


def test_reading_a_file_read_only_while_this_process_writes_it_breaks_neither(tmp_path):
    path = str(tmp_path / "busy.db")
    writer = libsql.connect(path)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA synchronous=FULL")
    writer.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    writer.commit()
    reads, errors, done = [], [], threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                connection = open_read_only(path)
                try:
                    reads.append(runner(connection)("SELECT count(*) FROM t")[0][0])
                finally:
                    connection.close()
        except Exception as exc:  # noqa: BLE001 - what the test reports
            errors.append(f"reader: {exc!r}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(300):
            writer.execute("BEGIN IMMEDIATE")
            for _ in range(20):
                writer.execute("INSERT INTO t (v) VALUES (?)", ("x" * 200,))
            writer.execute("DELETE FROM t WHERE id % 3 = 0 AND id < ?", (n * 20 - 100,))
            writer.commit()
    except Exception as exc:  # noqa: BLE001
        errors.append(f"writer: {exc!r}")
    finally:
        done.set()
        reader.join()
    assert errors == []
    assert reads, "the reader read while the writer wrote"
    assert writer.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    writer.close()
