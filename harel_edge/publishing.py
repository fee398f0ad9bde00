"""Publishing one event from outside a worker, and creating the statechart execution it starts:
the request is checked before anything is opened, and written through `access.open_for_writing`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harel.definition.events import ContextError, check_context, with_defaults
from harel.definition.model import Definition
from harel.engine.execution import Execution, stamp
from harel.spec.states import Event
from pydantic_core import PydanticSerializationError

from harel_edge.access import check_writable
from harel_edge.errors import ConfigurationError
from harel_edge.inspection import raise_missing
from harel_edge.queue import LibsqlTransport, Message
from harel_edge.queue.messages import BATCH_ROWS, message_row
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
    hold: dict[str, Any] = field(default_factory=dict)  # `Message`'s flow-control fields: delay, at, limit_key, ...

    def message(self, event: Event) -> Message:
        return Message(self.group, event, self.priority, self.routing_key, **self.hold)


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
    hold: dict[str, Any] | None = None,
) -> PublishRequest:
    """Check a request as given on the command line (`data` is JSON text); raises ConfigurationError.

    `create` names a machine of the `.stm` files in `definitions`, whose context `data` must
    complete; `hold` holds `Message`'s flow-control fields (delay, at, limit_key, debounce, ...)."""
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
    request = PublishRequest(group, kind, payload, priority, routing_key, event_id, machine, _held(hold or {}))
    problem = _flow_problem(request)
    if problem:
        raise ConfigurationError(problem)
    return request


def _held(hold: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in hold.items() if value is not None}


def _flow_problem(request: PublishRequest) -> str | None:
    """Why the queue would refuse the request's flow-control fields (delay and at, or debounce
    with either, a negative delay...), checked before anything is sent; None if it would not."""
    try:
        message_row(request.message(Event(kind=request.kind, data=request.data)))  # its data serialised too
    except PydanticSerializationError as exc:
        return f"its data cannot be stored as JSON ({str(exc).splitlines()[0]}): nested too deep?"
    except (TypeError, ValueError) as exc:
        return str(exc).splitlines()[0]
    except RecursionError:
        return "its data is nested too deep to store"
    return None


def _machine(name: str, definitions: str | None, data: dict[str, Any]) -> Definition:
    """The machine `name`, checked as harel's own `create` and `start(data)` check it."""
    if definitions is None:
        raise ConfigurationError(
            f"--create {name} needs the machine's definition (its context defaults and required "
            "fields): add --definitions DIR, the directory of .stm files the workers run"
        )
    from harel_edge.worker import load_definitions  # noqa: PLC0415 - imports harel's DSL parser

    return _checked_machine(load_definitions(definitions), name, definitions, data, flag="--create ")


def _checked_machine(
    machines: dict[str, Definition], name: str, definitions: str, data: dict[str, Any], *, flag: str = ""
) -> Definition:
    if name not in machines:
        raise ConfigurationError(
            f"{flag}{name}: no machine of that name in {definitions} (it has {', '.join(sorted(machines))})"
        )
    machine = machines[name]
    try:
        check_context(machine.context_schema, {**with_defaults(machine.context_schema, {}), **data})
    except ContextError as exc:
        raise ConfigurationError(f"{'--data' if flag else 'data'} does not start machine {name}: {exc}") from None
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
    check_publishable(settings)
    with LibsqlTransport(settings=settings) as transport:
        if request.create is not None:
            with EdgeStore(settings) as store:
                create_execution(store, request.group, request.create, request.priority)
        duplicate = transport.publish_many([request.message(event)]) == 0
    return Published(request.group, request.priority, request.routing_key, event.model_dump(mode="json"), duplicate)


def check_publishable(settings: EdgeSettings) -> None:
    """`check_writable`, and on the local profile a file that exists: a publish to a path with a
    typo must not create a database no worker reads (`harel-edge migrate` creates one)."""
    if not settings.has_primary and not Path(settings.db_path).exists():
        raise_missing(settings.db_path)
    check_writable(settings)


def create_execution(store: EdgeStore, execution_id: str, machine: Definition, priority: int) -> bool:
    """A PENDING execution for the worker to start when it claims the Start, made as harel's own
    `create(start_on_create=False)` makes it (context defaults, stamps); an existing one is left.
    True if it was created."""
    if store.load(execution_id) is not None:
        return False
    context = with_defaults(machine.context_schema, {})
    execution = Execution(id=execution_id, definition_id=machine.id, priority=priority, context=context)
    stamp(execution, time.time())
    store.save(execution)
    return True



# ---- many events: `publish --from FILE` ----------------------------------------------------------

FLOW_FIELDS = ("limit_key", "delay", "at", "debounce", "debounce_key", "max_wait")
LINE_FIELDS = ("group", "kind", "data", "priority", "routing_key", "id", "create", *FLOW_FIELDS)


@dataclass(frozen=True)
class BulkPublished:
    """What `publish_bulk` sent: the lines read, how many of them it queued (the others' ids were
    there already), the batches (one unit of work each), the executions it created."""

    events: int
    queued: int
    batches: int
    created: int = 0

    @property
    def already_queued(self) -> int:
        return self.events - self.queued

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events, "queued": self.queued, "already_queued": self.already_queued,
            "batches": self.batches, "created": self.created,
        }  # fmt: skip


