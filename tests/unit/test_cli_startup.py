"""`harel-edge` starts without the heavy libraries: each command imports what it uses, so the test
suite's hundreds of CLI runs and every `harel-edge publish` do not pay for harel, libsql or the metrics
at start. What the CLI keeps of the library's own (choices, harel's prefix rule) must agree with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

KEPT_OUT = ("harel", "libsql", "aiohttp", "tenacity", "prometheus_client")


def test_the_cli_imports_neither_harel_nor_libsql_before_a_command_needs_them():
    # The settings every command reads come in too: harel only checks a prefix its rule refuses.
    code = (
        "import sys, harel_edge.cli\n"
        "from harel_edge.settings import ExplicitSettings\n"
        "ExplicitSettings.load(prefix='edge_1')\n"
        f"print(','.join(m for m in {KEPT_OUT!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_the_choices_the_help_lists_are_the_librarys_own():
    from harel_edge import dead_letter, executions, workflows
    from harel_edge.cli import dead_letters as cli_dead_letters
    from harel_edge.cli import executions as cli_executions

    assert cli_dead_letters.KINDS == dead_letter.KINDS
    assert cli_executions.STATUSES == executions.STATUSES
    assert cli_executions.WORKFLOW_STATE_NAMES == workflows.STATES


@pytest.mark.parametrize("prefix", ["harel", "_", "a" * 30, "a" * 31, "1x", "a-b", "", "é", "x y", "Edge_2"])
def test_a_prefix_passes_without_harel_only_when_harel_accepts_it(prefix):
    from harel.engine.schema import Names

    from harel_edge.schema_harel import PREFIX_RULE

    try:
        Names(prefix)
    except ValueError:
        accepted = False
    else:
        accepted = True
    assert bool(PREFIX_RULE.fullmatch(prefix)) == accepted
