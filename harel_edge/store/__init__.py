"""harel's execution store on libSQL: the async core and its sync face."""

from harel_edge.store.core import EventStore
from harel_edge.store.face import EdgeStore

__all__ = ["EdgeStore", "EventStore"]
