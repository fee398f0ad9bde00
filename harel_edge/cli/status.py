"""`harel-edge status`: the queue, held-back work, workers, workflows and a replica's lag, once or
live (`--watch`), rendered from `harel_edge.status.collect_status`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harel_edge.cli.app import EXIT_PROBLEM, console, handled, out, plural, scrub_text, shown
from harel_edge.errors import PrimaryUnavailableError, tidy

if TYPE_CHECKING:
    from harel_edge.status import StatusReport


@handled
def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    groups: int = typer.Option(10, "--groups", min=0, help="How many of the deepest groups to list."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Redraw every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", min=0.2, metavar="SECONDS", help="How often --watch reads."),
    database: str | None = typer.Option(None, "--database", metavar="NAME", help="Which of the deployment's databases."),
    all_databases: bool = typer.Option(False, "--all", help="Each database of HAREL_EDGE_DATABASES, and their total."),
) -> None:
    """Show the queue, held-back work, workers, workflows and a replica's lag.

    Depth by priority, routing key and group, in flight, parked, each worker's last heartbeat. Reads only.
    --all: one line for each database of the deployment, and the total.
    """
    from harel_edge.status import collect_status  # noqa: PLC0415

    if all_databases:
        if watch:
            raise typer.BadParameter("--watch redraws one database: give --database NAME instead of --all")
        _each_database(ctx.obj.settings(deployment=True), as_json)
        return
    settings = ctx.obj.settings(database=database)

    if watch and as_json:
        raise typer.BadParameter("--watch draws tables; for JSON, run `status --json` as often as you need")
    if watch:
        _watch(lambda: collect_status(settings, top=groups), groups, interval, lambda exc: scrub_text(tidy(str(exc)), ctx))
        return
    report = collect_status(settings, top=groups)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        out.print(view(report, groups))


def _watch(collect: Callable[[], StatusReport], groups: int, interval: float, said: Callable[[Exception], str]) -> None:
    """Redraw the view every `interval` seconds, with the rate of settled work since the last read;
    while the primary cannot be reached, say so and since when, above the last view, and read on."""
    from rich.live import Live  # noqa: PLC0415

    rate, drawn, down_since = SettledRate(), None, None
    try:
        # Its own console: `out` never wraps (for pipes), and a redrawn screen must wrap, not crop.
        with Live(Text(""), console=console(), auto_refresh=False, transient=False) as live:
            while True:
                try:
                    report = collect()
                except PrimaryUnavailableError as exc:
                    down_since = down_since or datetime.now(UTC)
                    live.update(_unreachable(said(exc), down_since, interval, drawn), refresh=True)
                else:
                    down_since = None
                    rate.add(report, time.monotonic())
                    drawn = view(report, groups, rate)
                    live.update(drawn, refresh=True)
                time.sleep(interval)  # the watch's pace: each read is a fresh report
    except KeyboardInterrupt:
        pass


def _unreachable(reason: str, since: datetime, interval: float, drawn: RenderableType | None) -> RenderableType:
    """What --watch draws while the primary cannot be reached: since when, why, and its last view."""
    elapsed = (datetime.now(UTC) - since).total_seconds()
    line = Text(
        f"primary unreachable since {since.isoformat(timespec='seconds')} ({elapsed:.0f} s): {shown(reason)}; "
        f"reading again every {interval:g} s"
    )
    return line if drawn is None else Group(line, Text("its last view:"), drawn)


class SettledRate:
    """Events and workflow passes settled per second, from the workers' heartbeat counts between
    two reads (a worker that restarted counts from zero again)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.at: float | None = None
        self.per_second: float | None = None
        self.by_worker: dict[str, float] = {}

    def add(self, report: StatusReport, at: float) -> None:
        counts = {w.worker_id: w.settled for w in report.workers}
        if self.at is not None and at > self.at:
            gained = {w: n - self.last.get(w, 0) if n >= self.last.get(w, 0) else n for w, n in counts.items()}
            self.by_worker = {w: g / (at - self.at) for w, g in gained.items()}
            self.per_second = sum(self.by_worker.values())
        self.last, self.at = counts, at


