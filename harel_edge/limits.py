"""Flow-control limits per key, kept on the primary in `<prefix>_transport_limits`, which every
claim reads in its own statement: `harel-edge limits` runs these (docs/flow-control.md).

A key is a group's `limit_key` (given at its first publish; by default its routing key). A
concurrency limit bounds the key's messages in flight (a lease that lapsed no longer counts); a
rate limit bounds its claims in any rolling window of `period` seconds, on the primary's clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from harel_edge.access import with_primary_writer, with_reader
from harel_edge.errors import ConfigurationError, SchemaError
from harel_edge.ids import refuse_nul
from harel_edge.schema import EdgeNames, is_free, now_or, table_exists
from harel_edge.schema_flow import FlowNames
from harel_edge.settings import EdgeSettings

Execute = Callable[..., list[tuple]]

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# What a limit may be (docs/flow-control.md, "What is accepted"): beyond them a value is a typo.
MAX_COUNT = 1_000_000  # a concurrency, or a rate's claims in its period
MIN_PERIOD, MAX_PERIOD = 0.001, 365 * 86400.0  # a rate's period, in seconds
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*([smhd]?)\s*$")


@dataclass(frozen=True)
class Limit:
    """One key's limits, and what holds against them now on the primary."""

    key: str
    concurrency: int | None  # messages of the key in flight at once (None: no bound)
    rate: int | None  # claims of the key ...
    period: float | None  # ... in any window of this many seconds (None: no rate limit)
    in_flight: int = 0  # leases of the key not yet ended
    claims_in_period: int = 0  # claims of the key in the last `period` seconds
    waiting: int = 0  # groups of the key with nothing in flight, held back while it is at its limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rate_text(self) -> str | None:
        return None if self.rate is None or self.period is None else f"{self.rate}/{format_period(self.period)}"


def parse_rate(text: str) -> tuple[int, float]:
    """`N/PERIOD` as (N, seconds): `100/60s`, `100/1m`, `50/s`, `10/2.5` (seconds), `1000/h`."""
    match = _RATE.match(text)
    if not match or match.group(2) == "." or (match.group(2) == "" and not match.group(3)):
        raise ConfigurationError(
            f"rate {text!r}: write N/PERIOD, the claims allowed per period, e.g. 100/60s, 100/1m, 50/s or 1000/h"
        )
    count, amount, unit = match.groups()
    seconds = (float(amount) if amount else 1.0) * UNITS[unit]
    _check_rate(int(count), seconds, f"--rate {text}")
    return int(count), seconds


def format_period(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit] and (seconds / UNITS[unit]).is_integer():
            return f"{int(seconds / UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def _check(key: str, concurrency: int | None, rate: int | None, period: float | None) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"the key must be a non-empty string (a routing key or a limit_key), got {key!r}")
    refuse_nul(key, "key")
    if concurrency is None and rate is None:
        raise ConfigurationError("give a limit to set: --concurrency N, --rate N/PERIOD, or both")
    _check_count(concurrency, "concurrency (--concurrency)")
    if (rate is None) != (period is None):
        raise ConfigurationError("a rate needs its period: --rate N/PERIOD, e.g. 100/60s")
    if rate is not None:
        _check_rate(rate, period, "rate (--rate N/PERIOD)")


def _check_count(value: Any, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT):
        raise ConfigurationError(
            f"{name} must be a whole number from 0 to {MAX_COUNT:,} (0 holds the key back), got {value!r}"
        )


def _check_rate(rate: Any, period: Any, name: str) -> None:
    """`name` says where the rate was given: the option, or the library's arguments."""
    if isinstance(rate, bool) or not isinstance(rate, int) or not 0 <= rate <= MAX_COUNT:
        raise ConfigurationError(f"{name}: the claims a period must be a whole number from 0 to {MAX_COUNT:,}, got {rate!r}")
    if isinstance(period, bool) or not isinstance(period, int | float) or not MIN_PERIOD <= period <= MAX_PERIOD:
        raise ConfigurationError(f"{name}: the period must be from {MIN_PERIOD * 1000:g} ms to 365 days, got {period!r} s")


