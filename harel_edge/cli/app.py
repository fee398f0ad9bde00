"""The `harel-edge` application: its groups, global options, output consoles, and how every
expected failure becomes one line on stderr and an exit code (docs/cli.md)."""


from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

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

if TYPE_CHECKING:
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


def command_group(help_text: str) -> typer.Typer:
    """A group of subcommands (`harel-edge GROUP ...`), shaped like the top level."""
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None, context_settings=CONTEXT)


config_app = command_group("Inspect the configuration.")
app.add_typer(config_app, name="config")
dead_letter_app = command_group("The messages and workflows that failed too often: list, show, requeue, purge.")
app.add_typer(dead_letter_app, name="dead-letter")
executions_app = command_group(
    "The statechart executions: list, show, and suspend, resume, cancel, terminate or retry one."
)
app.add_typer(executions_app, name="executions")
workflows_app = command_group(
    "The durable workflows: list them, show one (state, recorded steps, last error), cancel, resume, fork."
)
app.add_typer(workflows_app, name="workflows")

def console(**options: Any) -> Console:
    """A console that prints text as given: no markup, emoji codes or highlighting read into it."""
    return Console(highlight=False, markup=False, emoji=False, **options)


out = console(soft_wrap=True)
err = console(stderr=True, soft_wrap=True)


def shown(value: object, *, lines: bool = False) -> str:
    """User data (an id, kind, key, error) as printable text: each control or invisible character
    written as its escape (\\x1b), so none can move the cursor, retitle the terminal or hide text;
    with `lines`, its line breaks kept."""
    text = str(value)
    if lines:
        return "\n".join(shown(line) for line in text.split("\n"))
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# exit codes (docs/cli.md)
EXIT_PROBLEM, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_DATABASE = 1, 2, 3, 4, 5


@dataclass
class Globals:
    overrides: dict[str, Any] = field(default_factory=dict)
    env_file: str | None = None
    log_format: str = "console"
    log_level: str = "warning"

    def settings(self, *, deployment: bool = False, **more: Any) -> EdgeSettings:
        """The settings in effect; those of a deployment's many databases only where the command
        goes through each (`deployment`), else refused unless one is named (--database)."""
        from harel_edge.settings import EdgeSettings  # noqa: PLC0415 - pydantic: not for --help

        given = {k: v for k, v in more.items() if v is not None}  # a command's option over the global one
        values = {k: v for k, v in {**self.overrides, **given}.items() if v is not None}
        if self.env_file is not None:
            if not Path(self.env_file).is_file():
                raise ConfigurationError(f"--env-file {self.env_file!r} does not exist")
            values["_env_file"] = self.env_file
        settings = EdgeSettings.load(**values)
        return settings if deployment else settings.one_database()

    def sources(self) -> dict[str, str]:
        """Where each setting of `settings()` came from (`config show`)."""
        from harel_edge.settings import EdgeSettings  # noqa: PLC0415
        from harel_edge.settings_variables import setting_sources  # noqa: PLC0415

        given = [k for k, v in self.overrides.items() if v is not None]
        env_file = self.env_file if self.env_file is not None else EdgeSettings.model_config.get("env_file")
        return setting_sources(EdgeSettings.model_fields, given, env_file)


PROFILES = ("local", "sqld", "replica")
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


def choices(values: tuple[str, ...]) -> str:
    """The metavar that shows an option's choices in `--help`: <a|b|c>."""
    return f"<{'|'.join(values)}>"


