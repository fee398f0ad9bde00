"""One scrubber for every text that leaves the process: error messages and log lines alike.

It removes the tokens this process was given and anything shaped like a credential (a `Bearer`
value, an `Authorization` header's value, a JWT, an `authToken=` parameter), whatever the text.
Imports nothing of harel_edge, so every module may use it.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "**********"
_SHORTEST = 4  # shorter "secrets" would blank out ordinary words; no real token is that short
_known: set[str] = set()

_VALUE = r"[^\s\"',;&)\]}]+"
_HEADER = re.compile(rf"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token)\s+)?{_VALUE}")
_BEARER = re.compile(rf"(?i)\b(bearer\s+){_VALUE}")
_QUERY = re.compile(rf"(?i)\b(auth_?token=){_VALUE}")
_JWT = re.compile(r"\beyJ[\w-]{4,}\.[\w-]{4,}(?:\.[\w-]*)?")


def remember(secret: str | None) -> None:
    """Scrub `secret` from every text from now on (settings call it for their token)."""
    if secret and len(secret) >= _SHORTEST:
        _known.add(secret)


def scrub(text: str, *secrets: Any) -> str:
    """`text` without any secret: the ones given (str or SecretStr), the ones remembered, and
    every credential-shaped value. Scrub before cutting a text short, so no piece of one is left."""
    given = {_plain(s) for s in secrets} | _known
    for secret in sorted((s for s in given if s and len(s) >= _SHORTEST), key=len, reverse=True):
        text = text.replace(secret, MARK)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{MARK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{MARK}", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}{MARK}", text)
    return _JWT.sub(MARK, text)


def scrub_value(value: Any) -> Any:
    """`scrub` applied to every text inside a log field (dicts, lists and tuples too)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub_value(v) for v in value)
    if isinstance(value, BaseException):
        return scrub(f"{type(value).__name__}: {value}")
    return value


def scrub_event(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: every field of every log line scrubbed (tracebacks included when
    it runs after `format_exc_info`)."""
    return {key: scrub_value(value) for key, value in event.items()}


def _plain(secret: Any) -> str | None:
    if secret is None:
        return None
    reveal = getattr(secret, "get_secret_value", None)
    return reveal() if callable(reveal) else str(secret)
