"""The worker's window of events in flight: it follows the link, and backs off when events queue."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from harel_edge.observability import watch_window
from harel_edge.window import MINIMUM, SLACK, TOLERANCE, InFlightWindow


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settle(window: InFlightWindow, clock: Clock, latency: float, events: int, *, full: bool = True) -> None:
    for _ in range(events):
        clock.now += 0.001
        window.settled(latency, window.size if full else 1)


def test_a_window_starts_at_its_bound_since_a_far_primary_needs_it_all_from_the_first_round_trip() -> None:
    assert InFlightWindow(512).size == 512
    assert InFlightWindow(512, initial=8).size == MINIMUM, "never below the floor"
    assert InFlightWindow(16).size == 16, "a bound under the floor is the floor"


def test_a_window_on_a_slow_link_grows_while_every_event_takes_only_the_link_s_time() -> None:
    clock = Clock()
    window = InFlightWindow(256, initial=MINIMUM, clock=clock)
    settle(window, clock, 0.100, 500)
    assert window.size == 256, "latency flat at the link's: more in flight only adds throughput"


def test_a_window_stops_growing_once_events_queue_and_settles_near_what_the_work_needs() -> None:
    clock = Clock()
    window = InFlightWindow(512, initial=MINIMUM, clock=clock)
    settle(window, clock, 0.010, 10)  # the fastest an event goes: the base
    # A worker whose work takes 0.1 ms of CPU each: every event beyond 100 in flight waits its turn.
    for _ in range(5000):
        clock.now += 0.001
        window.settled(max(0.010, window.size * 0.0001), window.size)
    # It grows until events take TOLERANCE times the base plus SLACK (35 ms: 350 in flight), no further.
    assert TOLERANCE * 0.010 + SLACK == pytest.approx(0.035)
    assert 330 <= window.size <= 370, f"about 350, not {window.size}"


def test_a_window_never_shrinks_below_what_keeps_commits_shared() -> None:
    clock = Clock()
    window = InFlightWindow(512, clock=clock)
    settle(window, clock, 0.002, 10)  # next to its primary: a 2 ms base
    settle(window, clock, 0.050, 2000)  # events queue behind the worker's own CPU
    assert window.size == MINIMUM == 64


def test_a_window_shrinks_when_the_primary_slows_down() -> None:
    clock = Clock()
    window = InFlightWindow(256, initial=MINIMUM, clock=clock)
    settle(window, clock, 0.020, 300)
    grown = window.size
    settle(window, clock, 0.080, 300)  # the primary answers four times slower
    assert window.size < grown


def test_an_idle_worker_keeps_the_window_it_has() -> None:
    clock = Clock()
    window = InFlightWindow(256, initial=100, clock=clock)
    settle(window, clock, 0.020, 500, full=False)
    assert window.size == 100, "only a full window says more would help"


def test_a_latency_near_the_lease_halves_the_window_so_no_lease_lapses_while_it_waits() -> None:
    clock = Clock()
    window = InFlightWindow(256, visibility=3.0, clock=clock)
    settle(window, clock, 2.0, 30)
    assert window.size == MINIMUM


def test_the_window_stays_within_its_bounds() -> None:
    clock = Clock()
    window = InFlightWindow(2, clock=clock)
    assert window.size == 2
    settle(window, clock, 0.1, 100)
    assert window.size == 2
    settle(window, clock, 5.0, 100)
    assert window.size == 2
    with pytest.raises(ValueError, match="at least 1"):
        InFlightWindow(0)


def test_the_base_latency_is_measured_again_after_its_period() -> None:
    clock = Clock()
    window = InFlightWindow(256, clock=clock)
    window.settled(0.005, 1)
    clock.now += 11.0
    window.settled(0.050, 1)
    assert window.base == 0.050, "a fast event long ago says nothing about the link now"


def test_a_window_whose_events_start_and_end_in_bursts_doubles_each_round_trip() -> None:
    clock = Clock()
    window = InFlightWindow(256, initial=MINIMUM, clock=clock)
    for expected in (2 * MINIMUM, 4 * MINIMUM):
        burst = window.size
        for in_flight in range(1, burst + 1):  # one claim's answer: every event starts at once
            window.launched(in_flight)
        clock.now += 0.100  # the round trip
        for in_flight in range(burst - 1, -1, -1):  # one commit's answer: every event ends at once
            window.settled(0.100, in_flight)
        assert window.size == expected, "every event of a full burst says more would help, not the first half"


def test_the_window_and_its_latencies_are_published_as_the_gauges_read_when_scraped() -> None:
    clock = Clock()
    window = InFlightWindow(256, clock=clock)
    watch_window(window)
    assert REGISTRY.get_sample_value("harel_edge_window_events") == window.size == 256
    settle(window, clock, 0.020, 3)
    settle(window, clock, 0.080, 200)
    assert REGISTRY.get_sample_value("harel_edge_window_events") == window.size < 256
    recent = REGISTRY.get_sample_value("harel_edge_event_latency_seconds", {"kind": "recent"})
    base = REGISTRY.get_sample_value("harel_edge_event_latency_seconds", {"kind": "base"})
    assert (recent, base) == (window.latency, window.base)
    assert base == pytest.approx(0.020) and recent > base


# ---- the window a deployment's databases share ------------------------------------------------


def shared(total: int, **holding: int):
    from harel_edge.window import SharedWindow  # noqa: PLC0415

    window = SharedWindow(total)
    for name in holding:
        window.join(name, lambda name=name: holding[name])
    return window, holding


def test_a_database_alone_in_the_shared_window_may_hold_all_of_it():
    window, _ = shared(1024, hot=0, quiet=0)
    assert window.allowance("hot") == 1024


def test_a_busy_database_borrows_what_the_idle_ones_leave_but_not_a_newcomers_part():
    window, holding = shared(1024, hot=1000, quiet=0)
    assert window.allowance("hot") == 1024  # the quiet one holds nothing: all the room is free
    holding["quiet"] = 1  # it asked and got one: now it is owed its part
    assert window.allowance("hot") == 1000  # no more for the borrower, which gives back as it commits
    holding["hot"] = 600
    assert window.allowance("quiet") == 512  # its part at once, while the borrower gives back
    assert window.allowance("hot") == 600  # the room left is kept for the quiet one's part


def test_busy_databases_come_to_equal_parts_and_never_hold_more_than_twice_the_total():
    window, holding = shared(100, a=0, b=0, c=0, d=0)
    for _ in range(50):
        for name in holding:
            holding[name] -= min(10, holding[name])  # its commits settle up to ten
            holding[name] = max(holding[name], window.allowance(name), 1)  # its claim: what it may, one at least
            assert sum(holding.values()) <= 2 * 100
    assert sorted(holding.values()) == [25, 25, 25, 25]


def test_a_shared_window_of_no_events_is_refused():
    from harel_edge.window import SharedWindow  # noqa: PLC0415

    with pytest.raises(ValueError, match="at least 1"):
        SharedWindow(0)