def _require_table(execute: Execute, prefix: str) -> str:
    table = FlowNames(prefix).limits
    if not table_exists(execute, table):
        raise SchemaError(
            f"this database has no limits table {table}: run `harel-edge migrate` (or start a worker, "
            "which migrates at start), or set HAREL_EDGE_PREFIX to the prefix the workers use"
        )
    return table


def _read(execute: Execute, prefix: str, key: str | None, now: float | None) -> list[Limit]:
    n, f = EdgeNames(prefix), FlowNames(prefix)
    table = _require_table(execute, prefix)
    t = now_or("?2")
    head = f"(SELECT MIN(seq) FROM {n.messages} WHERE group_id = g.group_id)"
    rows = execute(
        f"SELECT l.key, l.concurrency, l.rate, l.period,"
        f" (SELECT count(*) FROM {n.groups} g WHERE g.held_key = l.key AND g.leased_until >= {t}),"
        f" CASE WHEN l.rate IS NULL THEN 0 ELSE"
        f" (SELECT count(*) FROM {f.limit_claims} c WHERE c.key = l.key AND c.at > {t} - l.period) END,"
        f" (SELECT count(*) FROM {n.groups} g JOIN {n.messages} m ON m.seq = {head}"
        f" WHERE g.held_key = l.key AND {is_free('m', t)})"
        f" FROM {table} l WHERE ?1 IS NULL OR l.key = ?1 ORDER BY l.key",
        (key, now),
    )
    found = []
    for k, concurrency, rate, period, in_flight, recent, free in rows:
        limit = Limit(
            k,
            None if concurrency is None else int(concurrency),
            None if rate is None else int(rate),
            None if period is None else float(period),
            int(in_flight),
            int(recent),
        )
        full = (limit.concurrency is not None and limit.in_flight >= limit.concurrency) or (
            limit.rate is not None and limit.claims_in_period >= limit.rate
        )
        found.append(Limit(**{**limit.as_dict(), "waiting": int(free) if full else 0}))
    return found


def list_limits(execute: Execute, prefix: str, *, now: float | None = None) -> list[Limit]:
    """Every limited key, by key, with its in-flight count and its claims in the period."""
    return _read(execute, prefix, None, now)


def get_limit(execute: Execute, prefix: str, key: str, *, now: float | None = None) -> Limit | None:
    found = _read(execute, prefix, key, now)
    return found[0] if found else None


def set_limit(
    execute: Execute,
    prefix: str,
    key: str,
    *,
    concurrency: int | None = None,
    rate: int | None = None,
    period: float | None = None,
) -> Limit:
    """Set `key`'s limits, replacing any it had (a limit not given is lifted); the next claim
    on any worker holds to them. Returns them as stored."""
    _check(key, concurrency, rate, period)
    table = _require_table(execute, prefix)
    execute(
        f"INSERT INTO {table} (key, concurrency, rate, period) VALUES (?1, ?2, ?3, ?4)"
        " ON CONFLICT (key) DO UPDATE SET concurrency = ?2, rate = ?3, period = ?4",
        (key, concurrency, rate, None if period is None else float(period)),
    )
    return Limit(key, concurrency, rate, None if period is None else float(period))


def clear_limit(execute: Execute, prefix: str, key: str) -> bool:
    """Lift every limit of `key` (and forget its rate log); False when it had none."""
    table = _require_table(execute, prefix)
    return bool(execute(f"DELETE FROM {table} WHERE key = ? RETURNING key", (key,)))


# ---- on the settings' database, as the commands reach it -------------------------------------------


def read_limits(settings: EdgeSettings) -> list[Limit]:
    """`list_limits` with reads only (on a replica, from its primary): a read-only token is enough."""
    return with_reader(settings, lambda execute: list_limits(execute, settings.prefix))


def set_key_limit(
    settings: EdgeSettings,
    key: str,
    *,
    concurrency: int | None = None,
    rate: int | None = None,
    period: float | None = None,
) -> Limit:
    """`set_limit` on the primary itself, after `check_writable`."""
    _check(key, concurrency, rate, period)
    return with_primary_writer(
        settings,
        lambda execute: set_limit(execute, settings.prefix, key, concurrency=concurrency, rate=rate, period=period),
    )


def clear_key_limit(settings: EdgeSettings, key: str) -> bool:
    """`clear_limit` on the primary itself, after `check_writable`."""
    return with_primary_writer(settings, lambda execute: clear_limit(execute, settings.prefix, key))
