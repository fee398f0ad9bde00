"""docs/cli.md is the command's own --help, so the reference cannot drift from the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import env_for, run

from harel_edge.cli import command_paths, help_text, reference_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_the_generated_reference():
    assert DOCS.read_text() == reference_markdown(), (
        "docs/cli.md is out of date: regenerate it with `harel-edge reference > docs/cli.md`"
    )


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "harel-edge")
def test_the_reference_shows_what_help_prints(path, tmp_path):
    printed = run([*path, "--help"], env_for({}, COLUMNS="60"), tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == help_text(path)


def test_every_command_is_in_the_reference():
    from typer.main import get_command

    from harel_edge.cli import app

    group = get_command(app)
    listed = {p[0] for p in command_paths() if p}
    visible = {name for name, command in group.commands.items() if not command.hidden}
    assert listed == visible


@pytest.mark.parametrize("field", ["max_in_flight", "max_workflow_passes"])
def test_the_worker_help_names_the_defaults_the_settings_have(field):
    from harel_edge.settings import EdgeSettings

    variable = f"HAREL_EDGE_{field.upper()}"
    default = EdgeSettings.model_fields[field].default
    assert f"{variable}, default {default})" in " ".join(help_text(("worker",)).split())
