"""How many statechart events one worker keeps in flight: enough to cover the link to the primary,
and fewer once events start to queue (a slower primary, a busy loop), within a bound.

The rule (docs/tuning.md): it starts at its bound (a far primary needs it all from the first
round trip), and while events take at most TOLERANCE times the fastest latency seen lately, more
in flight means more done; past it, events queue, and the window gives some back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MINIMUM = 64  # below it, commits share exchanges and fsyncs poorly next to the primary (docs/tuning.md)
BASE_PERIOD = 10.0  # seconds the fastest latency seen counts as the link's own, before it is measured again
SMOOTHING = 0.1  # weight of each new latency in the running one
TOLERANCE = 3.0  # latency, as a multiple of the base, up to which the window grows
SLACK = 0.005  # seconds of latency above that, noise of a busy loop rather than a queue


class InFlightWindow:
    """The number of events in flight to aim for, from each settled event's latency: one more
    while a busy window's events take under TOLERANCE times the base plus SLACK (so it doubles
    each round trip), one less above that, and half when the latency passes a third of the lease
    (no lease may lapse in a queue)."""

    def __init__(
        self,
        maximum: int,
        *,
        visibility: float = 30.0,
        initial: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if maximum < 1:
            raise ValueError(f"the most events in flight must be at least 1, got {maximum!r}")
        self.maximum = maximum
        self.minimum = min(MINIMUM, maximum)
        self.visibility = visibility
        # Before anything is measured, the bound: growing from the floor took three round trips,
        # a fifth of a short drain's time at 100 ms (docs/tuning.md).
        start = maximum if initial is None else initial
        self._size = float(min(max(start, self.minimum), maximum))
        self._clock = clock
        self._latency: float | None = None  # smoothed latency of the last events
        self._lows: deque[tuple[float, float]] = deque()  # (when, latency): the rolling minimum
        self._busy_at = float("-inf")  # when a launch last found the window at least half full

    @property
    def size(self) -> int:
        return int(self._size)

    @property
    def base(self) -> float | None:
        """The fastest latency of the last BASE_PERIOD seconds: the link's and the work's own."""
        return self._lows[0][1] if self._lows else None

    @property
    def latency(self) -> float | None:
        return self._latency

    def launched(self, in_flight: int) -> None:
        """An event started, `in_flight` with it: a window at least half full is busy."""
        if 2 * in_flight >= self._size:
            self._busy_at = self._clock()

    def settled(self, latency: float, in_flight: int) -> None:
        """One event's latency (from its hand-out to its ack), with the events in flight when it ended."""
        now = self._clock()
        while self._lows and self._lows[-1][1] >= latency:
            self._lows.pop()
        self._lows.append((now, latency))
        while self._lows[0][0] < now - BASE_PERIOD:
            self._lows.popleft()
        self._latency = latency if self._latency is None else self._latency + SMOOTHING * (latency - self._latency)
        if self._latency > self.visibility / 3:
            self._size = max(self.minimum, self._size / 2)
            return
        if self._latency > TOLERANCE * self._lows[0][1] + SLACK:
            self._size = max(float(self.minimum), self._size - 1)
        elif 2 * in_flight >= self._size or now - self._busy_at <= latency:
            # Only a window busy while this event was in flight says more would help (half of it:
            # events start and end in bursts, one answer ending many): an idle worker keeps its own.
            self._size = min(float(self.maximum), self._size + 1)


class SharedWindow:
    """The window of a worker process serving many databases, shared between them: each database
    is sure of an equal part, and may also take what the others leave unused, which it gives back
    as its events commit once they ask for their part (meanwhile the process holds up to twice the
    window). A database's hold is counted as one worker's window counts its own."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"the most events in flight must be at least 1, got {total!r}")
        self.total = total
        self._holding: dict[str, Callable[[], int]] = {}

    def join(self, name: str, holding: Callable[[], int]) -> Callable[[], int]:
        """Make `name` a member, `holding()` the events it holds; returns its allowance (`allowance`)."""
        self._holding[name] = holding
        return lambda: self.allowance(name)

    def leave(self, name: str) -> None:
        self._holding.pop(name, None)

    def allowance(self, name: str) -> int:
        """The most events `name` may hold now: its equal part, or more where the window has room
        left once every other database holding events under its part has been kept room for."""
        held = {member: max(0, holding()) for member, holding in self._holding.items()}
        mine = held.get(name, 0)
        part = max(1, self.total // max(1, len(held)))
        free = self.total - sum(held.values())
        owed = sum(max(0, part - h) for member, h in held.items() if h > 0 and member != name)
        return mine + max(0, part - mine, free - owed)
