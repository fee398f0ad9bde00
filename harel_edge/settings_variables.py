"""The HAREL_EDGE_* variables around EdgeSettings: each setting's variable name, the variables read
elsewhere or retired, and the one-line warnings and errors that name them."""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# The warnings are about the settings, so they keep the settings' logger name.
log = logging.getLogger("harel_edge.settings")

ENV_PREFIX = "HAREL_EDGE_"

# HAREL_EDGE_* variables that are not settings but are read elsewhere: the test fixtures' sqld
# (harel_edge.testing), compose's scripts.
OTHER_VARIABLES = frozenset(
    {
        "HAREL_EDGE_SQLD_BACKEND",
        "HAREL_EDGE_SQLD_BINARY",
        "HAREL_EDGE_REQUIRE_SQLD",
        "HAREL_EDGE_KEYS_DIR",
        "HAREL_EDGE_WORKERS",
        "HAREL_EDGE_WORKER_IMAGE",
    }
)

# Variables earlier releases read, and why nothing reads them now.
RETIRED_VARIABLES = {
    "HAREL_EDGE_ASYNC_PROCESSES": "the durable stores speak Hrana from the event loop and start no process; remove it",
}

_warned: set[str] = set()  # the unknown variables already warned about in this process


def variable_for(field: str) -> str:
    """The variable a user sets for `field`, as error messages name it."""
    return f"{ENV_PREFIX}{field.upper()}"


def known_variables(fields: Iterable[str]) -> frozenset[str]:
    """Every HAREL_EDGE_* variable harel_edge reads: one for each of the settings' `fields`, and the others'."""
    return frozenset(variable_for(name) for name in fields) | OTHER_VARIABLES


def unknown_variables(names: Iterable[str], fields: Iterable[str]) -> list[tuple[str, str | None]]:
    """The HAREL_EDGE_* names among `names` that nothing reads, each with the known variable it
    most resembles (None when none is close). Matched without regard to case, as settings are."""
    known = known_variables(fields)
    suffixes = {name.removeprefix(ENV_PREFIX): name for name in known}
    found = []
    for name in names:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        guess = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), sorted(suffixes), n=1, cutoff=0.6)
        found.append((name, suffixes[guess[0]] if guess else None))
    return found


def warn_unknown_variables(fields: Iterable[str], env_files: Any = None) -> None:
    """Log a warning for each unknown HAREL_EDGE_* variable in the environment and the env
    file(s), once a process. Only names are logged, never a value (it may be a token)."""
    fields = tuple(fields)
    sources: list[tuple[str, Iterable[str]]] = [("", os.environ)]
    if isinstance(env_files, (str, os.PathLike)):
        env_files = [env_files]
    for env_file in env_files or ():
        if Path(env_file).is_file():
            from dotenv import dotenv_values  # noqa: PLC0415 - pydantic-settings' own dependency

            sources.append((f" (in {env_file})", dotenv_values(env_file).keys()))
    for where, names in sources:
        for name, guess in unknown_variables(names, fields):
            if name.upper() in _warned:
                continue
            _warned.add(name.upper())
            if name.upper() in RETIRED_VARIABLES:
                log.warning("%s%s is no longer used and is ignored: %s", name, where, RETIRED_VARIABLES[name.upper()])
                continue
            hint = f": did you mean {guess}?" if guess else " (`harel-edge config show` lists the settings)"
            log.warning("%s%s is not a harel_edge setting and is ignored%s", name, where, hint)


def explain(exc: ValidationError) -> str:
    """One line per problem, each naming the variable, without echoing secrets."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        field = next((str(part) for part in error.get("loc", ()) if isinstance(part, str)), "")
        if field and "HAREL_" not in message:
            variable = variable_for(field) if not field.startswith("HAREL_") else field
            message = f"{variable}: {message}"
        lines.append(message)
    return "invalid configuration: " + "; ".join(lines)


def setting_sources(fields: dict[str, Any], given: Iterable[str], env_files: Any = None) -> dict[str, str]:
    """Where each setting's value came from, by the precedence the settings apply: a global
    option (`given`), the environment, an env file, else its default. `fields` are the settings'
    model fields, whose aliases (harel's `HAREL_LIBSQL_*`) count as their variables."""
    given = set(given)
    environment = {name.upper() for name in os.environ}
    files: list[tuple[str, set[str]]] = []
    if isinstance(env_files, (str, os.PathLike)):
        env_files = [env_files]
    for env_file in env_files or ():
        if Path(env_file).is_file():
            from dotenv import dotenv_values  # noqa: PLC0415 - pydantic-settings' own dependency

            files.append((str(env_file), {name.upper() for name in dotenv_values(env_file)}))
    sources = {}
    for name, info in fields.items():
        alias = getattr(info, "validation_alias", None)
        names = [variable_for(name), *(c for c in getattr(alias, "choices", ()) if c.upper().startswith("HAREL_"))]
        names = list(dict.fromkeys(n.upper() for n in names))
        if name in given:
            sources[name] = "option"
        elif found := next((n for n in names if n in environment), None):
            sources[name] = f"environment ({found})"
        elif found := next(((path, n) for path, keys in files for n in names if n in keys), None):
            sources[name] = f"{found[0]} ({found[1]})"
        else:
            sources[name] = "default"
    return sources
