"""Publishing one event from outside a worker, and creating the statechart execution it starts:
the request is checked before anything is opened, and written through `access.open_for_writing`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from harel.definition.events import ContextError, check_context, with_defaults
from harel.definition.model import Definition
from harel.engine.execution import Execution, stamp
from harel.spec.states import Event

from harel_edge.access import check_writable
from harel_edge.errors import ConfigurationError
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.schema import EdgeNames
from harel_edge.settings import EdgeSettings
from harel_edge.store import EdgeStore


@dataclass(frozen=True)
class PublishRequest:
    """An event to publish, checked: a group, a kind and a JSON object as its data."""

    group: str
    kind: str
    data: dict[str, Any]
    priority: int = 0
    routing_key: str | None = None
    event_id: str | None = None
    create: Definition | None = None  # create execution `group` of this statechart first


@dataclass(frozen=True)
class Published:
    """What was published: the event as stored, its group, priority and routing key."""

    group: str
    priority: int
    routing_key: str | None
    event: dict[str, Any]  # the event as JSON
    duplicate: bool = False  # the group had this event id within the publish window: nothing queued

    @property
    def kind(self) -> str:
        return self.event["kind"]

    @property
    def event_id(self) -> str:
        return self.event["id"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "priority": self.priority,
            "routing_key": self.routing_key,
            "event": self.event,
            "duplicate": self.duplicate,
        }


def publish_request(
    group: str,
    kind: str,
    data: str = "{}",
    *,
    priority: int = 0,
    routing_key: str | None = None,
    event_id: str | None = None,
    create: str | None = None,
    definitions: str | None = None,
) -> PublishRequest:
    """Check a request as given on the command line (`data` is JSON text); raises ConfigurationError.

    `create` names a machine of the `.stm` files in `definitions`, whose context `data` must complete."""
    try:
        payload = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"--data is not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(payload, dict):
        raise ConfigurationError("--data must be a JSON object, e.g. '{\"amount\": 12.5}'")
    if not group:
        raise ConfigurationError("GROUP must not be empty")
    if create is not None and kind != "Start":
        raise ConfigurationError(f"--create starts an execution: KIND must be Start, not {kind!r}")
    machine = None if create is None else _machine(create, definitions, payload)
    return PublishRequest(group, kind, payload, priority, routing_key, event_id, machine)


def _machine(name: str, definitions: str | None, data: dict[str, Any]) -> Definition:
    """The machine `name`, checked as harel's own `create` and `start(data)` check it."""
    if definitions is None:
        raise ConfigurationError(
            f"--create {name} needs the machine's definition (its context defaults and required "
            "fields): add --definitions DIR, the directory of .stm files the workers run"
        )
    from harel_edge.worker import load_definitions  # noqa: PLC0415 - imports harel's DSL parser

    machines = load_definitions(definitions)
    if name not in machines:
        raise ConfigurationError(
            f"--create {name}: no machine of that name in {definitions} (it has {', '.join(sorted(machines))})"
        )
    machine = machines[name]
    try:
        check_context(machine.context_schema, {**with_defaults(machine.context_schema, {}), **data})
    except ContextError as exc:
        raise ConfigurationError(f"--data does not start machine {name}: {exc}") from None
    return machine


def publish(settings: EdgeSettings, request: PublishRequest) -> Published:
    """Append the event to its group's queue (creating the schema on a new database, and with
    `create` the PENDING execution first), after `check_writable`."""
    event = Event(
        kind=request.kind,
        data=request.data,
        created_time=datetime.now(UTC),
        **({"id": request.event_id} if request.event_id else {}),
    )
    check_writable(settings)
    with LibsqlTransport(settings=settings) as transport:
        if request.create is not None:
            with EdgeStore(settings) as store:
                create_execution(store, request.group, request.create, request.priority)
        before = _record(transport, settings, request) if request.event_id else None
        transport.publish_many([Message(request.group, event, request.priority, request.routing_key)])
        duplicate = before is not None and _record(transport, settings, request) == before
    return Published(request.group, request.priority, request.routing_key, event.model_dump(mode="json"), duplicate)


def _record(transport: LibsqlTransport, settings: EdgeSettings, request: PublishRequest) -> tuple | None:
    """What the queue remembers of (group, event id): a publish that queues it writes a new
    record, one it skips as a duplicate leaves the old one as it was."""
    table = EdgeNames(settings.prefix).published
    rows = transport.execute(
        f"SELECT published_at, batch FROM {table} WHERE group_id = ? AND event_id = ?", (request.group, request.event_id)
    )
    return tuple(rows[0]) if rows else None


def create_execution(store: EdgeStore, execution_id: str, machine: Definition, priority: int) -> None:
    """A PENDING execution for the worker to start when it claims the Start, made as harel's own
    `create(start_on_create=False)` makes it (context defaults, stamps); an existing one is left."""
    if store.load(execution_id) is None:
        context = with_defaults(machine.context_schema, {})
        execution = Execution(id=execution_id, definition_id=machine.id, priority=priority, context=context)
        stamp(execution, time.time())
        store.save(execution)

