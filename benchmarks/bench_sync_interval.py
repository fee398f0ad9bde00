"""What an embedded replica's sync_interval costs and buys, measured on a real sqld.

Run: `.venv/bin/python benchmarks/bench_sync_interval.py [--quick] [--backend binary|docker]
[--sections lag,idle,replicas,bootstrap]`. Prints one table per section; docs/tuning.md reports them.

- lag: a row written on the primary (remote connection) until the replica's LOCAL read returns it,
  polled every 0.5 ms. Each write waits a random part of the interval first, so writes land at
  every phase of the background sync rather than just after one. "manual" is a write followed
  by an explicit `.sync()` and the read: the lag when the reader syncs before it reads.
- idle: what the background sync costs when nothing happens: CPU of the replica's process and of
  sqld (binary backend: /proc), per second of wall time, one replica. 0.01 s is below the
  settings' floor and is opened with the raw driver to show why the floor is there.
- replicas: what many idle replicas open at once cost, and what closing them gives back: the
  requests they send the primary a second (writes through a loopback proxy) and the files they
  hold (this process's /proc/self/fd), open, after `EdgeConnection.close()`, and with the
  driver's own `close()` on a connection still referenced.
- bootstrap: opening a NEW replica (connect + first sync) after 0, 10k and 50k write
  transactions on the primary (autocommitted single-row INSERTs, sent 200 to a request), with
  sqld's defaults and with `--max-log-size 8` (sqld then compacts its replication log into a
  snapshot, which a new replica loads instead of replaying every transaction).

Every figure comes from this machine in this run; loopback network, so the lag is the sync
mechanism's, not the network's.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RUST_LOG", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import libsql  # noqa: E402

from harel_edge.connection import EdgeConnection  # noqa: E402
from harel_edge.settings import ExplicitSettings  # noqa: E402
from harel_edge.sync_sql import Statements  # noqa: E402
from harel_edge.testing import start_sqld_primary  # noqa: E402
from harel_edge.testing.proxy import LatencyProxy  # noqa: E402

INTERVALS = [0.05, 0.1, 0.5, 1.0, 2.0, 5.0]
COMPACT_MB = 8  # --max-log-size for the compacted bootstrap rows
POLL = 0.0005


def remote(server, **extra) -> Statements:
    return Statements(
        ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, **extra)
    )


def replica_settings(server, path: Path, interval: float | None, **extra) -> ExplicitSettings:
    return ExplicitSettings.load(
        profile="replica",
        db_path=str(path),
        sync_url=extra.pop("sync_url", server.http_url),
        auth_token=server.rw_token,
        sync_interval=interval,
        **extra,
    )


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- lag ------------------------------------------------------------------------------------------


def samples_for(interval: float | None, quick: bool) -> int:
    if interval is None:
        return 10 if quick else 30
    budget = 6.0 if quick else 20.0  # seconds of sampling per interval
    return max(4, min(30, int(budget / interval)))


def measure_lag(server, tmp: Path, interval: float | None, samples: int) -> list[float]:
    writer = remote(server)
    writer.execute("CREATE TABLE IF NOT EXISTS lag (id INTEGER PRIMARY KEY)")
    replica = EdgeConnection(replica_settings(server, tmp / f"lag-{interval}.db", interval))
    lags = []
    base = int(writer.execute("SELECT coalesce(max(id), 0) FROM lag")[0][0])
    for i in range(base + 1, base + 1 + samples):
        if interval is not None:
            time.sleep(random.uniform(0, interval))
        writer.execute("INSERT INTO lag (id) VALUES (?)", (i,))
        written = time.perf_counter()
        if interval is None:
            replica.sync()
        while not replica.execute("SELECT 1 FROM lag WHERE id = ?", (i,)):
            time.sleep(POLL)
            if time.perf_counter() - written > max(30.0, 10 * (interval or 1)):
                raise RuntimeError(f"row {i} never reached the replica (interval {interval})")
        lags.append(time.perf_counter() - written)
    replica.close()
    writer.close()
    return lags


def section_lag(backend: str, quick: bool) -> None:
    print("\n## replication lag: remote write -> visible in the replica's local read (ms)")
    print(f"{'sync_interval':>14} {'n':>4} {'median':>8} {'p90':>8} {'max':>8}")
    with start_sqld_primary(backend=backend) as server, tempfile.TemporaryDirectory() as tmp:
        for interval in [None, *INTERVALS]:
            lags = measure_lag(server, Path(tmp), interval, samples_for(interval, quick))
            label = "manual" if interval is None else f"{interval:g}"
            print(
                f"{label:>14} {len(lags):>4} {fmt_ms(statistics.median(lags))} "
                f"{fmt_ms(quantile(lags, 0.9))} {fmt_ms(max(lags))}"
            )


# ---- idle cost ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def section_idle(backend: str, quick: bool) -> None:
    window = 3.0 if quick else 6.0
    print(f"\n## idle cost of the background sync, one replica, {window:g} s with no writes")
    print(f"{'sync_interval':>14} {'replica CPU %':>14} {'sqld CPU %':>11}")
    with start_sqld_primary(backend=backend) as server, tempfile.TemporaryDirectory() as tmp:
        proc = getattr(server._process, "_proc", None)  # noqa: SLF001 - the binary's pid, for /proc
        pid = proc.pid if proc is not None else None
        for interval in [None, 0.01, *INTERVALS]:
            kwargs = {"sync_url": server.http_url, "auth_token": server.rw_token, "isolation_level": None}
            if interval is not None:
                kwargs["sync_interval"] = interval
            conn = libsql.connect(str(Path(tmp) / f"idle-{interval}.db"), **kwargs)
            conn.sync()
            time.sleep(0.2)
            mine, theirs, began = time.process_time(), cpu_seconds(pid) if pid else None, time.perf_counter()
            time.sleep(window)
            wall = time.perf_counter() - began
            mine_pct = 100 * (time.process_time() - mine) / wall
            theirs_pct = (
                f"{100 * (cpu_seconds(pid) - theirs) / wall:11.2f}"
                if pid and theirs is not None
                else f"{'n/a':>11}"
            )
            conn.close()
            label = "none" if interval is None else f"{interval:g}"
            print(f"{label:>14} {mine_pct:14.2f} {theirs_pct}")


# ---- many replicas ---------------------------------------------------------------------------------


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def section_replicas(backend: str, quick: bool) -> None:
    count, window = (10, 3.0) if quick else (50, 6.0)
    print(f"\n## {count} idle replicas at once: requests to the primary a second and open files, {window:g} s each")
    print(f"{'sync_interval':>14} {'state':>34} {'requests/s':>11} {'files each':>11}")
    with start_sqld_primary(backend=backend) as server, tempfile.TemporaryDirectory() as tmp, LatencyProxy(
        int(server.http_url.rsplit(":", 1)[1]), 0.0
    ) as proxy:

        def sent_a_second() -> float:
            before, began = proxy.stats()["chunks_up"], time.perf_counter()
            time.sleep(window)
            return (proxy.stats()["chunks_up"] - before) / (time.perf_counter() - began)

        def row(interval: float, state: str, baseline: int) -> None:
            rate = sent_a_second()
            print(f"{interval:14g} {state:>34} {rate:11.1f} {(open_files() - baseline) / count:11.1f}")

        for interval in (1.0, 5.0):
            gc.collect()
            time.sleep(window)  # what the last round dropped is given back on the driver's threads
            baseline = open_files()
            replicas = [
                EdgeConnection(replica_settings(server, Path(tmp) / f"r{interval}-{i}.db", interval, sync_url=proxy.url))
                for i in range(count)
            ]
            row(interval, "open", baseline)
            for replica in replicas:
                replica.close()
            row(interval, "EdgeConnection.close()", baseline)
            raw = [libsql.connect(str(Path(tmp) / f"raw{interval}-{i}.db"), sync_url=proxy.url, auth_token=server.rw_token,
                                  sync_interval=interval, isolation_level=None) for i in range(count)]
            for connection in raw:
                connection.close()
            row(interval, "driver close(), still referenced", baseline)
            del raw, connection


# ---- bootstrap ------------------------------------------------------------------------------------


def write_transactions(server, count: int) -> None:
    conn = libsql.connect(server.http_url, auth_token=server.rw_token, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, body TEXT)").fetchall()
    body = "x" * 100
    for start in range(0, count, 200):
        script = "".join(f"INSERT INTO log (body) VALUES ('{body}');" for _ in range(min(200, count - start)))
        conn.executescript(script)  # one request, one autocommitted transaction per INSERT
    have = conn.execute("SELECT count(*) FROM log").fetchall()[0][0]
    conn.close()
    if have != count:
        raise RuntimeError(f"wrote {have} rows, meant {count}")


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def open_replica(server, path: Path) -> tuple[float, int]:
    """Seconds to open a new replica (connect + first sync), and the rows it then holds."""
    began = time.perf_counter()
    conn = EdgeConnection(replica_settings(server, path, None))
    took = time.perf_counter() - began
    rows = (
        int(conn.execute("SELECT count(*) FROM log")[0][0])
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'log'")
        else 0
    )
    conn.close()
    return took, rows


def section_bootstrap(backend: str, quick: bool) -> None:
    sizes = [0, 2_000, 10_000] if quick else [0, 10_000, 50_000]
    compacted = ["--max-log-size", str(COMPACT_MB)]
    print("\n## bootstrap: open a NEW replica (connect + first sync) after N write transactions")
    print(
        f"{'writes':>8} {'sqld flags':>18} {'open s':>8} {'opens':>6} {'replica MB':>11} {'sqld data MB':>13}"
    )
    for flags in ([], compacted):
        for count in sizes:
            with (
                start_sqld_primary(backend=backend, extra_args=flags) as server,
                tempfile.TemporaryDirectory() as tmp,
            ):
                write_transactions(server, count)
                opens = 3 if count <= 10_000 else 1
                times = []
                for attempt in range(opens):
                    took, rows = open_replica(server, Path(tmp) / f"boot-{attempt}.db")
                    if rows != count:
                        raise RuntimeError(f"a new replica holds {rows} rows, the primary {count}")
                    times.append(took)
                size = sum(p.stat().st_size for p in Path(tmp).glob("boot-0.db*")) / 1e6
                label = " ".join(flags) or "(defaults)"
                print(
                    f"{count:>8} {label:>18} {statistics.median(times):8.2f} {opens:>6} {size:11.1f} "
                    f"{dir_size(server.data_dir) / 1e6:13.1f}"
                )


SECTIONS = {
    "lag": section_lag,
    "idle": section_idle,
    "replicas": section_replicas,
    "bootstrap": section_bootstrap,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and smaller logs")
    parser.add_argument("--backend", default=os.environ.get("HAREL_EDGE_SQLD_BACKEND", "binary"))
    parser.add_argument("--sections", default=",".join(SECTIONS))
    args = parser.parse_args()
    print(f"# sync_interval benchmark (sqld backend: {args.backend}, quick: {args.quick})")
    for name in args.sections.split(","):
        SECTIONS[name.strip()](args.backend, args.quick)


if __name__ == "__main__":
    main()
