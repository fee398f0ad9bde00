"""`harel-edge limits`: set, list and clear the per-key concurrency and rate limits every claim holds to."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from harel_edge.cli.app import EXIT_PROBLEM, command_group, fail, handled, out, shown

if TYPE_CHECKING:
    from harel_edge import limits

limits_app = command_group("Per-key flow control: at most N in flight, at most N claims per period, on every worker.")


def _describe(limit: limits.Limit) -> str:
    parts = []
    if limit.concurrency is not None:
        parts.append(f"concurrency {limit.concurrency}")
    if limit.rate_text is not None:
        parts.append(f"rate {limit.rate_text}")
    return ", ".join(parts)


@handled
def limits_set(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="A group's limit key: its limit_key, else its routing key."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", min=0, help="At most N of the key's messages in flight at once (0 holds it back)."
    ),
    rate: str | None = typer.Option(
        None, "--rate", metavar="N/PERIOD", help="At most N claims in any window of PERIOD: 100/60s, 100/1m, 50/s, 1000/h."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the limit set as JSON."),
) -> None:
    """Set KEY's limits, replacing any it had; every worker's next claim holds to them.

    A limit not given is lifted. Written on the primary.
    """
    settings = ctx.obj.settings()
    from harel_edge import limits  # noqa: PLC0415
    count, period = limits.parse_rate(rate) if rate is not None else (None, None)
    limit = limits.set_key_limit(settings, key, concurrency=concurrency, rate=count, period=period)
    if as_json:
        print(json.dumps(limit.as_dict(), indent=2))
        return
    out.print(f"{shown(key)}: {_describe(limit)}", markup=False)


@handled
def limits_list(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the limited keys: each limit, what is in flight and claimed in the period, what waits.

    Counted on the primary (a replica's own file may lag it). Reads only.
    """
    settings = ctx.obj.settings()
    from harel_edge import limits  # noqa: PLC0415
    found = limits.read_limits(settings)
    if as_json:
        print(json.dumps([limit.as_dict() for limit in found], indent=2))
        return
    if not found:
        out.print("no limits set", markup=False)
        return
    table = Table(title="limits")
    for column in ("key", "concurrency", "in flight", "rate", "claims in period", "waiting"):
        table.add_column(column, justify="left" if column in ("key", "rate") else "right")
    for limit in found:
        table.add_row(
            shown(limit.key),
            "-" if limit.concurrency is None else str(limit.concurrency),
            str(limit.in_flight),
            limit.rate_text or "-",
            str(limit.claims_in_period) if limit.rate is not None else "-",
            str(limit.waiting),
        )
    out.print(table)


@handled
def limits_clear(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The limited key (from `limits list`)."),
) -> None:
    """Lift every limit of KEY: its groups are claimed freely from the next claim on."""
    settings = ctx.obj.settings()
    from harel_edge import limits  # noqa: PLC0415
    if not limits.clear_key_limit(settings, key):
        fail(EXIT_PROBLEM, f"{key!r} has no limits: `harel-edge limits list` shows the keys that do")
    out.print(f"{shown(key)}: limits lifted", markup=False)
