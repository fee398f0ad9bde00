"""Measure whether the event loop stays free while something is awaited: count a 1 ms ticker's
wake-ups, which compares designs without asserting wall-clock times (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import time
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


async def lag_ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Until `stop`: ask for 1 ms sleeps and note how late each woke, in ms (the loop's lag)."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - start - 0.001) * 1000)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0-1) of `values` by rank; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