def _print_version(value: bool) -> None:
    if value:
        from harel_edge import __version__  # noqa: PLC0415

        print(f"harel-edge {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    profile: str | None = typer.Option(
        None,
        "--profile",
        metavar=choices(PROFILES),
        help="Where the data is (overrides HAREL_EDGE_PROFILE).",
    ),
    db_path: str | None = typer.Option(
        None, "--db-path", metavar="PATH", help="The database file, or the replica's file (overrides HAREL_EDGE_DB_PATH)."
    ),
    url: str | None = typer.Option(None, "--url", metavar="URL", help="The sqld/Turso server (overrides HAREL_EDGE_URL)."),
    sync_url: str | None = typer.Option(
        None, "--sync-url", metavar="URL", help="The primary a replica syncs with (overrides HAREL_EDGE_SYNC_URL)."
    ),
    prefix: str | None = typer.Option(None, "--prefix", metavar="PREFIX", help="Table prefix (overrides HAREL_EDGE_PREFIX)."),
    database: str | None = typer.Option(
        None, "--database", metavar="NAME", help="Which of the deployment's databases (overrides HAREL_EDGE_DATABASE)."
    ),
    env_file: str | None = typer.Option(
        None, "--env-file", metavar="FILE", help="Read settings from this file instead of ./.env."
    ),
    log_format: str = typer.Option(
        "auto",
        "--log-format",
        metavar=choices(LOG_FORMATS),
        help="Log lines on stderr (auto: json unless a terminal).",
    ),
    log_level: str = typer.Option(
        "warning",
        "--log-level",
        metavar=choices(LOG_LEVELS),
        help="What is logged on stderr; `worker` logs at info unless this is given.",
    ),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Settings come from HAREL_EDGE_* variables (and .env); these options override them.
    The auth token is only read from HAREL_EDGE_AUTH_TOKEN (or the env file), never from an
    option, so it stays out of shell history and process listings."""
    from harel_edge.logs import configure_logging  # noqa: PLC0415 - structlog, not the metrics

    if log_level.lower() not in LOG_LEVELS:
        fail(EXIT_CONFIG, f"--log-level {log_level!r}: use {', '.join(LOG_LEVELS)}")
    log_level = log_level.lower()
    source = ctx.get_parameter_source("log_level")
    if ctx.invoked_subcommand == "worker" and getattr(source, "name", "DEFAULT") == "DEFAULT":
        log_level = "info"  # a long-running service says that it started, and stopped
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format not in ("json", "console"):
        fail(EXIT_CONFIG, f"--log-format {log_format!r}: use json, console or auto")
    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    ctx.obj = Globals(
        {"profile": profile, "db_path": db_path, "url": url, "sync_url": sync_url, "prefix": prefix, "database": database},
        env_file,
        log_format,
        log_level,
    )


def plural(count: int, one: str, many: str | None = None) -> str:
    """'1 message', '2 messages'."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


# ---- errors --------------------------------------------------------------------------------------


def fail(code: int, message: str) -> None:
    err.print(f"harel-edge: error: {shown(message, lines=True)}")
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
        except AuthError as exc:
            fail(code_for(exc), scrub_text(tidy(_token_not_set(exc, ctx)), ctx))
        except HarelEdgeError as exc:
            fail(code_for(exc), scrub_text(tidy(str(exc)), ctx))
        except ValueError as exc:  # the driver's errors are ValueErrors: explain them
            from harel_edge.connection import explain_connect_error  # noqa: PLC0415 - imports libsql

            settings = maybe_settings(ctx)
            explained = explain_connect_error(settings, exc) if settings is not None else exc
            text = tidy(str(explained))
            if isinstance(explained, HarelEdgeError):
                fail(code_for(explained), scrub_text(text, ctx))
            fail(EXIT_PROBLEM, scrub_text(text, ctx))

    return wrapper


def _token_not_set(exc: AuthError, ctx: typer.Context | None) -> str:
    """A refusal when no token was given says so, not what the server made of the missing one."""
    settings = maybe_settings(ctx)
    if settings is None or not settings.has_primary or settings.auth_token is not None:
        return str(exc)
    where = settings.server or "the primary"
    return (
        f"no auth token is set, and the primary at {where} requires one: set HAREL_EDGE_AUTH_TOKEN "
        "(or HAREL_LIBSQL_AUTH_TOKEN, or AUTH_TOKEN in the env file) to a read-write token for it"
    )


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
