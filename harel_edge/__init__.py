"""harel_edge: harel's durable statecharts and workflows on libSQL/Turso, at the edge. Nothing
reads the environment at import: settings are read by `EdgeSettings.load()` or `from_settings()`."""

from harel_edge.connection import EdgeConnection, connect
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    ForeignDatabaseError,
    HarelEdgeError,
    NotADatabaseError,
    PrimaryUnavailableError,
    SchemaError,
    SchemaTooNewError,
)
from harel_edge.queue import AsyncLibsqlTransport, LibsqlTransport, Message
from harel_edge.schema import SCHEMA_VERSION
from harel_edge.settings import EdgeSettings

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "ForeignDatabaseError",
    "AsyncLibsqlTransport",
    "AuthError",
    "ConfigurationError",
    "EdgeConnection",
    "EdgeSettings",
    "HarelEdgeError",
    "LibsqlTransport",
    "Message",
    "NotADatabaseError",
    "PrimaryUnavailableError",
    "SchemaError",
    "SchemaTooNewError",
    "connect",
]
