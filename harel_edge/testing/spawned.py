"""Processes a test starts together (spawned, never forked: a libsql connection must not cross a
fork), each putting one answer on a queue the test reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


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
