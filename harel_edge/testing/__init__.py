"""Test helpers for harel_edge and its users: a real sqld to test against, and its keys.

Importing it imports no Docker; the pytest plugin is `harel_edge.testing.fixtures` (docs/testing.md).
"""

from harel_edge.testing import sqld
from harel_edge.testing.auth import SqldKeys, generate_keys, load_keys, make_token
from harel_edge.testing.sqld import *  # noqa: F403 - its public names are this package's too

__all__ = [*sqld.__all__, "SqldKeys", "generate_keys", "load_keys", "make_token"]
