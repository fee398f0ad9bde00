"""The queue: harel's per-group transport with leases, round-robin, a priority floor, routing
keys and dead letters, written once (async) with a sync face."""

from harel_edge.queue.core import EventTransport
from harel_edge.queue.faces import AsyncLibsqlTransport, LibsqlTransport
from harel_edge.queue.messages import Message

__all__ = ["AsyncLibsqlTransport", "EventTransport", "LibsqlTransport", "Message"]
