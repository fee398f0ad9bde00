"""Many write transactions at once against one sqld, over Hrana: what wedges sqld 0.24's
write-lock queue when it checkpoints after commits (docs/operations.md, "The primary wedges")."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from harel_edge.executor import Stmt
from harel_edge.executor.hrana import transaction_request

TABLE = "stress_writes"


@dataclass
class StressOutcome:
    """Batches committed, refusals seen (SQLITE_BUSY: retried), and whether every writer got
    all its batches through before its deadline (False: the primary stopped answering)."""

    committed: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    seconds: float = 0.0


async def concurrent_writes(
    url: str, token: str, *, writers: int = 16, batches: int = 40, rows: int = 4, stall: float = 30.0
) -> StressOutcome:
    """`writers` coroutines each commit `batches` transactions of `rows` 3 KB rows then count the
    table, one Hrana pipeline each (as many streams as writers); a writer that waits `stall` s
    for an answer ends."""
    outcome = StressOutcome()
    pipeline = url.rstrip("/") + "/v3/pipeline"
    insert = transaction_request([Stmt(f"INSERT INTO {TABLE}(b) VALUES (randomblob(3000))")] * rows)
    count = f"SELECT count(*) FROM {TABLE}"  # a reader on the same stream, after each commit
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=stall)) as http:

        async def post(request: dict) -> dict:
            requests = [request, {"type": "execute", "stmt": {"sql": count}}, {"type": "close"}]
            async with http.post(pipeline, json={"baton": None, "requests": requests}) as answer:
                answer.raise_for_status()
                return (await answer.json())["results"][0]

        await post({"type": "execute", "stmt": {"sql": f"CREATE TABLE IF NOT EXISTS {TABLE}(id INTEGER PRIMARY KEY, b BLOB)"}})

        async def writer() -> None:
            done = 0
            while done < batches:
                result = await post(insert)
                errors = [e for e in result["response"]["result"]["step_errors"] if e] if result["type"] == "ok" else [result["error"]]
                if errors:  # the write lock was busy: the batch rolled back, try it again
                    code = str(errors[0].get("code", errors[0].get("message")))
                    outcome.refused[code] = outcome.refused.get(code, 0) + 1
                    if sum(outcome.refused.values()) > 10 * writers * batches:  # not a busy lock: a lasting error
                        raise RuntimeError(f"every batch is refused: {errors[0]}")
                    continue
                done += 1
                outcome.committed += 1

        results = await asyncio.gather(*(writer() for _ in range(writers)), return_exceptions=True)
    outcome.finished = not any(isinstance(r, BaseException) for r in results)
    outcome.seconds = time.monotonic() - started
    return outcome
