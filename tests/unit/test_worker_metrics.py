"""The worker's sampler sets the queue's gauges from what the primary holds: depth by state,
groups held back (behind a waiting head, or by a key at its limit) and dead letters; and writes
the worker's heartbeat."""

from __future__ import annotations

import asyncio

from harel.spec.states import Event
from prometheus_client import REGISTRY

from harel_edge import LibsqlTransport, limits
from harel_edge.executor import open_executor
from harel_edge.heartbeats import Vitals, workers_seen
from harel_edge.sampler import sample_metrics
from harel_edge.settings import ExplicitSettings


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_one_sample_sets_depth_held_back_and_dead_letter_gauges_from_the_primary_and_writes_a_heartbeat(tmp_path):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    with LibsqlTransport(settings=settings) as transport:
        transport.publish("later", Event(kind="Remind"), delay=3600)
        transport.publish_many((f"t{i}", Event(kind="go"), 2, None, "tenant") for i in range(3))
        limits.set_limit(transport.execute, settings.prefix, "tenant", concurrency=1)
        assert transport.claim("w", 600) is not None  # the tenant's one slot, taken

    async def one_sample() -> None:
        executor, stop = open_executor(settings), asyncio.Event()
        sampler = asyncio.create_task(sample_metrics(None, executor, settings, 0.01, stop, lambda lag: Vitals(settled=7)))
        try:
            while gauge("harel_edge_held_back_groups", reason="limit") != 2:
                await asyncio.sleep(0.01)  # until the first sample has landed (pytest-timeout bounds it)
        finally:
            stop.set()
            await sampler
            await executor.aclose()

    asyncio.run(one_sample())
    assert gauge("harel_edge_held_back_groups", reason="waiting_head") == 1.0
    assert gauge("harel_edge_queue_depth", priority="2", state="in_flight") == 1.0
    assert gauge("harel_edge_queue_depth", priority="2", state="queued") == 2.0
    assert gauge("harel_edge_queue_depth", priority="0", state="parked") == 1.0
    assert gauge("harel_edge_dead_letters", kind="message") == 0.0
    with LibsqlTransport(settings=settings) as transport:
        (beat,) = workers_seen(transport.execute, settings.prefix)
    # Its state is not asserted: sampled every 10 ms, it is "silent" 30 ms after the last beat.
    assert (beat.worker_id, beat.profile, beat.settled) == (settings.worker_id, "local", 7), "and its heartbeat"
