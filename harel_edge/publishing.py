"""Publishing one event from outside a worker, and creating the statechart execution it starts:
the request is checked before anything is opened, and written through `access.open_for_writing`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge.access import check_writable
from harel_edge.errors import ConfigurationError
from harel_edge.queue import LibsqlTransport, Message
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
    create: str | None = None  # a statechart's name: create execution `group` of it first


@dataclass(frozen=True)
class Published:
    """What was published: the event as stored, its group, priority and routing key."""

    group: str
    priority: int
    routing_key: str | None
    event: dict[str, Any]  # the event as JSON

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
) -> PublishRequest:
    """Check a request as given on the command line (`data` is JSON text); raises ConfigurationError."""
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
    return PublishRequest(group, kind, payload, priority, routing_key, event_id, create)


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
        transport.publish_many([Message(request.group, event, request.priority, request.routing_key)])
    return Published(request.group, request.priority, request.routing_key, event.model_dump(mode="json"))


def create_execution(store: EdgeStore, execution_id: str, machine: str, priority: int) -> None:
    """A PENDING execution for the worker to start when it claims the Start (harel's own
    `create(start_on_create=False)`); an existing one is left as it is."""
    if store.load(execution_id) is None:
        store.save(Execution(id=execution_id, definition_id=machine, priority=priority))

