"""The `harel-edge` application: its groups, global options, output consoles, and how every
expected failure becomes one line on stderr and an exit code (docs/cli.md)."""


from __future__ import annotations

import functools
import os
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from harel_edge.connection import explain_connect_error
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    DatabaseAccessError,
    ForeignDatabaseError,
    HarelEdgeError,
    NotADatabaseError,
    PrimaryUnavailableError,
    SchemaError,
    tidy,
)
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

HELP_WIDTH = 100
CONTEXT = {
    "help_option_names": ["-h", "--help"],
    "terminal_width": HELP_WIDTH,
    "max_content_width": HELP_WIDTH,
}

app = typer.Typer(
    name="harel-edge",
    help="Run, inspect and repair harel_edge: harel's statecharts and durable workflows on libSQL.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)
config_app = typer.Typer(
    help="Inspect the configuration.", no_args_is_help=True, rich_markup_mode=None, context_settings=CONTEXT
)
app.add_typer(config_app, name="config")
dead_letter_app = typer.Typer(
    help="The messages and workflows that failed too often: list, show, requeue, purge.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings=CONTEXT,
)
app.add_typer(dead_letter_app, name="dead-letter")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# exit codes (docs/cli.md)
EXIT_PROBLEM, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_DATABASE = 1, 2, 3, 4, 5


@dataclass
class Globals:
    overrides: dict[str, Any] = field(default_factory=dict)
    env_file: str | None = None
    log_format: str = "console"
    log_level: str = "warning"

    def settings(self, **more: Any) -> EdgeSettings:
        values = {k: v for k, v in {**self.overrides, **more}.items() if v is not None}
        if self.env_file is not None:
            if not Path(self.env_file).is_file():
                raise ConfigurationError(f"--env-file {self.env_file!r} does not exist")
            values["_env_file"] = self.env_file
        return EdgeSettings.load(**values)


@app.callback()
def main(
    ctx: typer.Context,
    profile: str | None = typer.Option(
        None, "--profile", help="local, sqld or replica (overrides HAREL_EDGE_PROFILE)."
    ),
    db_path: str | None = typer.Option(
        None, "--db-path", help="The database file, or the replica's file (overrides HAREL_EDGE_DB_PATH)."
    ),
    url: str | None = typer.Option(None, "--url", help="The sqld/Turso server (overrides HAREL_EDGE_URL)."),
    sync_url: str | None = typer.Option(
        None, "--sync-url", help="The primary a replica syncs with (overrides HAREL_EDGE_SYNC_URL)."
    ),
    prefix: str | None = typer.Option(None, "--prefix", help="Table prefix (overrides HAREL_EDGE_PREFIX)."),
    env_file: str | None = typer.Option(
        None, "--env-file", help="Read settings from this file instead of ./.env."
    ),
    log_format: str = typer.Option(
        "auto", "--log-format", help="Log lines on stderr: json, console, or auto (json unless a terminal)."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Settings come from HAREL_EDGE_* variables (and .env); these options override them.
    The auth token is only read from HAREL_EDGE_AUTH_TOKEN (or the env file), never from an
    option, so it stays out of shell history and process listings."""
    from harel_edge import observability  # noqa: PLC0415

    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format not in ("json", "console"):
        fail(EXIT_CONFIG, f"--log-format {log_format!r}: use json, console or auto")
    observability.configure_logging(log_format, log_level)  # type: ignore[arg-type]
    ctx.obj = Globals(
        {"profile": profile, "db_path": db_path, "url": url, "sync_url": sync_url, "prefix": prefix},
        env_file,
        log_format,
        log_level,
    )


def plural(count: int, one: str, many: str | None = None) -> str:
    """'1 message', '2 messages'."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


# ---- errors --------------------------------------------------------------------------------------


def fail(code: int, message: str) -> None:
    err.print(f"harel-edge: error: {message}", markup=False)
    raise typer.Exit(code)


def code_for(exc: BaseException) -> int:
    if isinstance(exc, ConfigurationError):
        return EXIT_CONFIG
    if isinstance(exc, PrimaryUnavailableError):
        return EXIT_UNREACHABLE
    if isinstance(exc, AuthError):
        return EXIT_AUTH
    if isinstance(exc, (NotADatabaseError, ForeignDatabaseError, SchemaError, DatabaseAccessError)):
        return EXIT_DATABASE
    return EXIT_PROBLEM


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every expected failure into one line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx: typer.Context | None = kwargs.get("ctx")
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except HarelEdgeError as exc:
            fail(code_for(exc), scrub_text(tidy(str(exc)), ctx))
        except sqlite3.DatabaseError as exc:  # a local file read through the standard library
            fail(
                EXIT_DATABASE,
                f"SQLite could not read the database ({exc}): run `harel-edge doctor` to check it, and "
                "restore it from a backup if it reports damage",
            )
        except ValueError as exc:  # the driver's errors are ValueErrors: explain them
            settings = maybe_settings(ctx)
            explained = explain_connect_error(settings, exc) if settings is not None else exc
            text = tidy(str(explained))
            if isinstance(explained, HarelEdgeError):
                fail(code_for(explained), scrub_text(text, ctx))
            fail(EXIT_PROBLEM, scrub_text(text, ctx))

    return wrapper


def maybe_settings(ctx: typer.Context | None) -> EdgeSettings | None:
    try:
        return ctx.obj.settings() if ctx is not None and ctx.obj is not None else None
    except Exception:  # noqa: BLE001 - only used to explain another error
        return None


def scrub_text(text: str, ctx: typer.Context | None) -> str:
    """The shared scrubber, also given the token of settings that failed to load."""
    settings = maybe_settings(ctx)
    return scrub(
        text,
        os.environ.get("HAREL_EDGE_AUTH_TOKEN", "").strip(),
        os.environ.get("HAREL_LIBSQL_AUTH_TOKEN", "").strip(),
        settings.auth_token if settings is not None else None,
    )
