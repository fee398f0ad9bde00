"""Units that share one transaction on a real sqld name the SQL texts they repeat by id
(`store_sql`), within the number of texts sqld keeps a stream."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from harel_edge.executor import Stmt
from harel_edge.executor.hrana import (
    STORED_SQL_AT_MOST,
    STORED_SQL_BYTES_AT_MOST,
    UNIT_SAVEPOINT,
    grouped_batch,
)
from harel_edge.executor.remote import SETTLE_SLICE, HranaExecutor
from harel_edge.settings import ExplicitSettings

pytestmark = pytest.mark.sqld


def unit(text: int, key: int) -> list[Stmt]:
    """Two inserts with one SQL text of their own (`text`), so the text repeats within a batch."""
    sql = f"INSERT INTO grouped_rows (k, text) VALUES (?, {text})"
    return [Stmt(sql, (key,)), Stmt(sql, (key + 1,))]


def test_a_grouped_batch_stores_each_repeated_text_once_and_at_most_as_many_as_sqld_keeps() -> None:
    encoded, layout = grouped_batch([unit(text, 2 * text) for text in range(STORED_SQL_AT_MOST + 10)])
    requests = [orjson.loads(request) for request in encoded]
    stored = [r for r in requests[:-1] if r["type"] == "store_sql"]
    steps = [step["stmt"] for step in requests[-1]["batch"]["steps"]]
    assert len(stored) == len(requests) - 1 == STORED_SQL_AT_MOST
    assert len({r["sql"] for r in stored}) == len({r["sql_id"] for r in stored}) == STORED_SQL_AT_MOST
    by_id = {r["sql_id"]: r["sql"] for r in stored}
    # Every step names its text by a stored id or carries it, never both; the most repeated
    # texts (the savepoint's, used by every unit) are among the stored ones.
    assert all(("sql" in s) != ("sql_id" in s) for s in steps)
    assert all(s["sql_id"] in by_id for s in steps if "sql_id" in s)
    assert f"SAVEPOINT {UNIT_SAVEPOINT}" in by_id.values()
    texts = [by_id.get(s.get("sql_id"), s.get("sql")) for s in steps]
    assert sum(text.startswith("INSERT INTO grouped_rows") for text in texts) == 2 * (STORED_SQL_AT_MOST + 10)
    assert len(layout) == STORED_SQL_AT_MOST + 10


def test_units_sharing_a_transaction_with_more_repeated_texts_than_are_stored_all_commit(sqld_primary) -> None:
    server = sqld_primary
    settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix="grouped")
    texts = STORED_SQL_AT_MOST + 10

    async def run() -> tuple[list, list, int]:
        executor = HranaExecutor(settings, linger=0.05)  # long enough for every unit to join one batch
        try:
            await executor.execute(Stmt("CREATE TABLE IF NOT EXISTS grouped_rows (k INTEGER, text INTEGER)"))
            await executor.execute(Stmt("DELETE FROM grouped_rows"))
            exchanges = executor.exchanges
            results = await asyncio.gather(*(executor.transaction(unit(text, 2 * text)) for text in range(texts)))
            shared = executor.exchanges - exchanges
            rows = (await executor.execute(Stmt("SELECT k, text FROM grouped_rows ORDER BY k"))).rows
            return results, rows, shared
        finally:
            await executor.aclose()

    results, rows, shared = asyncio.run(run())
    assert shared <= 2, f"the units shared a grouped batch ({shared} exchanges for {texts} units)"
    assert all([r.affected for r in result] == [1, 1] for result in results)
    assert rows == [(key, key // 2) for key in range(2 * texts)]


def test_units_repeating_a_text_longer_than_sqld_stores_all_commit_in_one_exchange(sqld_primary) -> None:
    server = sqld_primary
    settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix="grouped")
    # One insert of many rows: its text is over the size sqld stores (as a run's acks of 512 leases are).
    rows_a_unit = STORED_SQL_BYTES_AT_MOST // len("(?),") + 1
    sql = "INSERT INTO long_rows (k) VALUES " + ",".join(["(?)"] * rows_a_unit)
    assert len(sql.encode()) > STORED_SQL_BYTES_AT_MOST
    units = 4

    async def run() -> tuple[list, int, int]:
        executor = HranaExecutor(settings, linger=0.05)  # long enough for every unit to join one batch
        try:
            await executor.execute(Stmt("CREATE TABLE IF NOT EXISTS long_rows (k INTEGER)"))
            await executor.execute(Stmt("DELETE FROM long_rows"))
            exchanges = executor.exchanges
            results = await asyncio.gather(*(
                executor.transaction([Stmt(sql, tuple(range(u * rows_a_unit, (u + 1) * rows_a_unit)))]) for u in range(units)
            ))
            shared = executor.exchanges - exchanges
            count = (await executor.execute(Stmt("SELECT count(DISTINCT k) FROM long_rows"))).rows[0][0]
            return results, count, shared
        finally:
            await executor.aclose()

    results, count, shared = asyncio.run(run())
    assert shared <= 2, f"the units shared a grouped batch ({shared} exchanges for {units} units)"
    assert all(result[0].affected == rows_a_unit for result in results)
    assert count == units * rows_a_unit


def test_a_shared_answer_wakes_the_carried_claim_first_and_its_other_callers_over_several_turns(sqld_primary) -> None:
    server = sqld_primary
    settings = ExplicitSettings.load(profile="sqld", url=server.http_url, auth_token=server.rw_token, prefix="grouped")
    writers = 3 * SETTLE_SLICE

    async def run() -> tuple[dict, int, int]:
        executor = HranaExecutor(settings, linger=0.05)  # long enough for every unit to join one batch
        turn, woke, counted = 0, {}, {}
        stop = asyncio.Event()

        async def count_turns() -> None:  # one increment a turn of the loop
            nonlocal turn
            while not stop.is_set():
                await asyncio.sleep(0)
                turn += 1

        async def write(k: int) -> None:
            await executor.transaction([Stmt("INSERT INTO settled_rows (k) VALUES (?)", (k,))])
            woke[k] = turn

        async def claim() -> None:
            result = await executor.deferred(lambda: [Stmt("SELECT count(*) FROM settled_rows")])
            woke["claim"], counted["rows"] = turn, result[0].rows[0][0]

        try:
            await executor.execute(Stmt("CREATE TABLE IF NOT EXISTS settled_rows (k INTEGER)"))
            await executor.execute(Stmt("DELETE FROM settled_rows"))
            ticker = asyncio.create_task(count_turns())
            exchanges = executor.exchanges
            await asyncio.gather(*(write(k) for k in range(writers)), claim())
            shared = executor.exchanges - exchanges
            stop.set()
            await ticker
            return woke, counted["rows"], shared
        finally:
            await executor.aclose()

    woke, rows_seen_by_claim, shared = asyncio.run(run())
    assert shared == 1, f"every unit was meant to share one exchange, {shared} were sent"
    assert rows_seen_by_claim == writers  # the claim ran after the others, in their transaction
    writer_turns = [woke[k] for k in range(writers)]
    assert woke["claim"] <= min(writer_turns)
    assert len(set(writer_turns)) >= 3, f"{writers} callers woke in turns {sorted(set(writer_turns))}"
