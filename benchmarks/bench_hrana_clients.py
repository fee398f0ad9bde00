"""The remote path's candidates, side by side: which client speaks to sqld from an event loop?

docs/dependencies.md argues why the remote path is aiohttp with a small Hrana module
(`harel_edge.executor.remote.HranaExecutor`). This benchmark puts numbers beside the argument:
one real sqld (started by `harel_edge.testing`), reached through
`harel_edge.testing.proxy.LatencyProxy` (`--delay` seconds each way; 10 ms: a 20 ms round trip)
and a request-counting hop of this file's own, and, in one run, for each candidate:

- `harel_edge (aiohttp)`: `HranaExecutor.execute` / `.transaction` (one `/v2/pipeline` batch
  with step conditions), one executor shared by every coroutine;
- `libsql 0.1.8` (the installed driver, sync, holds the GIL during network calls): through
  `asyncio.to_thread`, one connection per thread;
- `aiolibsql` (async, Rust): one connection per coroutine; a transaction is BEGIN IMMEDIATE,
  two INSERTs and COMMIT on one connection;
- `libsql-client (http)` (0.3.1, archived): `create_client("http://...")`, one client; its
  transaction is `batch()` (one `/v1/batch` request: BEGIN, steps, COMMIT with conditions), as
  its HTTP client has no interactive transactions;
- `libsql-client (ws)`: the same SDK on a `ws://` URL (Hrana over WebSocket), whose
  `transaction()` is interactive (its own BEGIN, two INSERTs, commit, on one stream);
- `turso-serverless` (0.1.0, sync DB-API on urllib): through `asyncio.to_thread`, one
  connection per thread; a transaction is BEGIN IMMEDIATE, two INSERTs, COMMIT.

The cells, each for `--seconds` (default 3):

- (a) `single`: one `INSERT ... RETURNING id` at a time: ops/s;
- (b) `inflight`: `--inflight` (default 32) coroutines each looping on that INSERT: ops/s
  (the sync drivers run on a 32-thread default executor, so they get 32 threads in flight);
- (c) `tx`: one atomic transaction (BEGIN IMMEDIATE / 2 INSERTs / COMMIT, however the
  candidate does one) at a time: transactions/s;
- (d) event-loop lag during (b): a ticker coroutine sleeps 1 ms again and again and records how
  late it woke (p99 and worst, in ms), as `benchmarks/bench_event_loop.py` does. A driver
  call that holds the loop (or the GIL) shows its duration here.

HTTP requests per operation come from the counting hop (it counts HTTP/1.x request lines that
go through it; a WebSocket candidate shows `ws`). Ratios are against `harel_edge (aiohttp)`'s
row of the same run. Note that the proxy adds its delay to data, not to TCP handshakes, so a
client that opens a connection per request (urllib) pays no extra round trip here, as it would
(TCP, then TLS) on a real link.

The extra candidates are NOT dependencies of harel_edge (see docs/dependencies.md); install
them into the venv to run them, and uninstall them afterwards so the venv matches pyproject:

    .venv/bin/pip install aiolibsql==0.3.0 libsql-client==0.3.1 turso-serverless==0.1.0
    .venv/bin/python benchmarks/bench_hrana_clients.py
    .venv/bin/python benchmarks/bench_hrana_clients.py --seconds 5 --json /tmp/hrana_clients.json
    .venv/bin/pip uninstall -y aiolibsql libsql-client turso-serverless  # and what they pulled in

A candidate that is not installed is skipped, with the reason printed; one that installs but
fails against sqld reports the error as its result. Numbers depend on the machine and on what
else runs on it; compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import platform
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harel_edge.executor import Stmt
from harel_edge.executor.remote import HranaExecutor
from harel_edge.settings import EdgeSettings
from harel_edge.testing import start_sqld_primary
from harel_edge.testing.loop import lag_ticker, percentile
from harel_edge.testing.proxy import LatencyProxy

TABLE = "bench_hrana_clients"
CREATE = f"CREATE TABLE IF NOT EXISTS {TABLE} (id INTEGER PRIMARY KEY, who TEXT NOT NULL, k INTEGER NOT NULL)"
INSERT = f"INSERT INTO {TABLE} (who, k) VALUES (?, ?)"
INSERT_RETURNING = INSERT + " RETURNING id"


# ---- the candidates ----------------------------------------------------------------------------


class Candidate:
    """One client: `open` it, then `insert(worker, k)` returns the new id, `transaction(worker,
    k)` commits two INSERTs atomically; `worker` picks the coroutine's connection if it has one
    per coroutine (or per thread)."""

    name = ""
    module: str | None = None  # what must import for the candidate to run
    install = ""  # how to install it, printed when it is missing
    http = True  # its requests can be counted on the counting hop

    async def open(self, url: str, token: str, workers: int) -> None:
        raise NotImplementedError

    async def insert(self, worker: int, k: int) -> int:
        raise NotImplementedError

    async def transaction(self, worker: int, k: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.install.split("==")[0])
        except PackageNotFoundError:
            return "?"


class HarelEdge(Candidate):
    name = "harel_edge (aiohttp)"
    install = "aiohttp"

    async def open(self, url: str, token: str, workers: int) -> None:
        self.ex = HranaExecutor(EdgeSettings(profile="sqld", url=url, auth_token=token))

    async def insert(self, worker: int, k: int) -> int:
        return (await self.ex.execute(Stmt(INSERT_RETURNING, (self.name, k)))).rows[0][0]

    async def transaction(self, worker: int, k: int) -> None:
        await self.ex.transaction([Stmt(INSERT, (self.name, k)), Stmt(INSERT, (self.name, -k))])

    async def close(self) -> None:
        await self.ex.aclose()


class _ThreadConnections(Candidate):
    """A sync driver: every call runs on the default executor, one connection per thread."""

    def connect(self, url: str, token: str) -> Any:
        raise NotImplementedError

    async def open(self, url: str, token: str, workers: int) -> None:
        self.url, self.token = url, token
        self.local = threading.local()
        self.connections: list[Any] = []
        await asyncio.to_thread(self._connection)  # fail here, not in a cell, if it cannot connect

    def _connection(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = self.connect(self.url, self.token)
            self.connections.append(conn)
        return conn

    def _insert(self, k: int) -> int:
        return self._connection().execute(INSERT_RETURNING, (self.name, k)).fetchall()[0][0]

    def _transaction(self, k: int) -> None:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(INSERT, (self.name, k))
            conn.execute(INSERT, (self.name, -k))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def insert(self, worker: int, k: int) -> int:
        return await asyncio.to_thread(self._insert, k)

    async def transaction(self, worker: int, k: int) -> None:
        await asyncio.to_thread(self._transaction, k)

    async def close(self) -> None:
        for conn in self.connections:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - closing after the measurement
                pass


class Libsql(_ThreadConnections):
    name = "libsql (to_thread)"
    module = "libsql"
    install = "libsql==0.1.8"

    def connect(self, url: str, token: str) -> Any:
        import libsql

        return libsql.connect(url, auth_token=token, isolation_level=None)


class TursoServerless(_ThreadConnections):
    name = "turso-serverless (to_thread)"
    module = "turso_serverless"
    install = "turso-serverless==0.1.0"

    def connect(self, url: str, token: str) -> Any:
        import turso_serverless

        return turso_serverless.connect(url, auth_token=token, isolation_level=None)


class Aiolibsql(Candidate):
    name = "aiolibsql"
    module = "aiolibsql"
    install = "aiolibsql==0.3.0"

    async def open(self, url: str, token: str, workers: int) -> None:
        import aiolibsql

        self.connections = [
            await aiolibsql.connect(url, auth_token=token, isolation_level=None) for _ in range(workers)
        ]

    async def insert(self, worker: int, k: int) -> int:
        cursor = await self.connections[worker].execute(INSERT_RETURNING, (self.name, k))
        return (await _maybe_await(cursor.fetchall()))[0][0]

    async def transaction(self, worker: int, k: int) -> None:
        conn = self.connections[worker]
        await conn.execute("BEGIN IMMEDIATE")
        try:
            await conn.execute(INSERT, (self.name, k))
            await conn.execute(INSERT, (self.name, -k))
            await conn.execute("COMMIT")
        except BaseException:
            await conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        for conn in self.connections:
            await _maybe_await(conn.close())


class LibsqlClientHttp(Candidate):
    name = "libsql-client (http)"
    module = "libsql_client"
    install = "libsql-client==0.3.1"

    def client_url(self, url: str) -> str:
        return url

    async def open(self, url: str, token: str, workers: int) -> None:
        import libsql_client

        self.client = libsql_client.create_client(self.client_url(url), auth_token=token)
        await self.client.execute("SELECT 1")

    async def insert(self, worker: int, k: int) -> int:
        return (await self.client.execute(INSERT_RETURNING, [self.name, k])).rows[0][0]

    async def transaction(self, worker: int, k: int) -> None:
        # The HTTP client's atomic unit: one /v1/batch (BEGIN, steps, COMMIT, conditions).
        await self.client.batch([(INSERT, [self.name, k]), (INSERT, [self.name, -k])])

    async def close(self) -> None:
        await self.client.close()


class LibsqlClientWs(LibsqlClientHttp):
    name = "libsql-client (ws)"
    http = False

    def client_url(self, url: str) -> str:
        return "ws" + url.removeprefix("http")

    async def transaction(self, worker: int, k: int) -> None:
        tx = self.client.transaction()  # the SDK sends its BEGIN (deferred) on the stream, unawaited
        try:
            await tx.execute(INSERT, [self.name, k])
            await tx.execute(INSERT, [self.name, -k])
            await tx.commit()
        finally:
            tx.close()


CANDIDATES = [HarelEdge, Libsql, Aiolibsql, LibsqlClientHttp, LibsqlClientWs, TursoServerless]


async def _maybe_await(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value


# ---- a hop that counts HTTP requests -----------------------------------------------------------

_REQUEST_LINE = re.compile(rb"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (/\S*) HTTP/1\.[01]\r\n")


class RequestCounter:
    """Listen on 127.0.0.1 and forward to `target_port` without delay, counting the HTTP/1.x
    request lines sent through it, by path. A process of its own (spawn), for the reason
    `LatencyProxy` is one: a driver that holds the GIL would stall a thread of this process."""

    def __init__(self, target_port: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._control, child = ctx.Pipe()
        self._process = ctx.Process(target=_count_serve, args=(child, target_port), daemon=True)
        self._process.start()
        child.close()
        if not self._control.poll(30):
            raise RuntimeError("the request counter did not start")
        self.port = self._control.recv()
        self.url = f"http://127.0.0.1:{self.port}"

    def counts(self) -> dict[str, int]:
        self._control.send("counts")
        if not self._control.poll(10):
            raise RuntimeError("the request counter did not answer")
        return self._control.recv()

    def total(self) -> int:
        return sum(self.counts().values())

    def close(self) -> None:
        try:
            self._control.send("close")
        except (OSError, ValueError):
            pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def __enter__(self) -> RequestCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _count_serve(control: Any, target_port: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_count_main(control, target_port))


async def _count_main(control: Any, target_port: int) -> None:
    counts: dict[str, int] = {}

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        tail = b""
        try:
            while data := await reader.read(65536):
                writer.write(data)
                if count:
                    scan = tail + data
                    for match in _REQUEST_LINE.finditer(scan):
                        if match.end() > len(tail):  # not counted in the previous chunk
                            path = match.group(1).decode(errors="replace")
                            counts[path] = counts.get(path, 0) + 1
                    tail = scan[-256:]
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def accept(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    control.send(server.sockets[0].getsockname()[1])
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        try:
            commands.put_nowait(control.recv())
        except (EOFError, OSError):
            commands.put_nowait("close")

    loop.add_reader(control.fileno(), read)
    while await commands.get() != "close":
        control.send(dict(counts))
    server.close()


# ---- measuring ---------------------------------------------------------------------------------


async def cell(candidate: Candidate, kind: str, workers: int, args, counter: RequestCounter) -> dict:
    """Run `workers` coroutines looping on one operation for `seconds`: ops/s (completed ones),
    operations that raised (each counted and the loop goes on), requests/op, loop lag."""
    seconds, timeout = args.seconds, args.op_timeout
    run = candidate.transaction if kind == "tx" else candidate.insert

    async def op(w: int, k: int) -> None:
        # Bounded, so that a request that is never answered cannot hold the run.
        try:
            await asyncio.wait_for(run(w, k), timeout)
        except TimeoutError as exc:
            if str(exc):
                raise
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    ks = iter(range(1, 1 << 62))
    # Warm up with as many in flight as measured (pools and per-thread connections grow to it);
    # a candidate none of whose warm-up operations succeeds fails here with its error.
    for _ in range(3):
        outcomes = await asyncio.gather(*(op(w, next(ks)) for w in range(workers)), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if len(failures) == len(outcomes):
            raise failures[0]
    done = failed = 0
    errors: dict[str, int] = {}
    deadline = 0.0

    async def loop(w: int) -> None:
        nonlocal done, failed
        while time.perf_counter() < deadline:
            try:
                await op(w, next(ks))
            except Exception as exc:  # noqa: BLE001 - counted: how a candidate fails is a result
                failed += 1
                message = f"{type(exc).__name__}: {str(exc)[:160]}"
                errors[message] = errors.get(message, 0) + 1
                continue
            done += 1

    stop = asyncio.Event()
    lags: list[float] = []
    tick = asyncio.create_task(lag_ticker(stop, lags))
    await asyncio.sleep(0.05)
    lags.clear()
    requests_before = counter.total()
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(*(loop(w) for w in range(workers)))
    elapsed = time.perf_counter() - start
    stop.set()
    await tick
    requests = counter.total() - requests_before
    return {
        "ops": done,
        "failed": failed,
        "errors": errors,
        "seconds": round(elapsed, 3),
        "ops_per_s": round(done / elapsed, 1),
        "requests_per_op": round(requests / (done + failed), 2) if done + failed and candidate.http else None,
        "lag_p99_ms": round(percentile(lags, 0.99), 2),
        "lag_max_ms": round(max(lags), 2) if lags else None,
        "ticks": len(lags),
    }


async def run_candidate(candidate: Candidate, url: str, token: str, args, counter: RequestCounter) -> dict:
    # The sync drivers get as many threads as coroutines in flight (the default is cores + 4).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(32, args.inflight)))
    row: dict[str, Any] = {"candidate": candidate.name}
    row["version"] = candidate.version()
    try:
        await candidate.open(url, token, args.inflight)
        try:
            for kind, workers in (("single", 1), ("inflight", args.inflight), ("tx", 1)):
                try:
                    row[kind] = await cell(candidate, kind, workers, args, counter)
                except Exception as exc:  # noqa: BLE001 - a cell that fails is a result; go on
                    row[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"  {candidate.name:30} {kind:8} {row[kind]}", file=sys.stderr, flush=True)
        finally:
            try:
                await asyncio.wait_for(candidate.close(), 10)
            except Exception as exc:  # noqa: BLE001 - after the measurement (TimeoutError too)
                print(f"  {candidate.name}: close failed: {exc!r}", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - a candidate that fails is a result
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  {candidate.name}: FAILED {row['error']}", file=sys.stderr, flush=True)
    return row


def _ratio(value: float | None, base: float | None) -> str:
    if not value or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _failed(result: dict, prefix: str = "") -> str:
    """How many operations raised, and the commonest error."""
    if not result["failed"]:
        return "0" if not prefix else ""
    common = max(result["errors"], key=result["errors"].get)
    short = "SQLITE_BUSY" if "SQLITE_BUSY" in common else common
    return f"{prefix}{result['failed']} ({short})"


def _lag(result: dict) -> str:
    return f"{result['lag_p99_ms']:.1f} / {result['lag_max_ms']:.1f}"


def _requests(value: float | None, http: bool) -> str:
    if not http:
        return "ws"
    return "" if value is None else f"{value:g}"


def markdown(rows: list[dict], args) -> str:
    base = next((r for r in rows if r["candidate"] == HarelEdge.name and "single" in r), None)
    http = {cls.name: cls.http for cls in CANDIDATES}
    lines = [
        f"{args.delay * 2000:g} ms RTT (LatencyProxy {args.delay * 1000:g} ms each way), {args.seconds:g} s a cell, "
        f"{args.inflight} in flight in (b); ratios against {HarelEdge.name} in this run",
        "",
        "| candidate | (a) single INSERT ops/s | (b) INSERTs, "
        f"{args.inflight} in flight ops/s | (b) failed | (b) HTTP req/op | (c) tx/s | (c) HTTP req/tx "
        "| (d) loop lag p99 / worst ms during (b) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['candidate']} | {r.get('skipped') or 'failed: ' + r['error']} | | | | | | |")
            continue
        a, b, c = r["single"], r["inflight"], r["tx"]
        h = http.get(r["candidate"], True)

        def ops(cell: dict, kind: str) -> str:
            if "error" in cell:
                return f"failed: {cell['error']}"
            ratio = _ratio(cell["ops_per_s"], base and "error" not in base[kind] and base[kind]["ops_per_s"])
            return f"{cell['ops_per_s']:.1f}{ratio}" + (_failed(cell, ", ") if kind != "inflight" else "")

        def extra(cell: dict, text) -> str:
            return "" if "error" in cell else text(cell)

        lines.append(
            f"| {r['candidate']} {r['version']} | {ops(a, 'single')} | {ops(b, 'inflight')} "
            f"| {extra(b, _failed)} | {extra(b, lambda x, h=h: _requests(x['requests_per_op'], h))} "
            f"| {ops(c, 'tx')} | {extra(c, lambda x, h=h: _requests(x['requests_per_op'], h))} "
            f"| {extra(b, _lag)} |"
        )
    return "\n".join(lines)


def measure(cls: type[Candidate], args) -> dict:
    """One candidate against a sqld of its own (what one client leaves behind, such as streams
    that hold a lock until they expire, must not slow the next one down)."""
    candidate = cls()
    if candidate.module is not None:
        try:
            importlib.import_module(candidate.module)
        except ImportError as exc:
            reason = f"not installed ({exc}): .venv/bin/pip install {candidate.install}"
            print(f"  {candidate.name}: skipped, {reason}", file=sys.stderr, flush=True)
            return {"candidate": candidate.name, "skipped": reason}
    server = start_sqld_primary(backend="binary")
    try:
        # client -> latency proxy -> request counter -> sqld
        with (
            RequestCounter(server.http_port) as counter,
            LatencyProxy(counter.port, delay=args.delay) as proxy,
        ):
            import libsql

            setup = libsql.connect(server.http_url, auth_token=server.rw_token, isolation_level=None)
            setup.execute(CREATE)
            setup.close()
            print(
                f"{candidate.name}: sqld at {server.http_url}, through {proxy!r}", file=sys.stderr, flush=True
            )
            return asyncio.run(run_candidate(candidate, proxy.url, server.rw_token, args, counter))
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell (default 3)")
    parser.add_argument("--delay", type=float, default=0.010, help="one-way delay in s (default 0.010)")
    parser.add_argument("--inflight", type=int, default=32, help="coroutines in flight in (b) (default 32)")
    parser.add_argument(
        "--op-timeout",
        type=float,
        default=30.0,
        help="seconds one operation may take before it counts as failed",
    )
    parser.add_argument("--candidates", help="comma-separated substrings of candidate names (default all)")
    parser.add_argument("--json", help="also write the results as JSON to this path")
    args = parser.parse_args()

    wanted = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    rows = [measure(cls, args) for cls in CANDIDATES if not wanted or any(w in cls.name for w in wanted)]
    table = markdown(rows, args)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": {"python": platform.python_version(), "platform": platform.platform()},
                    "args": vars(args),
                    "rows": rows,
                    "markdown": table,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
