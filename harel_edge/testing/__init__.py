"""Test helpers for harel_edge and its users: a real sqld to test against, and its keys.

Importing it imports no Docker; the pytest plugin is `harel_edge.testing.fixtures` (docs/testing.md).
"""

from harel_edge.testing.auth import SqldKeys, generate_keys, load_keys, make_token
from harel_edge.testing.sqld import (
    DEFAULT_IMAGE,
    SqldServer,
    SqldStartError,
    SqldUnavailable,
    backend_unavailable_reason,
    choose_backend,
    find_sqld_binary,
    sqld_image,
    start_sqld_primary,
    start_sqld_replica_node,
    wait_until,
)

__all__ = [
    "DEFAULT_IMAGE",
    "SqldKeys",
    "SqldServer",
    "SqldStartError",
    "SqldUnavailable",
    "backend_unavailable_reason",
    "choose_backend",
    "find_sqld_binary",
    "generate_keys",
    "load_keys",
    "make_token",
    "sqld_image",
    "start_sqld_primary",
    "start_sqld_replica_node",
    "wait_until",
]
