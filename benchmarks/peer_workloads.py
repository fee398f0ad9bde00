"""What a user would pick instead of harel_edge on one machine, doing the work `bench_peers.py`
gives harel_edge's worker: run by `bench_peers.py` in a venv of its own holding DBOS and huey.

    python peer_workloads.py dbos DIR N     # N workflows of three steps, one an exactly-once insert
    python peer_workloads.py huey DIR N     # N/4 orders' four events, the order's state by hand
    python peer_workloads.py huey-bare DIR N

Each seeds its work untimed, then drains it and prints one JSON line: the rate from the
consumer's start to the last piece of work done, and what was checked. Every file is SQLite in
WAL with synchronous=FULL, as harel_edge's local profile. Imports nothing of harel_edge.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

POLL = 0.01  # how often the drain is looked at (on a connection of its own), and a queue polled
# Workflows at once. DBOS 3.4 on SQLite at 32 timed out on the write lock ("database is locked",
# retried) and ran slower; 16 is what it sustains here.
PASSES = int(os.environ.get("PEER_PASSES", "16"))


def wal(path: Path) -> None:
    """The file in WAL before the peer opens it (journal_mode is kept in the file)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def wait_for(path: Path, sql: str, target: int, timeout: float = 600.0) -> float:
    """When `sql` counts `target` (perf_counter), polled every POLL on a new connection each time."""
    deadline = time.monotonic() + timeout
    while count(path, sql) < target:
        if time.monotonic() > deadline:
            raise TimeoutError("the peer did not finish within the timeout")
        time.sleep(POLL)
    return time.perf_counter()


def count(path: Path, sql: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


# ---- DBOS: durable workflows on its SQLite queue ----------------------------------------------------


def dbos(directory: Path, n: int) -> dict:
    """Enqueued by a DBOS that listens to no queue, then drained by one that listens to it."""
    import sqlalchemy as sa  # noqa: PLC0415
    from dbos import DBOS, SQLAlchemyDatasource  # noqa: PLC0415

    db = directory / "dbos.db"
    wal(db)
    url = f"sqlite:///{db}"
    config = {"name": "bench", "system_database_url": url, "run_admin_server": False}
    datasource = SQLAlchemyDatasource.create(url)
    with datasource.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS ledger (workflow TEXT PRIMARY KEY, amount REAL)"))

    @DBOS.step()
    def reserve(k: int) -> dict:
        return {"order": k, "items": 1}

    @datasource.transaction()
    def charge(k: int) -> int:
        datasource.sql_session().execute(sa.text("INSERT INTO ledger VALUES (:w, :a)"), {"w": f"wf-{k}", "a": 5.0 + k % 50})
        return k

    @DBOS.step()
    def ship(k: int) -> dict:
        return {"carrier": "edge-post", "order": k}

    @DBOS.workflow(name="fulfil")
    def fulfil(k: int) -> dict:
        return {"reservation": reserve(k), "charge": charge(k), "shipment": ship(k)}

    DBOS(config=config)
    DBOS.listen_queues([])
    DBOS.launch()
    queue = DBOS.register_queue("bench", polling_interval_sec=POLL, worker_concurrency=PASSES)
    for k in range(n):
        queue.enqueue(fulfil, k)
    DBOS.destroy()

    done_sql = "SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'"
    DBOS(config=config)
    DBOS.listen_queues(["bench"])
    DBOS.launch()
    started = time.perf_counter()
    DBOS.register_queue("bench", polling_interval_sec=POLL, worker_concurrency=PASSES)
    ended = wait_for(db, done_sql, n)
    DBOS.destroy(workflow_completion_timeout_sec=10)
    return {"peer": "DBOS 3.4 SQLite queue", "work": n, "per_s": n / (ended - started),
            "ledger_rows": count(db, "SELECT count(*) FROM ledger"), "succeeded": count(db, done_sql)}


# ---- huey: one task an order event, the order's state kept by hand ----------------------------------

KINDS = ("Start", "Pay", "Ship", "Deliver")
TRANSITIONS = {
    (None, "Start"): "AwaitingPayment",
    ("AwaitingPayment", "Pay"): "Paid",
    ("Paid", "Ship"): "Shipped",
    ("Shipped", "Deliver"): "Delivered",
}
WORKERS = 4  # huey consumer threads


class NotYet(Exception):
    """An event that came before the one it follows: huey retries the task."""


early = []  # one entry an early event (list.append is atomic)


def huey(directory: Path, n: int, bare: bool = False) -> dict:
    import logging  # noqa: PLC0415

    from huey import SqliteHuey  # noqa: PLC0415

    logging.getLogger("huey").setLevel(logging.CRITICAL)  # an early event's retry is expected

    db = directory / "huey.db"
    wal(db)
    queue = SqliteHuey("bench", filename=str(db), fsync=True, journal_mode="wal", results=False)
    local = threading.local()

    def connection() -> sqlite3.Connection:
        if not hasattr(local, "conn"):
            local.conn = sqlite3.connect(db, timeout=30, isolation_level=None)
            local.conn.execute("PRAGMA synchronous=FULL")
        return local.conn

    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, data TEXT NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS done (id INTEGER PRIMARY KEY)")
        conn.execute("CREATE TABLE IF NOT EXISTS delivered (id TEXT PRIMARY KEY)")

    @queue.task(retries=1000)
    def advance(order: str, kind: str, amount: float) -> None:
        """Read the order's state, apply the event, write it back: one transaction."""
        conn = connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT data FROM orders WHERE id = ?", (order,)).fetchone()
            data = json.loads(row[0]) if row else {"state": None, "paid": 0.0, "history": []}
            target = TRANSITIONS.get((data["state"], kind))
            if target is None:
                early.append(kind)
                raise NotYet(f"{kind} for {order} in {data['state']}")
            data["state"] = target
            data["history"].append(kind)
            if kind == "Pay":
                data["paid"] = amount
            conn.execute("INSERT INTO orders VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                         (order, json.dumps(data)))
            if target == "Delivered":  # what the drain counts, cheaply
                conn.execute("INSERT INTO delivered VALUES (?)", (order,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @queue.task()
    def nothing(k: int) -> None:
        connection().execute("INSERT INTO done VALUES (?)", (k,))

    orders = n // len(KINDS)
    if bare:
        for k in range(n):
            nothing(k)
        done_sql, total = "SELECT count(*) FROM done", n
    else:
        for kind in KINDS:
            for i in range(orders):
                advance(f"order-{i:04d}", kind, 1.0)
        done_sql, total = "SELECT count(*) FROM delivered", orders
    consumer = queue.create_consumer(workers=WORKERS, worker_type="thread", periodic=False,
                                     initial_delay=POLL, backoff=1.0, max_delay=POLL)
    started = time.perf_counter()
    consumer.start()
    ended = wait_for(db, done_sql, total)
    consumer.stop(graceful=True)
    work = n if bare else orders * len(KINDS)
    delivered = "SELECT count(*) FROM orders WHERE json_extract(data, '$.state') = 'Delivered'"
    return {"peer": "huey 3.5 SqliteHuey, a bare task" if bare else "huey 3.5 SqliteHuey, the order by hand",
            "work": work, "per_s": work / (ended - started), "done": count(db, done_sql if bare else delivered),
            "early_events_retried": len(early)}


if __name__ == "__main__":
    kind, where, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if kind == "dbos":
        result = dbos(where, size)
    else:
        result = huey(where, size, bare=kind == "huey-bare")
    print(json.dumps(result), flush=True)
