"""docs/cli.md, generated from the commands' own `--help`, so the reference cannot drift."""


from __future__ import annotations

import sys

import typer

from harel_edge.cli.app import (
    app,
)

# ---- the reference ----------------------------------------------------------------------------------


def command_paths() -> list[list[str]]:
    """Every command, as the words after `harel-edge`, the top level first."""
    return [
        [],
        ["demo"],
        ["worker"],
        ["publish"],
        ["status"],
        ["dashboard"],
        ["migrate"],
        ["config"],
        ["config", "show"],
        ["dead-letter"],
        ["dead-letter", "list"],
        ["dead-letter", "show"],
        ["dead-letter", "requeue"],
        ["dead-letter", "purge"],
        ["executions"],
        ["executions", "list"],
        ["executions", "show"],
        ["executions", "suspend"],
        ["executions", "resume"],
        ["executions", "cancel"],
        ["executions", "terminate"],
        ["executions", "retry"],
        ["workflows"],
        ["workflows", "list"],
        ["workflows", "show"],
        ["workflows", "cancel"],
        ["workflows", "resume"],
        ["workflows", "fork"],
        ["limits"],
        ["limits", "set"],
        ["limits", "list"],
        ["limits", "clear"],
        ["databases"],
        ["databases", "create"],
        ["doctor"],
    ]


def help_text(path: list[str]) -> str:
    """Exactly what `harel-edge PATH --help` prints."""
    command = typer.main.get_command(app)
    ctx = command.make_context("harel-edge", [*path, "--help"], resilient_parsing=True)
    for word in path:
        sub = ctx.command.get_command(ctx, word)  # type: ignore[attr-defined]
        ctx = sub.make_context(word, [], parent=ctx, resilient_parsing=True)
    return ctx.get_help() + "\n"


def reference_markdown() -> str:
    """docs/cli.md: generated from the commands' help, so it cannot drift (a test checks)."""
    parts = [
        "# `harel-edge` command reference",
        "",
        "Generated from `--help` by `harel-edge reference > docs/cli.md`; `tests/cli/test_reference.py`",
        "fails when this file and the command disagree. A tour of the commands is in",
        "[quickstart.md](quickstart.md); running workers under compose, in [deploy.md](deploy.md).",
        "",
        "Exit codes: 0 success; 1 the command ran and found a problem (doctor, demo, a worker that",
        "failed); 2 bad configuration or arguments; 3 primary unreachable; 4 credentials refused;",
        "5 the database cannot be used as it is (not a database, another application's, damaged, newer",
        "schema, no schema). Errors are one line on stderr.",
        "",
    ]
    for path in command_paths():
        title = " ".join(["harel-edge", *path])
        parts += [f"## `{title}`", "", "```text", help_text(path).rstrip("\n"), "```", ""]
    return "\n".join(parts)


def reference() -> None:
    """Print docs/cli.md."""
    sys.stdout.write(reference_markdown())
