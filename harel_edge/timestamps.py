"""The one way a stored time (unix seconds, by the database's clock) is shown to a person."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def utc_text(value: Any) -> str:
    """An epoch time as UTC ISO 8601 to the second; '-' when there is none."""
    if value is None:
        return "-"
    try:
        return datetime.fromtimestamp(float(value), UTC).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError):
        return str(value)