def read_lines(lines: Iterable[str], source: str, *, definitions: str | None = None) -> list[PublishRequest]:
    """Every event of an NDJSON text, one JSON object a line (blank lines skipped), checked in
    full before anything is sent: the first bad line raises ConfigurationError with its number.

    Each object has "group" and "kind", and may have "data" (an object), "priority" (0 to 4),
    "routing_key", "id" (the dedupe key: give one to make a second run safe), "create" (a
    machine of `definitions`: a Start that creates execution `group` first), and the
    flow-control fields of `Message` ("delay", "at", "limit_key", "debounce", "debounce_key",
    "max_wait": docs/flow-control.md)."""
    machines: dict[str, Definition] | None = None
    requests: list[PublishRequest] = []
    for number, line in _numbered(lines, source):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            item = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{where}: not JSON ({exc.msg} at character {exc.pos}); nothing was sent") from None
        except RecursionError:
            raise ConfigurationError(f"{where}: nested too deep to read; nothing was sent") from None
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {exc}; nothing was sent") from None
        if not isinstance(item, dict):
            raise ConfigurationError(f'{where}: a line must be a JSON object, e.g. {{"group": "order-1", "kind": "Pay"}}; nothing was sent')
        unknown = sorted(set(item) - set(LINE_FIELDS))
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown field {', '.join(map(repr, unknown))} (a line may have {', '.join(LINE_FIELDS)}); nothing was sent"
            )
        problem = _line_problem(item)
        if problem:
            raise ConfigurationError(f"{where}: {problem}; nothing was sent")
        data = item.get("data") or {}
        machine = None
        if item.get("create") is not None:
            if item["kind"] != "Start":
                raise ConfigurationError(f"{where}: \"create\" starts an execution: kind must be Start; nothing was sent")
            if definitions is None:
                raise ConfigurationError(
                    f"{where}: \"create\" needs the machines' definitions: add --definitions DIR; nothing was sent"
                )
            if machines is None:
                from harel_edge.worker import load_definitions  # noqa: PLC0415 - imports harel's DSL parser

                machines = load_definitions(definitions)
            try:
                machine = _checked_machine(machines, item["create"], definitions, data)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}: {exc}; nothing was sent") from None
        request = PublishRequest(
            item["group"],
            item["kind"],
            data,
            int(item.get("priority") or 0),
            item.get("routing_key"),
            item.get("id"),
            machine,
            _held({name: item.get(name) for name in FLOW_FIELDS}),
        )
        problem = _flow_problem(request)
        if problem:
            raise ConfigurationError(f"{where}: {problem}; nothing was sent")
        requests.append(request)
    if not requests:
        raise ConfigurationError(f"{source} holds no event (one JSON object a line); nothing was sent")
    return requests


def _numbered(lines: Iterable[str], source: str) -> Iterable[tuple[int, str]]:
    """The lines with their numbers; text that is not UTF-8 is refused naming its line."""
    iterator, number = iter(lines), 0
    while True:
        number += 1
        try:
            line = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise ConfigurationError(f"{source}, line {number}: not UTF-8 text; nothing was sent") from None
        yield number, line


def utf8_lines(binary: Iterable[bytes]) -> Iterable[str]:
    """A binary file's lines decoded one by one, so that text which is not UTF-8 is found on its line."""
    for raw in binary:
        yield raw.decode("utf-8")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON can hold (it would be stored as null): give a finite number")


def _line_problem(item: dict[str, Any]) -> str | None:
    for name in ("group", "kind"):
        if not isinstance(item.get(name), str) or not item[name]:
            return f'"{name}" must be a non-empty string'
    if item.get("data") is not None and not isinstance(item["data"], dict):
        return '"data" must be a JSON object'
    priority = item.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 4):
        return '"priority" must be an integer from 0 to 4'
    for name in ("routing_key", "id", "create", "limit_key", "debounce_key"):
        if item.get(name) is not None and (not isinstance(item[name], str) or not item[name]):
            return f'"{name}" must be a non-empty string (or absent)'
    return None


def publish_bulk(
    settings: EdgeSettings,
    requests: Sequence[PublishRequest],
    *,
    on_batch: Callable[[int], None] | None = None,
) -> BulkPublished:
    """Publish `requests` in order, BATCH_ROWS to a unit of work (one statement; one Hrana
    request on a remote primary), after `check_writable`. An event id its group had within
    HAREL_EDGE_PUBLISH_WINDOW is not queued again, so a run that failed half-way can be run
    again as it is, if every line has an id. `on_batch(n)` is told after each batch lands."""
    now = datetime.now(UTC)
    messages = [
        r.message(Event(kind=r.kind, data=r.data, created_time=now, **({"id": r.event_id} if r.event_id else {})))
        for r in requests
    ]
    check_publishable(settings)
    created = batches = queued = 0
    with LibsqlTransport(settings=settings) as transport:
        starting = [r for r in requests if r.create is not None]
        if starting:
            with EdgeStore(settings) as store:
                for r in starting:
                    created += create_execution(store, r.group, r.create, r.priority)  # type: ignore[arg-type]
        for i in range(0, len(messages), BATCH_ROWS):
            chunk = messages[i : i + BATCH_ROWS]
            queued += transport.publish_many(chunk)
            batches += 1
            if on_batch is not None:
                on_batch(len(chunk))
    return BulkPublished(len(messages), queued, batches, created)
