"""What one Hrana exchange costs the caller and the primary, on loopback, in one run:

(a) the HTTP client under `HranaExecutor`: `--exchanges` `SELECT 1` requests one after another
    (each opens a stream and closes it, as the executor's do), wall time and this process's CPU
    per exchange, for the executor itself (aiohttp), and for httpx's async and sync clients
    sending the same request body; rounds interleaved, medians, ratios to the executor's row.
(b) the primary's side: sqld opens a connection for each new stream and reads the schema into
    it, so an exchange costs more the more tables, indexes and triggers the database holds. The
    same `SELECT 1` with 0, `--tables` and 10x `--tables` empty tables in the database, on a new
    stream each time and on one stream kept open (batons).

    HAREL_EDGE_SQLD_BACKEND=binary .venv/bin/python benchmarks/bench_http_exchange.py

httpx is a test dependency of harel_edge, so it is installed with `.[test]`. Only ratios of one
run mean anything: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("RUST_LOG", "error")

import httpx  # noqa: E402

from harel_edge.executor import Stmt  # noqa: E402
from harel_edge.executor.hrana import STREAM_PIPELINE  # noqa: E402
from harel_edge.executor.remote import HranaExecutor  # noqa: E402
from harel_edge.settings import ExplicitSettings  # noqa: E402
from harel_edge.testing import start_sqld_primary  # noqa: E402

BODY = {"baton": None, "requests": [{"type": "execute", "stmt": {"sql": "SELECT 1"}}, {"type": "close"}]}


async def timed(exchanges: int, one: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(wall ms, CPU ms) an exchange over `exchanges` calls of `one`."""
    await one()  # the connection is open before the clock starts
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(exchanges):
        await one()
    return (time.perf_counter() - wall) * 1000 / exchanges, (time.process_time() - cpu) * 1000 / exchanges


async def executor_cell(settings, exchanges: int) -> tuple[float, float]:  # noqa: ANN001
    executor = HranaExecutor(settings)
    try:
        return await timed(exchanges, lambda: executor.execute(Stmt("SELECT 1")))
    finally:
        await executor.aclose()


async def httpx_async_cell(url: str, token: str, exchanges: int) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:

        async def one() -> object:
            return (await client.post(STREAM_PIPELINE, json=BODY)).json()

        return await timed(exchanges, one)


async def httpx_sync_cell(url: str, token: str, exchanges: int) -> tuple[float, float]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:

        async def one() -> object:
            return client.post(STREAM_PIPELINE, json=BODY).json()

        return await timed(exchanges, one)


def clients(server, exchanges: int, rounds: int) -> list[str]:  # noqa: ANN001
    settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token)
    cells = {
        "HranaExecutor (aiohttp)": lambda: executor_cell(settings, exchanges),
        "httpx AsyncClient": lambda: httpx_async_cell(server.http_url, server.rw_token, exchanges),
        "httpx Client (sync)": lambda: httpx_sync_cell(server.http_url, server.rw_token, exchanges),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cells}
    for _ in range(rounds):
        for name, cell in cells.items():
            results[name].append(asyncio.run(cell()))
    base_wall, base_cpu = (statistics.median(c) for c in zip(*results["HranaExecutor (aiohttp)"], strict=True))
    lines = [
        f"\n(a) one `SELECT 1` exchange at a time, {exchanges} a cell, {rounds} rounds interleaved, medians\n",
        "| client | ms an exchange | CPU ms an exchange (this process) | CPU vs the executor |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, rows in results.items():
        wall, cpu = (statistics.median(c) for c in zip(*rows, strict=True))
        lines.append(f"| {name} | {wall:.2f} ({wall / base_wall:.2f}x) | {cpu:.2f} | {cpu / base_cpu:.2f}x |")
    return lines


async def schema_cells(settings, tables: int, exchanges: int) -> list[str]:  # noqa: ANN001
    executor = HranaExecutor(settings)
    lines = [
        f"\n(b) `SELECT 1`, {exchanges} exchanges a cell, with empty tables in the database\n",
        "| tables in the database | new stream each exchange, ms | one stream kept open, ms |",
        "| ---: | ---: | ---: |",
    ]
    try:
        made = 0
        for want in (0, tables, tables * 10):
            if want > made:
                await executor.transaction(
                    [Stmt(f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, a TEXT, b TEXT)") for i in range(made, want)]
                )
                made = want
            fresh, _ = await timed(exchanges, lambda: executor.execute(Stmt("SELECT 1")))
            stream = executor.session()
            try:
                kept, _ = await timed(exchanges, lambda: stream.execute(Stmt("SELECT 1")))  # noqa: B023
            finally:
                await stream.aclose()
            lines.append(f"| {want} | {fresh:.2f} | {kept:.2f} ({kept / fresh:.2f}x) |")
    finally:
        await executor.aclose()
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=1000, help="exchanges a cell")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tables", type=int, default=40, help="(b) tables in the middle row (one harel_edge prefix makes 58 schema objects, 17 of them tables)")
    args = parser.parse_args()
    with start_sqld_primary() as server:
        print("\n".join(clients(server, args.exchanges, args.rounds)), flush=True)
    with start_sqld_primary() as server:
        settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token)
        print("\n".join(asyncio.run(schema_cells(settings, args.tables, args.exchanges // 2))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
