"""A worker whose grace runs out cancels the events it is handling: what their commits applied is
counted as handled, not as lost leases, and what they did not is given back, on a real local file."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from harel_edge.executor.local import LocalExecutor
from harel_edge.migration import migrate
from harel_edge.publishing import publish, publish_request
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.worker import WorkerOptions, run_worker
from harel_edge.worker_loops import EdgeAsyncWorker

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")
ORDERS = [f"order-{i}" for i in range(12)]


def test_a_stop_that_cancels_handlers_mid_commit_counts_what_they_committed_and_gives_back_the_rest(tmp_path, monkeypatch):
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"), retry_deadline=5.0, max_in_flight=8)
    migrate(settings)  # publish refuses a database that does not exist yet
    for order in ORDERS:
        publish(settings, publish_request(order, "Start", "{}", create="order", definitions=EXAMPLES))
    held, cancelled = threading.Event(), threading.Event()
    run, loop_run = LocalExecutor._run, EdgeAsyncWorker.run

    def commit_held(self, connection, units):
        """The first commit of several events (on the executor's thread) waits until the stop has
        cancelled their handlers."""
        if threading.current_thread() is not threading.main_thread() and not held.is_set():
            held.set()
            cancelled.wait(30)
        return run(self, connection, units)

    async def cancelled_loop(self, *args, **kwargs):
        try:
            return await loop_run(self, *args, **kwargs)
        finally:
            cancelled.set()  # the loop ended, cancelled with its handlers: their commit may finish now

    monkeypatch.setattr(LocalExecutor, "_run", commit_held)
    monkeypatch.setattr(EdgeAsyncWorker, "run", cancelled_loop)

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=lambda: held.wait(30) and loop.call_soon_threadsafe(stop.set), daemon=True).start()
        options = WorkerOptions(definitions_dir=EXAMPLES, grace=0.0, sample_every=3600)
        return await asyncio.wait_for(run_worker(settings, options, stop), 60)

    report = asyncio.run(main())
    assert held.is_set(), "a commit of several events was on the thread when the stop came"
    with EdgeStore(settings) as store:
        left = store.execute(f"SELECT count(*), count(locked_by) FROM {settings.prefix}_transport_messages")[0]
    handled = len(ORDERS) - left[0]
    assert report.lost == 0, f"no lease counted lost: {report}"
    assert report.acks == handled, f"every message a cancelled handler's commit took is counted handled: {report}"
    assert left[1] == 0, "every message left was given back, none waits for its lease to lapse"
