"""The sqld launcher's ports: a restart finds its port free because no other test process and no
outgoing connection is ever given it."""

from __future__ import annotations

import pytest

from harel_edge.testing.sqld import LAUNCHER_PORTS, launcher_ports


def slices(monkeypatch: pytest.MonkeyPatch, count: int) -> list[range]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    found = []
    for index in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        low, high = launcher_ports()
        found.append(range(low, high + 1))
    return found


@pytest.mark.parametrize("count", [2, 3, 4, 8, 16])
def test_each_xdist_worker_picks_ports_from_a_slice_no_other_worker_picks_from(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    found = slices(monkeypatch, count)
    ports = [port for each in found for port in each]
    assert len(ports) == len(set(ports))
    assert all(len(each) >= 100 for each in found)
    assert all(LAUNCHER_PORTS[0] <= port <= LAUNCHER_PORTS[1] for port in ports)


def test_outside_xdist_the_launcher_picks_from_its_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert launcher_ports() == LAUNCHER_PORTS


def test_the_launchers_ports_lie_below_the_kernels_ephemeral_ports() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral_low = int(ranges.read().split()[0])
    assert LAUNCHER_PORTS[1] < ephemeral_low
