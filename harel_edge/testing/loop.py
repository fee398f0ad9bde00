"""Measure whether the event loop stays free while something is awaited.

A frozen loop shows as a 1 ms ticker that barely ticks: counting its wake-ups during a call
compares designs (a thread that holds the GIL against a worker process) without asserting any
wall-clock time, which a shared machine would make flaky.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def ticks_during(call: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """How many times a 1 ms ticker woke while `call()` was awaited, and what it returned."""
    ticks = 0
    done = False
    started = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        started.set()
        while not done:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await started.wait()
    ticks = 0
    try:
        result = await call()
    finally:
        done = True
        await task
    return ticks, result