def view(report: StatusReport, groups: int, rate: SettledRate | None = None) -> RenderableType:
    """Every section of the report, as one renderable (printed once, or redrawn by --watch)."""
    parts: list[RenderableType] = [*_queue(report, groups)]
    if report.flow is not None:
        parts += _flow(report.flow)
    parts += _workers(report, rate)
    parts += _workflows(report.workflows)
    counts = report.executions
    if counts is not None:
        counted = ", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none"
        parts.append(_counted(f"executions: {counted}", counts.get("failed", 0), "executions list --state failed` shows the failed ones"))
    dead = report.dead_letters
    if dead is not None:
        counted = f"{plural(dead['messages'], 'message')}, {plural(dead['workflows'], 'workflow')}"
        parts.append(_counted(f"dead letters: {counted}", dead["messages"] + dead["workflows"], "dead-letter list` shows them"))
    replica = report.replica
    if replica is not None:
        lag = replica.lag_seconds
        synced = "never synced on this machine" if lag is None else f"last synced {replica.last_sync_at} ({lag:.1f} s ago)"
        seen = replica.messages_seen_locally
        parts.append(Text(f"replica {shown(replica.file)}: {synced}" + ("" if seen is None else f", sees {plural(seen, 'message')} locally")))
    return Group(*parts)


def _queue(report: StatusReport, groups: int) -> list[RenderableType]:
    queue = report.queue
    totals, oldest = queue["totals"], queue["oldest"]
    parts: list[RenderableType] = [
        Text(
            f"{report.profile} at {shown(report.where)} (schema {report.schema_version}): "
            f"{plural(totals['messages'], 'message')} in {plural(totals['groups'], 'group')}, "
            f"{totals['in_flight']} in flight, {totals['parked']} parked"
        )
    ]
    if oldest["seq"] is not None:
        age = oldest["age_seconds"]
        told = f", {age:.1f} s old" if age is not None else " (age unknown: its publisher did not stamp created_time)"
        parts.append(Text(f"oldest message: #{oldest['seq']} of {shown(oldest['group_id'])}{told}"))
    if not queue["by_priority_and_routing_key"]:
        parts.append(Text("queue by priority and routing key: none (the queue is empty)"))
    else:
        table = Table(title="queue by priority and routing key")
        for column in ("priority", "routing key", "groups", "messages", "queued", "in flight", "parked"):
            table.add_column(column, justify="right" if column != "routing key" else "left")
        for row in queue["by_priority_and_routing_key"]:
            counts = (str(row[k]) for k in ("groups", "messages", "queued", "in_flight", "parked"))
            table.add_row(str(row["priority"]), shown(row["routing_key"] or "-"), *counts)
        parts.append(table)
    if queue["deepest_groups"]:
        deepest = Table(title=f"deepest groups (up to {groups})")
        for column in ("group", "priority", "routing key", "messages", "head"):
            deepest.add_column(column)
        for row in queue["deepest_groups"]:
            cells = (row["group_id"], str(row["priority"]), row["routing_key"] or "-", str(row["messages"]), row["head"])
            deepest.add_row(*map(shown, cells))
        parts.append(deepest)
    return parts


def _flow(flow: dict[str, Any]) -> list[RenderableType]:
    """What holds work back: groups behind a head that waits for its time, and each limited key."""
    from harel_edge.limits import format_period  # noqa: PLC0415

    parts: list[RenderableType] = []
    waiting, due = flow["groups_waiting_for_their_head"], flow["next_due_in_seconds"]
    if waiting:
        parts.append(
            Text(f"held back: {plural(waiting, 'group')} behind a delayed, debounced or parked head (the next due in {due:.1f} s)")
        )
    for limit in flow["limits"]:
        bounds = []
        if limit["concurrency"] is not None:
            bounds.append(f"{limit['in_flight']} of {limit['concurrency']} in flight")
        if limit["rate"] is not None:
            bounds.append(f"{limit['claims_in_period']} of {limit['rate']} claims in {format_period(limit['period'])}")
        held = f", {plural(limit['waiting'], 'group')} waiting for room" if limit["waiting"] else ""
        parts.append(Text(f"limit {shown(limit['key'])}: {', '.join(bounds)}{held}"))
    return parts


