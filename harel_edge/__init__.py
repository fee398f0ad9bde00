"""harel_edge: harel's durable statecharts and workflows on libSQL/Turso, at the edge. Nothing
reads the environment at import: settings are read by `EdgeSettings.load()` or `from_settings()`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from harel_edge.connection import EdgeConnection, connect
    from harel_edge.migrations import SCHEMA_VERSION
    from harel_edge.queue import AsyncLibsqlTransport, LibsqlTransport, Message
    from harel_edge.settings import EdgeSettings

__version__ = "0.1.0"

# Loaded on first use (PEP 562): they pull in libsql, harel and pydantic, which `harel-edge
# --version` and most commands' early refusals do not need.
_LAZY = {
    "EdgeConnection": "harel_edge.connection",
    "connect": "harel_edge.connection",
    "AsyncLibsqlTransport": "harel_edge.queue",
    "LibsqlTransport": "harel_edge.queue",
    "Message": "harel_edge.queue",
    "SCHEMA_VERSION": "harel_edge.migrations",
    "EdgeSettings": "harel_edge.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
