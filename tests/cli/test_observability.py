"""One log line and one count for each retry, failed sync and lost lease; logs as JSON lines."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

import pytest
import structlog
from harel.engine.distributed import Worker
from harel.engine.execution import Execution
from harel.spec.states import Event
from prometheus_client import REGISTRY

from harel_edge import LibsqlTransport, logs, retry
from harel_edge.connection import EdgeConnection
from harel_edge.executor import open_executor
from harel_edge.heartbeats import Vitals
from harel_edge.sampler import sample_metrics
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.worker import load_definitions

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")


@pytest.fixture
def log_lines():
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    logs.configure_logging("json", "info", stream=stream)

    def lines(event: str | None = None) -> list[dict]:
        found = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
        return [line for line in found if event is None or line["event"] == event]

    yield lines
    # Back to structlog's defaults, as other tests expect (a warning-level filter left behind
    # here would hide the info lines tests/unit/test_retry.py captures).
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_retry_writes_one_log_line_and_is_counted(log_lines, tmp_path):
    settings = ExplicitSettings.load(
        db_path=str(tmp_path / "q.db"), retry_initial_delay=0.001, retry_max_delay=0.01
    )
    failures = iter([ValueError("database is locked"), ValueError("Hrana: stream error: STREAM_EXPIRED")])
    before = sample("harel_edge_retries_total", operation="test.op")

    def attempt() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "done"

    assert retry.call_with_retry(settings, "test.op", attempt) == "done"
    assert sample("harel_edge_retries_total", operation="test.op") - before == 2
    lines = log_lines("retrying")
    assert [line["attempt"] for line in lines] == [1, 2]
    assert all(line["operation"] == "test.op" and line["level"] == "warning" for line in lines)
    assert "database is locked" in lines[0]["error"]


def test_a_lost_lease_writes_one_log_line_and_is_counted(log_lines, tmp_path):
    now = [1000.0]
    transport = LibsqlTransport(str(tmp_path / "q.db"), clock=lambda: now[0])
    transport.publish("g", Event(kind="E"))
    first = transport.claim("slow", 5)
    now[0] += 10  # the lease lapses; another worker takes the message
    assert transport.claim("fast", 5) is not None
    before = sample("harel_edge_lost_leases_total", operation="ack")
    assert transport.ack(first) is False
    transport.close()
    assert sample("harel_edge_lost_leases_total", operation="ack") - before == 1
    (line,) = log_lines("lost lease")
    assert line["group_id"] == "g" and line["operation"] == "ack"


@pytest.mark.sqld
def test_a_failed_sync_of_the_workers_replica_writes_a_log_line_and_is_counted(log_lines, fresh_sqld_primary, tmp_path):
    settings = ExplicitSettings.load(
        profile="replica",
        db_path=str(tmp_path / "r.db"),
        sync_url=fresh_sqld_primary.http_url,
        auth_token=fresh_sqld_primary.rw_token,
    )
    replica = EdgeConnection(settings)  # synced as it opens
    before = sample("harel_edge_sync_failures_total")
    fresh_sqld_primary.stop()

    async def sample_until_two_failures() -> None:
        executor = open_executor(settings)
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_metrics(lambda: True, executor, settings, 0.01, stop, lambda lag: Vitals()))
        try:
            for _ in range(3000):  # polls a count another task moves, never a fixed wait
                if sample("harel_edge_sync_failures_total") - before >= 2 or sampler.done():
                    break
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            await sampler
            await executor.aclose()

    asyncio.run(sample_until_two_failures())
    replica.close()
    failed = log_lines("sync failed")
    counted = sample("harel_edge_sync_failures_total") - before
    assert counted >= 2, "each failed sync of the sampler is counted"
    assert len(failed) == counted, "one log line per failed sync"
    assert all(line["where"] == "worker" for line in failed)


def test_harels_own_log_lines_come_out_as_json_too(log_lines, tmp_path):
    # harel's worker logic, on harel_edge's store and transport, discards an event sent to an
    # execution that has not started, and says so on harel's own logger.
    store = EdgeStore(ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db")))
    transport = LibsqlTransport(settings=store.settings)
    try:
        store.save(Execution(id="order-1", definition_id="order"))  # PENDING: its Start not handled
        transport.publish("order-1", Event(kind="Pay", data={"amount": 1.0}))
        worker = Worker(store, transport, load_definitions(EXAMPLES), worker_id="w1", execution="inline")
        assert worker.step() is True
        assert transport.depth() == 0, "the event was discarded"
    finally:
        store.close()
    (line,) = [line for line in log_lines() if line.get("logger") == "harel.engine.hosting"]
    assert line["event"].startswith("discarding Pay event for execution order-1: still PENDING")
    assert line["level"] == "warning" and "timestamp" in line