def _workers(report: StatusReport, rate: SettledRate | None) -> list[RenderableType]:
    """Each worker's last heartbeat; with --watch, the rate of settled work since the last read."""
    if not report.workers:
        return [Text("workers: none seen (a worker's first heartbeat comes as it starts)")]
    running = sum(w.state == "running" for w in report.workers)
    title = f"workers ({running} running"
    if rate is not None and rate.per_second is not None:
        title += f", {rate.per_second:.1f} settled/s"
    table = Table(title=title + ")")
    columns = ["worker", "state", "seen", "up", "settled"]
    columns += ["settled/s"] if rate is not None else []
    columns += ["window", "latency", "replica lag"]
    for column in columns:
        table.add_column(column)
    for w in report.workers:
        row = [shown(w.worker_id), w.state, f"{w.seen_seconds_ago:.0f} s ago", f"{w.up_seconds:.0f} s", str(w.settled)]
        if rate is not None:
            per = rate.by_worker.get(w.worker_id)
            row.append("-" if per is None else f"{per:.1f}")
        row += [
            "-" if w.in_flight_target is None else str(w.in_flight_target),
            "-" if w.latency is None else f"{w.latency * 1000:.0f} ms",
            "-" if w.replica_lag is None else f"{w.replica_lag:.1f} s",
        ]
        table.add_row(*row)
    return [table]


def _workflows(workflows: dict[str, Any] | None) -> list[RenderableType]:
    if workflows is None:
        return []
    if not workflows["namespaces"]:
        return [Text(f"workflows: none queued ({workflows['finished']} finished, {workflows['claimed']} claimed now)")]
    failing = workflows["failing"]
    table = Table(
        title=f"workflows ({workflows['finished']} finished, {workflows['claimed']} claimed now"
        + (f", {failing} failing: `harel-edge workflows list`" if failing else "")
        + ")"
    )
    for column in ("namespace", "ready", "sleeping", "claimed", "next wake"):
        table.add_column(column)
    for row in workflows["namespaces"]:
        wake = row["next_wake_in_seconds"]
        table.add_row(
            shown(row["namespace"]), str(row["ready"]), str(row["sleeping"]), str(row["claimed"]),
            "-" if wake is None else f"in {wake:.1f} s",
        )
    return [table]


def _counted(line: str, notable: int, hint: str) -> Text:
    """A status line, with the command that shows more when there is something to see."""
    return Text(line + (f" (`harel-edge {hint})" if notable else ""))


TOTALS = ("messages", "queued", "in_flight", "parked", "groups")


def _each_database(settings: Any, as_json: bool) -> None:
    """`status --all`: each database's queue totals and workers, a failed one said, then the sum."""
    from harel_edge.deployment import each_database  # noqa: PLC0415
    from harel_edge.status import collect_status  # noqa: PLC0415

    results = each_database(settings, lambda one: collect_status(one, top=0))
    total = dict.fromkeys(TOTALS, 0)
    for each in results:
        if each.error is None:
            for key in TOTALS:
                total[key] += each.value.queue["totals"][key]
    if as_json:
        print(json.dumps({
            "databases": {e.database: e.value.as_dict() if e.error is None else {"error": e.error} for e in results},
            "total": total,
        }, indent=2, default=str))
    else:
        out.print(_databases_table(results, total))
    if any(each.error is not None for each in results):
        raise typer.Exit(EXIT_PROBLEM)  # each one's error is said beside it


def _databases_table(results: list, total: dict[str, int]) -> Table:
    table = Table(title=f"{plural(len(results), 'database')}")
    for column in ("database", "messages", "queued", "in flight", "parked", "groups", "workers"):
        table.add_column(column, justify="left" if column == "database" else "right")
    for each in results:
        if each.error is not None:
            table.add_row(each.database, f"FAILED: {shown(each.error)}", *[""] * 5)
            continue
        totals = each.value.queue["totals"]
        table.add_row(each.database, *[str(totals[key]) for key in TOTALS], str(len(each.value.workers)))
    table.add_row("total", *[str(total[key]) for key in TOTALS], "")
    return table
