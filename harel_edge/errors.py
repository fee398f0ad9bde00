"""The errors harel_edge raises on purpose: each says what went wrong and what to do next,
for the operator reading a worker's log, and none ever includes a secret.
"""

from __future__ import annotations

from harel_edge.redaction import scrub


class HarelEdgeError(Exception):
    """Base of every error harel_edge raises deliberately; its text is scrubbed of secrets as it
    is made, whatever the driver or the primary put in it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))


class ConfigurationError(HarelEdgeError, ValueError):
    """A setting is missing, malformed or contradicts another one.

    Raised when the settings are read, so a badly configured worker does not start at all.
    """


class NotFoundError(HarelEdgeError, LookupError):
    """What a command names is not there (an execution, a workflow): the message says where to look."""


class SchemaError(HarelEdgeError):
    """The database's schema is not one this version can use."""


class SchemaTooNewError(SchemaError):
    """The database was written by a newer harel_edge: refusing to touch it protects its data."""


class NotADatabaseError(HarelEdgeError):
    """The file is not a SQLite/libSQL database (corrupt, encrypted, or some other file)."""


class ForeignDatabaseError(NotADatabaseError):
    """The database holds another application's tables and none of harel_edge's (not one of
    ours: a `NotADatabaseError` to code that catches that)."""


class DamagedDatabaseError(NotADatabaseError):
    """SQLite opens the file, but its integrity check finds damaged pages (`problems`)."""

    def __init__(self, message: str, problems: str = "") -> None:
        super().__init__(message)
        self.problems = problems


class DatabaseAccessError(HarelEdgeError):
    """This user may not write the database file, the files SQLite keeps beside it, or the
    directory they live in (or may not read it at all): a matter of permissions, not of data."""


class PrimaryUnavailableError(HarelEdgeError):
    """The primary could not be reached, even after the retry policy's attempts."""


class AuthError(HarelEdgeError):
    """The primary refused the token: missing, invalid, expired, or read-only for a write."""


def tidy(text: str) -> str:
    """A driver message without the gRPC metadata dump a replica's errors carry."""
    for marker in (", details: [", " details: [", ", metadata: MetadataMap"):
        cut = text.find(marker)
        if cut != -1:
            text = text[:cut] + "`"
    return text
