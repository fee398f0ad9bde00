"""Processes a test starts together, each putting one answer on a queue the test reads.

They start from a fork server that imported harel_edge once (`context()`): a spawned process
imports it again each time (0.6 s of CPU here; 0.09 s forked from the server). The server opens
no connection, so no libsql connection crosses a fork."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

# What every test's worker process imports, loaded once in the fork server.
PRELOAD = [
    "harel.spec.states",
    "harel_edge.queue",
    "harel_edge.store",
    "harel_edge.durable",
    "harel_edge.worker",
    "harel_edge.testing.proxy",
]


def context() -> Any:
    """The multiprocessing context for a test's processes: forked from a server that has
    imported `PRELOAD` and holds no connection or thread of libsql's."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def answers(ctx: Any, target: Callable[..., None], arguments: Sequence[tuple], results: Any, *, timeout: float) -> list:
    """Start `target(*args)` in a process for each `args`, and return the answer each put on
    `results` (in the order they came), once every process has ended."""
    processes = [ctx.Process(target=target, args=args) for args in arguments]
    for process in processes:
        process.start()
    try:
        return [results.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
