"""Which of many databases a setting addresses (a sqld namespace, a Turso database, a file a
tenant): their names, `{database}` in an address, and the header that picks a sqld namespace."""

from __future__ import annotations

import base64
import re
from pathlib import Path

TEMPLATE = "{database}"
# A DNS label's characters (a name may become a host name's first label or a file's name), lower case.
NAME = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?")
# sqld picks the namespace of a request by this header before its host name (docs/deploy.md): gRPC
# binary metadata, so standard base64 without padding.
NAMESPACE_HEADER = "x-namespace-bin"


def check_name(variable: str, name: str) -> str:
    """`name` when a database may be called so, else a refusal naming `variable`."""
    if not NAME.fullmatch(name):
        raise ValueError(
            f"{variable}={name!r} is not a database name: use 1 to 63 lower-case letters, digits, '-' or '_', "
            "starting and ending with a letter or digit (it may become a host name or a file name)"
        )
    return name


def split_names(variable: str, value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Comma-separated names, each checked, in order, none twice."""
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else [str(n).strip() for n in value]
    names = [name for name in names if name]
    for name in names:
        check_name(variable, name)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{variable} names {', '.join(twice)} more than once: name each database once")
    return tuple(names)


def render(value: str, name: str) -> str:
    """`value` with its `{database}` filled in."""
    return value.replace(TEMPLATE, name)


def namespace_header(name: str) -> dict[str, str]:
    """The header that sends a Hrana request to sqld's namespace `name` (base64, no padding)."""
    return {NAMESPACE_HEADER: base64.b64encode(name.encode()).decode().rstrip("=")}


def read_names_file(path: str) -> tuple[str, ...]:
    """The names a databases file holds, one a line (blank lines and `#` comments left out)."""
    variable = "HAREL_EDGE_DATABASES_FILE"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{variable}={path!r} cannot be read ({exc}): give a text file, one database name a line") from None
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return split_names(f"{variable} ({path})", [line for line in lines if line])
