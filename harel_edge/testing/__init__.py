"""Test helpers for harel_edge and its users: a real sqld to test against, and its keys.

Why a public package: code built on harel_edge has to be tested against a real sqld
(a primary, a replica node, an embedded replica synced with it), with authentication on,
and with the primary killed, paused or restarted. These helpers start one in Docker or
from the binary and hand back a :class:`SqldServer`. The pytest fixtures live in
``harel_edge.testing.fixtures`` (a pytest plugin).

Importing this package does not import Docker or testcontainers; the Docker backend
imports them when it starts a container.
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
