"""The values the durable stores hand out and take back, and their defaults.

Frozen dataclasses with aware datetimes and timedeltas (why: docs/durable-design.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, Protocol, TypeVar

from harel_edge.errors import HarelEdgeError

# How long a delivery stays invisible to other workers after `next_ready` hands it out. A pass
# that runs longer keeps it with `extend`; a worker that dies gives it back when this runs out.
LEASE = timedelta(seconds=30)
# How often `next_ready` looks at the table when nothing told it something became ready. It is
# the floor under how soon work started by another process is noticed.
POLL = timedelta(seconds=1)

# Keys under which `append` files inbox entries. Reserved: a step must not be named like this.
INBOX = "inbox/"

Encoded = TypeVar("Encoded")


class FencedError(HarelEdgeError):
    """The pass no longer holds its workflow: another pass claimed it, or it was released.

    Raised instead of writing, so the pass should stop; the workflow carries on in its new holder.
    """


class DatabaseClosedError(HarelEdgeError):
    """The durable Database was closed; open a new one with `harel_edge.durable.connect`."""


@dataclass(frozen=True)
class Pass:
    """The right to write a workflow's records, granted by `claim`, fenced by `token`.

    `held_until` is the claim's budget; `alive_for` how long one sign of life keeps it from lapsing.
    """

    workflow: str
    token: int
    held_until: datetime
    alive_for: timedelta


@dataclass(frozen=True)
class Delivery:
    """One workflow handed to one worker by the scheduler.

    `receipt` (the visibility written) and `generation` must both still match for a later write to apply.
    """

    workflow: str
    receipt: float
    generation: int

    @property
    def visible_at(self) -> datetime:
        """The receipt as a time: when the workflow becomes visible again if nothing is done."""
        return from_seconds(self.receipt)


@dataclass(frozen=True)
class Recorded:
    """What `record` left in the store: the value a later pass will read, and whether this write made it
    (`fresh`), since the first write of a key wins.
    """

    key: str
    value: object
    written_at: datetime
    fresh: bool


@dataclass(frozen=True)
class Written:
    """A stored record together with the moment it was written."""

    value: object
    written_at: datetime


@dataclass(frozen=True)
class Entry:
    """A message filed in a workflow's inbox, under the key it was given."""

    key: str
    value: object


class CheckpointCodec(Protocol, Generic[Encoded]):
    """How a step's result becomes the TEXT of a row, and back.

    `decode(encode(v))` must be what a resumed pass should see: it sees nothing else.
    """

    def encode(self, value: object) -> Encoded: ...

    def decode(self, stored: Encoded) -> object: ...


@dataclass(frozen=True)
class JsonCodec:
    """The default codec: the stdlib's JSON, compact, keys in their given order."""

    def encode(self, value: object) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def decode(self, stored: str) -> object:
        return json.loads(stored)


JSON: CheckpointCodec[str] = JsonCodec()


def now_utc() -> datetime:
    """This machine's clock, timezone-aware."""
    return datetime.now(UTC)


def to_seconds(when: datetime) -> float:
    """A datetime as stored. A naive datetime is refused: its meaning depends on the machine."""
    if when.tzinfo is None:
        raise ValueError(f"{when!r} has no timezone: pass an aware datetime, e.g. datetime.now(UTC)")
    return when.timestamp()


def from_seconds(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# ---- what a pass came to -------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """The function returned; `value` is its result as recorded (and as every later pass sees it)."""

    value: object


@dataclass(frozen=True)
class Sleeping:
    """The function is waiting for `until`."""

    until: datetime


@dataclass(frozen=True)
class Waiting:
    """The function is waiting for a message: under `key`, or the next inbox entry (None)."""

    key: str | None


@dataclass(frozen=True)
class Busy:
    """Another pass holds the workflow; nothing was run."""


@dataclass(frozen=True)
class Lost:
    """This pass lost its claim part way and stopped before its next write."""


@dataclass(frozen=True)
class Cancelled:
    """The workflow is cancelled (`harel-edge workflows cancel`): no pass runs until it is resumed."""


Outcome = Finished | Sleeping | Waiting | Busy | Lost | Cancelled
